"""Label rules (llmrubric.model.core.label_rule), the label metrics, and where the rule travels:
model=auto's inner CV, checkpoints, evaluate.py's ``label`` column and calibrated qrels."""

import itertools
import math

import krippendorff
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import cohen_kappa_score
from support.settings import FAST

from llmrubric.evaluation.metrics import evaluate, label_metrics
from llmrubric.io.errors import InputError
from llmrubric.io.predictions import predictions_frame
from llmrubric.model import auto as auto_module
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core.checkpoints import load_model, write_checkpoint
from llmrubric.model.core.encoding import pairs_of, question_targets
from llmrubric.model.core.label_rule import (
    LabelRule,
    choose_rule,
    fit_rule,
    in_sample_rule,
    kappa,
    rule_of,
    settings_of,
    with_labels,
)
from llmrubric.model.families.network.calibrator import NetworkCalibrator

VALUES = [0.0, 1.0, 2.0, 3.0]


def skewed(n: int, seed: int = 0):
    """A 0..3 scale where every distribution's mode is 0 but the expected grade rises with the true grade."""
    rng = np.random.default_rng(seed)
    truth = rng.choice(4, n, p=[0.55, 0.2, 0.15, 0.1])
    share = 0.15 + 0.08 * truth + rng.uniform(0, 0.04, n)  # the mass on the true grade, never the most
    probs = np.zeros((n, 4))
    probs[:, 0] = 1 - share
    probs[np.arange(n), truth] += share
    return probs, truth


def test_thresholds_recover_the_grades_that_argmax_labels_all_zero():
    probs, truth = skewed(400)
    assert (LabelRule("argmax").indices(probs, VALUES) == 0).all()
    for name in ("kappa_thresholds", "frequency_thresholds"):
        rule = fit_rule(name, probs, truth, VALUES)
        assert len(rule.cuts) == 3 and list(rule.cuts) == sorted(rule.cuts)
        np.testing.assert_array_equal(rule.indices(probs, VALUES), truth)


def test_rounded_mean_rounds_half_up_and_a_reversed_scale_is_ranked_by_value():
    probs = np.array([[0.5, 0.5, 0, 0], [0.6, 0.4, 0, 0], [0, 0, 0.2, 0.8]])
    np.testing.assert_array_equal(LabelRule("rounded_mean").indices(probs, VALUES), [1, 0, 3])
    reversed_values = VALUES[::-1]  # option 0 is the grade 3
    rule = fit_rule("kappa_thresholds", *[a[:, ::-1] if a.ndim == 2 else 3 - a for a in skewed(300)], reversed_values)
    probs, truth = skewed(300)
    np.testing.assert_array_equal(rule.indices(probs[:, ::-1], reversed_values), 3 - truth)


def test_kappa_thresholds_reach_the_best_cut_points_by_brute_force():
    rng = np.random.default_rng(3)
    truth = rng.choice(4, 30, p=[0.5, 0.25, 0.15, 0.1])
    probs = rng.dirichlet(np.ones(4), 30) * 0.5 + np.eye(4)[truth] * 0.5 * rng.uniform(0, 1, (30, 1))
    probs /= probs.sum(axis=1, keepdims=True)
    expected = probs @ VALUES
    grid = np.sort(expected)
    cuts = np.concatenate([[-np.inf], (grid[1:] + grid[:-1]) / 2, [np.inf]])
    best = max(
        kappa(truth, (expected >= cuts[list(c)][:, None]).sum(axis=0), 4)
        for c in itertools.combinations_with_replacement(range(len(cuts)), 3)
    )
    fitted = fit_rule("kappa_thresholds", probs, truth, VALUES, "kappa").indices(probs, VALUES)
    # coordinate search can stop at a local optimum; on these data it reaches the grid's best (35/59) exactly
    assert best == pytest.approx(35 / 59, abs=1e-12)
    assert kappa(truth, fitted, 4) == pytest.approx(best, abs=1e-9)


def test_kappa_and_qwk_match_sklearn_and_alpha_matches_krippendorff():
    rng = np.random.default_rng(1)
    y, yhat = rng.integers(0, 4, 80), rng.integers(0, 4, 80)
    yhat[:40] = y[:40]
    assert kappa(y, yhat, 4) == pytest.approx(cohen_kappa_score(y, yhat))
    assert kappa(y, yhat, 4, "qwk") == pytest.approx(cohen_kappa_score(y, yhat, weights="quadratic"))
    figures = label_metrics(y, yhat, VALUES)
    assert figures["kappa"] == pytest.approx(cohen_kappa_score(y, yhat))
    assert figures["qwk"] == pytest.approx(cohen_kappa_score(y, yhat, weights="quadratic"))
    alpha = krippendorff.alpha(reliability_data=[y, yhat], level_of_measurement="ordinal", value_domain=range(4))
    assert figures["alpha"] == pytest.approx(alpha) and 0.3 < figures["alpha"] < 1
    assert all(math.isnan(v) for v in label_metrics(np.zeros(5, int), np.zeros(5, int), VALUES).values())


def test_the_choice_is_cross_validated_and_round_trips_through_json():
    probs, truth = skewed(400)
    folds = np.arange(400) % 5
    rule = choose_rule(probs, truth, folds, VALUES)
    assert rule.name in ("kappa_thresholds", "frequency_thresholds")
    assert rule.record["scores"]["argmax"] == pytest.approx(0.0) and rule.record["scores"][rule.name] > 0.9
    assert rule.record["fitted_on"] == "out-of-fold" and rule.record["folds"] == 5
    only = choose_rule(probs, truth, folds, VALUES, rules=["rounded_mean"], objective="qwk")
    assert only.name == "rounded_mean" and only.record["objective"] == "qwk"
    assert LabelRule.from_dict(rule.to_dict()) == rule
    never = LabelRule("kappa_thresholds", (-math.inf, 1.0, math.inf))
    assert LabelRule.from_dict(never.to_dict()) == never
    old = LabelRule.from_dict(None)
    assert old.name == "argmax" and "without a label rule" in old.record["fitted_on"]


