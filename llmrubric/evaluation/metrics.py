"""Metrics on (text, judge) pairs of one question.

Ordered questions (numeric scales): RMSE, correlations, held-out NLL and the agreement of the predicted
label with the judge's answer (:data:`LABEL_METRICS`: Cohen's κ, quadratic weighted κ and Krippendorff's
ordinal α; the label is the predictions' ``label`` column, else the most probable option); categorical
questions (yes/no, labels): accuracy and macro-F1 of the most probable option, NLL and the
(multi-class) Brier score.
"""

from __future__ import annotations

import math

import krippendorff
import numpy as np
import pandas as pd
from scipy import stats
from sklearn.metrics import cohen_kappa_score, f1_score

from llmrubric.io.errors import InputError
from llmrubric.io.predictions import probabilities
from llmrubric.io.rubric import Question
from llmrubric.model.core.encoding import PAIR, with_round

METRICS = ("rmse", "pearson", "spearman", "kendall", "nll")
LABEL_METRICS = ("kappa", "qwk", "alpha")
CATEGORICAL_METRICS = ("accuracy", "macro_f1", "nll", "brier")
MIN_JUDGE_PAIRS = 5


def point_metrics(y: np.ndarray, yhat: np.ndarray) -> dict:
    """RMSE and Pearson/Spearman/Kendall (tau-b); correlations are NaN for constant inputs."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    constant = np.ptp(y) == 0 or np.ptp(yhat) == 0
    corr = lambda f: math.nan if constant else float(f(y, yhat)[0])
    return {
        "rmse": float(np.sqrt(np.mean((y - yhat) ** 2))),
        "pearson": corr(stats.pearsonr),
        "spearman": corr(stats.spearmanr),
        "kendall": corr(stats.kendalltau),
    }


def nll(probs: np.ndarray, answer_index: np.ndarray) -> float:
    """Mean -log p(observed answer); infinite if an observed answer got probability 0."""
    p = probs[np.arange(len(answer_index)), answer_index]
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.log(p)))


def seed_sd(values) -> float:
    """Sample standard deviation (ddof=1) of a metric over seeds; nan for fewer than two seeds."""
    values = np.asarray(values, dtype=float)
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def metric_names(question: Question) -> tuple[str, ...]:
    """The metrics of ``question``: :data:`METRICS` and :data:`LABEL_METRICS` if ordered, else :data:`CATEGORICAL_METRICS`."""
    return METRICS + LABEL_METRICS if question.ordered else CATEGORICAL_METRICS


def label_metrics(answers: np.ndarray, labels: np.ndarray, values) -> dict:
    """Cohen's κ, quadratic weighted κ (sklearn) and Krippendorff's ordinal α (``krippendorff``) of the
    judges' and the predicted option indices, options ranked by value; NaN where undefined (one category)."""
    rank = np.argsort(np.argsort(np.asarray(values, dtype=float), kind="stable"), kind="stable")
    y, yhat = rank[answers], rank[labels]
    if len(np.union1d(y, yhat)) < 2:
        return dict.fromkeys(LABEL_METRICS, math.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = krippendorff.alpha(
            reliability_data=np.vstack([y, yhat]).astype(float),
            value_domain=np.arange(len(rank)),
            level_of_measurement="ordinal",
        )
    return {
        "kappa": float(cohen_kappa_score(y, yhat, labels=np.arange(len(rank)))),
        "qwk": float(cohen_kappa_score(y, yhat, labels=np.arange(len(rank)), weights="quadratic")),
        "alpha": float(alpha),
    }


def predicted_labels(merged: pd.DataFrame, question: Question, probs: np.ndarray) -> np.ndarray:
    """Option index of each row's ``label`` (a label rule's), else of its most probable option."""
    if "label" not in merged.columns or merged["label"].isna().any():
        return probs.argmax(axis=1)
    index = np.array([-1 if (i := question.index_of(label)) is None else i for label in merged["label"]])
    if (index < 0).any():
        raise InputError(f"a label of {question.id} is not one of its options {list(question.keys)}", column="label")
    return index


def categorical_metrics(probs: np.ndarray, answer_index: np.ndarray) -> dict:
    """Accuracy and macro-F1 (over the options observed or predicted) of the most probable
    option, and the Brier score: mean over pairs of sum over options of (p - observed)²."""
    predicted = probs.argmax(axis=1)
    onehot = np.eye(probs.shape[1])[answer_index]
    return {
        "accuracy": float(np.mean(predicted == answer_index)),
        "macro_f1": float(f1_score(answer_index, predicted, average="macro", zero_division=0)),
        "brier": float(np.mean(((probs - onehot) ** 2).sum(axis=1))),
    }


def align(predictions: pd.DataFrame, annotations: pd.DataFrame, question: Question) -> pd.DataFrame:
    """Predictions of ``question`` joined to the observed answers by (text, judge, round)."""
    ann = with_round(annotations[annotations.question_id == question.id])
    pred = with_round(predictions[predictions.question_id == question.id])
    merged = pred.drop(columns=["system_id"], errors="ignore").merge(
        ann[PAIR + ["answer"]], on=PAIR, how="inner", validate="one_to_one"
    )
    if len(merged) != len(ann):
        raise InputError(f"{len(ann) - len(merged)} annotated pairs of {question.id} have no prediction")
    finite = np.isfinite(probabilities(merged, question)).all(axis=1)
    if question.ordered:
        finite &= np.isfinite(merged["mean"].to_numpy(dtype=float))
    if not finite.all():
        raise InputError(f"non-finite predictions for {question.id} ({int((~finite).sum())} pairs)")
    return merged


def evaluate(predictions: pd.DataFrame, annotations: pd.DataFrame, question: Question, per_judge: bool = True) -> dict:
    """Pooled metrics over all annotated pairs, plus (``per_judge``) the mean of per-judge metrics and
    ``judges``: each judge's own (``n`` pairs; RMSE, κ, quadratic κ and α of the predicted labels, or the
    accuracy of a categorical question), keyed by judge id, for the judges with :data:`MIN_JUDGE_PAIRS` pairs.
    An LLM baseline's (``argmax_llm``) figures are the raw LLM judge's agreement with each judge."""
    merged = align(predictions, annotations, question)
    index = pd.Index(question.keys).get_indexer(merged.answer)
    probs = probabilities(merged, question)
    if question.ordered:
        y = np.asarray(question.values, float)[index]
        yhat = merged["mean"].to_numpy()
        point = lambda rows: point_metrics(y[rows], yhat[rows])
    else:
        point = lambda rows: {"accuracy": float(np.mean(probs[rows].argmax(axis=1) == index[rows]))}
    out = point(slice(None)) if question.ordered else categorical_metrics(probs, index)
    labels = predicted_labels(merged, question, probs) if question.ordered else None
    if question.ordered:
        out.update(label_metrics(index, labels, question.values))
    out["nll"] = nll(probs, index)
    out["n"] = int(len(merged))
    if not per_judge:
        return out
    groups = {str(j): rows for j, rows in merged.groupby("judge_id").indices.items() if len(rows) >= MIN_JUDGE_PAIRS}
    per_judge = {j: point(rows) for j, rows in groups.items()}
    names = ("rmse", "pearson", "spearman", "kendall") if question.ordered else ("accuracy",)
    out["per_judge"] = {m: _nanmean([j[m] for j in per_judge.values()]) for m in names}
    out["per_judge"]["judges"] = len(per_judge)
    out["judges"] = {
        j: {
            "n": int(len(rows)),
            **_judge_figures(per_judge[j], index[rows], None if labels is None else labels[rows], question),
        }
        for j, rows in groups.items()
    }
    return out


def _judge_figures(point: dict, answers: np.ndarray, labels: np.ndarray | None, question: Question) -> dict:
    """One judge's figures for :func:`evaluate`'s ``judges``: RMSE and the label metrics (ordered), else accuracy."""
    if labels is None:
        return {"accuracy": point["accuracy"]}
    return {"rmse": point["rmse"], **label_metrics(answers, labels, question.values)}


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def markdown_table(rows: dict[str, dict], metrics=METRICS) -> str:
    """A markdown table of ``{method: {metric: value or (mean, sd)}}``."""
    lines = ["| method | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, values in rows.items():
        cells = []
        for m in metrics:
            v = values.get(m)
            if isinstance(v, (tuple, list)):
                cells.append(f"{v[0]:.3f} ± {v[1]:.3f}")
            elif v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("—")
            else:
                cells.append(f"{v:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
