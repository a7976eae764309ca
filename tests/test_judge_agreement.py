"""Each rater's agreement in the metrics (``evaluate``'s ``judges``): κ, quadratic κ and Krippendorff's α of
the calibrated labels and of the raw LLM judge (``argmax_llm``) against the same rater, and their MLflow keys."""

from __future__ import annotations

import math

import krippendorff
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score

from llmrubric.evaluation.metrics import MIN_JUDGE_PAIRS, evaluate
from llmrubric.experiments.tracking import metric_keys
from llmrubric.model.core.registry import make


def predictions_of(annotations: pd.DataFrame, question, seed: int) -> pd.DataFrame:
    """A predictions table of the annotated pairs with random distributions (one per pair)."""
    rng = np.random.default_rng(seed)
    pairs = annotations[annotations.question_id == question.id][["text_id", "judge_id", "round"]].copy()
    probs = rng.dirichlet(np.ones(len(question.keys)), len(pairs))
    frame = pairs.assign(question_id=question.id)
    for j, key in enumerate(question.keys):
        frame[f"p_{key}"] = probs[:, j]
    return frame.assign(mean=probs @ np.asarray(question.values), var=0.0)


@pytest.mark.slow
def test_each_raters_kappa_and_alpha_are_its_own_pairs(simulated, rubric):
    question = rubric.main
    predicted = predictions_of(simulated.annotations, question, 0)
    got = evaluate(predicted, simulated.annotations, question)
    merged = predicted.merge(
        simulated.annotations[simulated.annotations.question_id == question.id], on=["text_id", "judge_id", "round"]
    )
    counts = merged.judge_id.value_counts()
    assert set(got["judges"]) == set(counts[counts >= MIN_JUDGE_PAIRS].index)
    judge = counts.index[0]
    mine = merged[merged.judge_id == judge]
    answers = pd.Index(question.keys).get_indexer(mine.answer)
    labels = mine[[f"p_{k}" for k in question.keys]].to_numpy().argmax(axis=1)
    figures = got["judges"][judge]
    assert figures["n"] == len(mine)
    assert figures["kappa"] == pytest.approx(cohen_kappa_score(answers, labels, labels=range(4)))
    assert figures["qwk"] == pytest.approx(cohen_kappa_score(answers, labels, labels=range(4), weights="quadratic"))
    alpha = krippendorff.alpha(
        np.vstack([answers, labels]).astype(float), level_of_measurement="ordinal", value_domain=range(4)
    )
    assert figures["alpha"] == pytest.approx(alpha)
    y = np.asarray(question.values)[answers]
    assert figures["rmse"] == pytest.approx(math.sqrt(np.mean((y - mine["mean"].to_numpy()) ** 2)))


def test_the_raw_llm_judges_agreement_with_each_rater(simulated, rubric):
    question = rubric.main
    raw = make("argmax_llm", rubric).fit(simulated).predict(simulated)
    got = evaluate(raw, simulated.annotations, question)["judges"]
    ann = simulated.annotations[simulated.annotations.question_id == question.id]
    feats = simulated.features[simulated.features.question_id == question.id]
    llm = feats.loc[feats.groupby("text_id").prob.idxmax()].set_index("text_id").option  # the judge's top answer
    judge = sorted(got)[0]
    mine = ann[ann.judge_id == judge]
    answers = pd.Index(question.keys).get_indexer(mine.answer)
    labels = pd.Index(question.keys).get_indexer(llm.loc[mine.text_id])
    assert got[judge]["kappa"] == pytest.approx(cohen_kappa_score(answers, labels, labels=range(4)))


def test_rater_ids_become_mlflow_metric_keys():
    figures = {"judges": {"ann@example.com": {"kappa": 0.4, "n": 12}}}
    assert metric_keys(figures, "test", "argmax_llm") == {
        "test/judges/ann_example.com/kappa/argmax_llm": 0.4,
        "test/judges/ann_example.com/n/argmax_llm": 12.0,
    }