@pytest.mark.parametrize(
    "model, setting",
    [
        ({"label_rule": {"rules": ["median"]}}, "model.label_rule.rules"),
        ({"label_rule": {"rules": []}}, "model.label_rule.rules"),
        ({"label_rule": {"objective": "f1"}}, "model.label_rule.objective"),
    ],
)
def test_bad_rule_settings_name_the_setting(model, setting):
    with pytest.raises(InputError) as e:
        settings_of(model)
    assert e.value.setting == setting


def test_the_label_column_and_the_label_metrics(rubric):
    probs, truth = skewed(60)
    question = rubric.main  # values 1..4
    pairs = pd.DataFrame({"text_id": [f"t{i}" for i in range(60)], "judge_id": "j"})
    padded = np.zeros((60, 1, 4))
    padded[:, 0] = probs
    frame = predictions_frame(pairs, [question], padded)
    rule = fit_rule("kappa_thresholds", probs, truth, question.values)
    labelled = with_labels(frame, question, rule)
    assert labelled.label.tolist() == [question.keys[t] for t in truth]
    annotations = pairs.assign(question_id=question.id, answer=[question.keys[t] for t in truth])
    by_rule, by_argmax = evaluate(labelled, annotations, question), evaluate(frame, annotations, question)
    assert by_rule["kappa"] == pytest.approx(1.0) and by_rule["alpha"] == pytest.approx(1.0)
    assert by_argmax["kappa"] == pytest.approx(0.0) and by_argmax["nll"] == by_rule["nll"]
    read_back = labelled.assign(label=labelled.label.astype(float))  # a CSV read back: 4.0 for the option "4"
    assert evaluate(read_back, annotations, question)["kappa"] == pytest.approx(1.0)


class Memoriser:
    """Predicts the observed answer of every pair it was fitted on, and a skewed guess from the features elsewhere."""

    def __init__(self, rubric):
        self.rubric = rubric

    def get_params(self) -> dict:
        return {}

    def fit(self, tables, questions=None):
        pairs, answers = question_targets(tables, self.rubric.main)
        self.seen_ = dict(zip(zip(pairs.text_id, pairs.judge_id), answers))
        self.questions_ = [self.rubric.main.id]
        return self

    def predict_proba(self, tables, pairs=None):
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        k = len(self.rubric.main.options)
        out = np.full((len(pairs), len(self.rubric.questions), k), np.nan)
        guess = np.tile([0.7, 0.15, 0.1, 0.05], (len(pairs), 1))
        for row, key in enumerate(zip(pairs.text_id, pairs.judge_id)):
            if key in self.seen_:
                guess[row] = np.eye(k)[self.seen_[key]]
        out[:, self.rubric.ids.index(self.rubric.main.id)] = guess
        return out


@pytest.mark.slow
def test_auto_fits_its_rule_on_out_of_fold_predictions_only(simulated, rubric, monkeypatch):
    tables = simulated.subset(simulated.text_ids[:60])
    monkeypatch.setattr(auto_module, "candidate", lambda name, rubric, *a: Memoriser(rubric))
    seen = {}
    real = auto_module.main_rule
    monkeypatch.setattr(
        auto_module, "main_rule", lambda q, p, a, f, *rest: seen.update(p=p, a=a, f=f) or real(q, p, a, f, *rest)
    )
    model = AutoCalibrator(rubric, {"family": "auto", "auto": {"candidates": ["ridge_judge"], "folds": 3}}).fit(tables)
    hit = seen["p"][np.arange(len(seen["a"])), seen["a"]]
    assert (hit < 0.99).all()  # in-sample, the memoriser puts all its mass on the observed answer
    assert sorted(np.unique(seen["f"])) == [0, 1, 2]
    assert (
        model.label_rule_.record["fitted_on"] == "out-of-fold"
        and model.choice()["label_rule"] == model.label_rule_.to_dict()
    )
    assert in_sample_rule(model.members_["ridge_judge"], tables).record["scores"]["argmax"] == pytest.approx(1.0)


def test_a_model_without_a_rule_labels_by_argmax():
    assert rule_of(object()).name == "argmax"


@pytest.mark.slow
def test_checkpoints_keep_the_rule_and_old_ones_label_by_argmax(simulated, rubric, tmp_path):
    tables = simulated.subset(simulated.text_ids[:60])
    auto = AutoCalibrator(rubric, {"family": "auto", "auto": {"candidates": ["ridge_judge"], "folds": 3}}).fit(tables)
    network = NetworkCalibrator(rubric, {"ensemble": 1}, FAST, seed=0).fit(tables)
    network.label_rule_ = in_sample_rule(network, tables)
    assert network.label_rule_.record["fitted_on"] == "in-sample"
    for name, model in (("auto", auto), ("network", network)):
        meta, tensors = model.state()
        write_checkpoint(tmp_path / f"{name}.safetensors", meta, tensors)
        assert load_model(tmp_path / f"{name}.safetensors").label_rule_ == model.label_rule_
        meta.pop("label_rule")
        write_checkpoint(tmp_path / f"{name}_old.safetensors", meta, tensors)
        old = load_model(tmp_path / f"{name}_old.safetensors")
        assert rule_of(old).name == "argmax" and "without a label rule" in rule_of(old).record["fitted_on"]
