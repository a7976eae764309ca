"""Conformal intervals (llmrubric.model.core.conformal, llmrubric.scoring.intervals): an overconfident model is
corrected to nominal coverage on data with a known truth, the mean's distribution is the judges' convolution,
and model=auto's calibration reaches predictions, scores and its checkpoint."""

from __future__ import annotations

import io
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import norm
from support.settings import FAST

from llmrubric.config import model_file
from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.model import auto_refit
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.auto_checkpoint import conformals_from_state
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.core.conformal import Conformal, interval, mean_distribution, threshold
from llmrubric.report.coverage import coverage_section
from llmrubric.report.render import report_files
from llmrubric.scoring.intervals import (
    coverage_by_group,
    coverage_curve,
    coverage_figures,
    pair_coverage,
    with_intervals,
)
from llmrubric.scoring.scores import score_texts

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("intervals")

VALUES = np.arange(1.0, 6.0)


def ordinal(n: int, rng: np.random.Generator, spread: float = 1.0) -> np.ndarray:
    """(n, 5) true distributions: a discretised normal around a random centre."""
    centre = rng.uniform(0.5, 5.5, n)[:, None]
    edges = np.array([-np.inf, 1.5, 2.5, 3.5, 4.5, np.inf])
    cdf = norm.cdf((edges[None, :] - centre) / spread)
    return np.diff(cdf, axis=1)


def draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (p.cumsum(axis=1) < rng.uniform(size=(len(p), 1))).sum(axis=1)


def sharpened(p: np.ndarray, power: float) -> np.ndarray:
    q = p**power
    return q / q.sum(axis=1, keepdims=True)


def covered(lo, hi, y) -> float:
    return float(((lo <= VALUES[y]) & (VALUES[y] <= hi)).mean())


def test_an_overconfident_model_is_corrected_to_nominal_coverage():
    rng = np.random.default_rng(0)
    truth_cal, truth_test = ordinal(3000, rng), ordinal(20000, rng)
    y_cal, y_test = draw(truth_cal, rng), draw(truth_test, rng)
    model_cal, model_test = sharpened(truth_cal, 4), sharpened(truth_test, 4)  # far too sure of itself
    naive = covered(*interval(VALUES, model_test, 0.05), y_test)  # its own central 90 %
    assert naive < 0.82
    question = Rubric.from_dict({"questions": [{"id": "q", "prompt": "q", "options": [1, 2, 3, 4, 5]}]})["q"]
    cal = Conformal.fit(question, model_cal, y_cal, np.arange(len(y_cal)).astype(str))
    for nominal in (0.8, 0.9, 0.95):
        lo, hi = cal.pair_intervals(question, model_test, nominal)
        assert nominal - 0.015 <= covered(lo, hi, y_test) <= nominal + 0.04, nominal
    right = Conformal.fit(question, truth_cal, y_cal, np.arange(len(y_cal)).astype(str))
    lo, hi = right.pair_intervals(question, truth_test, 0.9)  # the true distributions, calibrated on their own
    assert 0.885 <= covered(lo, hi, y_test) <= 0.94
    corrected = cal.pair_intervals(question, model_test, 0.9)
    assert (hi - lo).mean() <= (corrected[1] - corrected[0]).mean() + 0.05


def test_an_overconfident_classifier_gets_prediction_sets_at_nominal_coverage():
    rng = np.random.default_rng(1)
    truth = rng.dirichlet(np.full(4, 0.7), 23000)
    y = draw(truth, rng)
    model = sharpened(truth, 4)
    question = Rubric.from_dict(
        {"questions": [{"id": "c", "prompt": "c", "options": ["a", "b", "c", "d"], "ordered": False}]}
    )["c"]
    cal = Conformal.fit(question, model[:3000], y[:3000], np.arange(3000).astype(str))
    assert not cal.ordered and len(cal.texts) == 0 and len(cal.pairs) == 3000
    naive = float((np.argmax(model[3000:], axis=1) == y[3000:]).mean())  # the top answer alone
    for nominal in (0.8, 0.9, 0.95):
        sets = cal.pair_sets(model[3000:], nominal)
        assert sets.any(axis=1).all()
        assert nominal - 0.015 <= sets[np.arange(20000), y[3000:]].mean() <= nominal + 0.03, nominal
    assert naive < 0.8 and cal.pair_sets(model[3000:], 0.95).sum(axis=1).mean() > 1.5


def test_by_judge_each_judge_is_covered_where_one_threshold_covers_only_on_average():
    rng = np.random.default_rng(2)
    question = Rubric.from_dict({"questions": [{"id": "q", "prompt": "q", "options": [1, 2, 3, 4, 5]}]})["q"]
    truth = {"steady": ordinal(12000, rng, 0.6), "noisy": ordinal(12000, rng, 1.6)}
    model = {j: ordinal_like(p) for j, p in truth.items()}  # the model gives both judges the steady spread
    y = {j: draw(p, rng) for j, p in truth.items()}
    cal = slice(0, 2000)
    judges = np.repeat(["steady", "noisy"], 2000)
    fitted = Conformal.fit(
        question,
        np.concatenate([model["steady"][cal], model["noisy"][cal]]),
        np.concatenate([y["steady"][cal], y["noisy"][cal]]),
        np.arange(4000).astype(str),
        judges,
    )
    assert sorted(fitted.judges) == ["noisy", "steady"] and len(fitted.judges["noisy"]) == 2000
    test = slice(2000, None)
    pooled = {j: covered(*fitted.pair_intervals(question, model[j][test], 0.9), y[j][test]) for j in truth}
    assert pooled["noisy"] < 0.85 < 0.93 < pooled["steady"]  # 0.9 on average only
    for j in truth:
        own = fitted.pair_intervals(question, model[j][test], 0.9, np.full(10000, j))
        assert 0.885 <= covered(*own, y[j][test]) <= 0.93, j
    unknown = fitted.pair_intervals(question, model["noisy"][test], 0.9, np.full(10000, "new"))
    np.testing.assert_array_equal(unknown, fitted.pair_intervals(question, model["noisy"][test], 0.9))
    meta, arrays = fitted.state()
    again = Conformal.from_state(meta, arrays)
    assert {j: s.tolist() for j, s in again.judges.items()} == {j: s.tolist() for j, s in fitted.judges.items()}


def ordinal_like(p: np.ndarray) -> np.ndarray:
    """The same centres as ``p`` (its expected answer) with the steady spread 0.6."""
    centre = (p @ VALUES)[:, None]
    edges = np.array([-np.inf, 1.5, 2.5, 3.5, 4.5, np.inf])
    return np.diff(norm.cdf((edges[None, :] - centre) / 0.6), axis=1)


def test_the_threshold_is_the_finite_sample_quantile_and_too_few_scores_cover_everything():
    scores = np.arange(1, 20) / 20  # 19 scores
    assert threshold(scores, 0.9) == pytest.approx(0.05)  # floor(0.1 * 20) = 2nd smallest
    assert threshold(scores[:5], 0.9) == 0.0  # floor(0.1 * 6) = 0: every value is in
    with pytest.raises(InputError, match="coverage"):
        threshold(scores, 1.0)


def test_the_mean_of_judges_is_their_convolution():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(5), size=3)
    support, mass = mean_distribution(VALUES, probs)
    brute: dict[float, float] = {}
    for combo in itertools.product(range(5), repeat=3):
        key = round(float(VALUES[list(combo)].mean()), 9)
        brute[key] = brute.get(key, 0.0) + float(np.prod([probs[j, k] for j, k in enumerate(combo)]))
    assert len(support) == len(brute) == 13
    np.testing.assert_allclose(mass, [brute[round(float(s), 9)] for s in support], atol=1e-12)


@pytest.fixture(scope="module")
def fitted(rubric):
    data = simulate(0, 120, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    train, test = data.subset(data.text_ids[:90]), data.subset(data.text_ids[90:])
    settings = {**model_file("auto"), "ensemble": 1, "auto": {"candidates": ["ridge_judge", "clmm_all"], "folds": 3}}
    return AutoCalibrator(rubric, settings, FAST, seed=0).fit(train), test


@pytest.mark.slow
def test_auto_calibrates_every_question_and_keeps_them_in_the_checkpoint(fitted, tmp_path):
    model, test = fitted
    cal = model.conformal_
    assert cal.question_id == model.rubric.main.id
    assert len(cal.pairs) == sum(model.label_oof_[1] >= 0) and len(cal.texts) == 90
    assert np.all(np.diff(cal.pairs) >= 0) and 0 <= cal.pairs[0] and cal.pairs[-1] <= 1
    answered = [q for q in model.rubric.ids if q in set(test.annotations.question_id)]
    assert list(model.conformals_) == [model.rubric.main.id] + [q for q in answered if q != model.rubric.main.id]
    assert len(answered) > 1
    loaded = load_model(model.save(tmp_path / "auto.safetensors"))
    assert list(loaded.conformals_) == list(model.conformals_)
    for question_id, conformal in model.conformals_.items():
        np.testing.assert_array_equal(loaded.conformals_[question_id].pairs, conformal.pairs)
        np.testing.assert_array_equal(loaded.conformals_[question_id].texts, conformal.texts)


def test_a_checkpoint_with_the_main_question_calibrated_only_still_loads(rubric):
    question, rng = rubric.main, np.random.default_rng(0)
    k = len(question.options)
    old = Conformal.fit(question, rng.dirichlet(np.ones(k), 40), rng.integers(0, k, 40), np.arange(40) % 10)
    meta, arrays = old.state()
    tensors = {f"conformal/{name}": torch.from_numpy(v) for name, v in arrays.items()}
    loaded = conformals_from_state({"conformal": meta}, tensors)
    assert list(loaded) == [question.id]
    np.testing.assert_array_equal(loaded[question.id].pairs, old.pairs)
    np.testing.assert_array_equal(loaded[question.id].texts, old.texts)


@pytest.mark.slow
def test_every_question_out_of_fold_is_covered_and_main_only_leaves_the_others_without(fitted, rubric):
    model, test = fitted
    wide = with_intervals(model.predict(test), model, 0.9)
    others = [q for q in model.conformals_ if q != rubric.main.id]
    for question_id in others:
        figures = coverage_figures(wide, test.annotations, rubric[question_id])
        assert figures["pairs"] == int((test.annotations.question_id == question_id).sum())
        assert figures["coverage"] > 0.75, question_id
    data = simulate(0, 60, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    settings = {**model_file("auto"), "ensemble": 1, "auto": {"candidates": ["ridge_judge"], "intervals": "main"}}
    main_only = AutoCalibrator(rubric, settings, FAST, seed=0).fit(data)
    assert list(main_only.conformals_) == [rubric.main.id]
    narrow = with_intervals(main_only.predict(test), main_only, 0.9)
    assert narrow.loc[narrow.question_id != rubric.main.id, "lo"].isna().all()
    with pytest.raises(InputError, match="is not one of") as error:
        AutoCalibrator(rubric, {**settings, "auto": {"intervals": "some"}}, FAST)
    assert error.value.setting == "model.auto.intervals"


@pytest.mark.slow
def test_the_other_questions_read_the_networks_fold_models_without_fitting_a_member_again(rubric, monkeypatch):
    data = simulate(0, 120, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    train, test = data.subset(data.text_ids[:90]), data.subset(data.text_ids[90:])
    settings = {
        **model_file("auto"),
        "ensemble": 1,
        "auto": {"candidates": ["network", "ridge_judge"], "rule": "stack"},
    }
    fitted = []
    original = auto_refit.fit_questions
    monkeypatch.setattr(auto_refit, "fit_questions", lambda m, t, q=None: fitted.append(q) or original(m, t, q))
    model = AutoCalibrator(rubric, settings, FAST, seed=0).fit(train)
    members = model._members()  # the network's refit trains with its folds: the others are fitted on train once
    assert "network" in members and len(fitted) == len(members) - 1  # no member fitted on an inner fold again
    wide = with_intervals(model.predict(test), model, 0.9)
    for question_id in [q for q in model.conformals_ if q != rubric.main.id]:
        assert coverage_figures(wide, test.annotations, rubric[question_id])["coverage"] > 0.75, question_id
    fitted.clear()  # refit: the members without fold models of the other questions fitted on each fold again
    refit = AutoCalibrator(rubric, {**settings, "auto": {**settings["auto"], "intervals": "refit"}}, FAST, seed=0)
    refit.fit(train)
    assert refit.weights_ == model.weights_ and len(fitted) == (len(members) - 1) * (1 + 5)
    assert list(refit.conformals_) == list(model.conformals_)


@pytest.mark.slow
def test_predictions_and_scores_carry_intervals_that_widen_with_the_coverage(fitted):
    model, test = fitted
    main = model.rubric.main
    predictions = model.predict(test)
    narrow, wide = with_intervals(predictions, model, 0.5), with_intervals(predictions, model, 0.95)
    rows = (narrow.question_id == main.id).to_numpy()
    assert narrow.lo.notna().all()  # every question of the simulated rubric is ordered and calibrated
    assert (wide.hi - wide.lo)[rows].mean() > (narrow.hi - narrow.lo)[rows].mean()
    assert (wide.lo[rows] <= narrow.lo[rows]).all() and (wide.hi[rows] >= narrow.hi[rows]).all()
    figures = coverage_figures(wide, test.annotations, main)
    assert figures["pairs"] == int((test.annotations.question_id == main.id).sum()) and figures["coverage"] > 0.7
    result = score_texts(model, test.features, test.texts, questions=[main.id], coverage=0.9)
    scores = result.scores
    assert {"lo", "hi"} <= set(scores.columns) and result.summary["intervals"] == [main.id]
    assert (scores.lo <= scores.hi).all() and scores.lo.min() >= min(main.values)
    assert scores.hi.max() <= max(main.values)
    by_judge = score_texts(model, test.features, test.texts, questions=[main.id], keep_predictions=True)
    judged = score_texts(
        model, test.features, test.texts, questions=[main.id], keep_predictions=True, coverage_by="judge"
    )
    assert judged.summary["coverage_by"] == "judge" and (judged.scores.lo == by_judge.scores.lo).all()
    assert (judged.predictions.lo != by_judge.predictions.lo).any()  # each judge's own threshold
    with pytest.raises(InputError, match="is not one of") as error:
        score_texts(model, test.features, test.texts, questions=[main.id], coverage_by="system")
    assert error.value.setting == "coverage_by"
    loose = score_texts(model, test.features, test.texts, questions=[main.id], coverage=0.99).scores
    assert ((loose.hi - loose.lo) >= (scores.hi - scores.lo) - 1e-12).all()
    with pytest.raises(InputError, match="coverage"):
        score_texts(model, test.features, test.texts, questions=[main.id], coverage=1.5)


@pytest.mark.slow
def test_the_report_shows_the_coverage_curve_of_the_checkpoints(fitted):
    model, test = fitted
    main = model.rubric.main
    curve = coverage_curve([(model, model.predict(test), test.annotations)], main)
    at90 = coverage_figures(with_intervals(model.predict(test), model, 0.9), test.annotations, main)
    assert [c["nominal"] for c in curve][4] == 0.9 and curve[4]["coverage"] == at90["coverage"]
    files = report_files("t", {}, [coverage_section(curve, main.id, 0.9)])
    assert files["figures/coverage.png"][:4] == b"\x89PNG"
    assert "data-file='figures/coverage.png'" in files["report.html"].decode()
    table = pd.read_csv(io.BytesIO(files["coverage.csv"]))
    np.testing.assert_allclose(table.coverage, [c["coverage"] for c in curve])
    assert json.loads(files["report.json"])["coverage"]["nominal"] == 0.9


@pytest.mark.slow
def test_a_categorical_main_question_gets_prediction_sets_kept_in_the_checkpoint(rubric, tmp_path):
    from dataclasses import replace

    questions = tuple(replace(q, ordered=False) if q.id == rubric.main.id else q for q in rubric.questions)
    categorical = replace(rubric, questions=questions)
    data = simulate(0, 120, 4, 2, categorical, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    train, test = data.subset(data.text_ids[:90]), data.subset(data.text_ids[90:])
    settings = {**model_file("auto"), "ensemble": 1, "auto": {"candidates": ["ridge_judge"], "folds": 3}}
    model = AutoCalibrator(categorical, settings, FAST, seed=0).fit(train)
    assert not model.conformal_.ordered
    loaded = load_model(model.save(tmp_path / "auto.safetensors"))
    np.testing.assert_array_equal(loaded.conformal_.pairs, model.conformal_.pairs)
    main = categorical.main
    narrow = with_intervals(loaded.predict(test), loaded, 0.5)
    wide = with_intervals(loaded.predict(test), loaded, 0.95)
    rows = (wide.question_id == main.id).to_numpy()
    assert wide.loc[rows, "set"].notna().all() and wide.loc[~rows, "set"].isna().all() and wide.lo[rows].isna().all()
    assert wide.lo[~rows].notna().all()  # the other questions, ordered, get intervals
    size = lambda frame: frame.loc[rows, "set"].str.split("|").str.len().mean()  # noqa: E731
    assert size(wide) > size(narrow) >= 1 and set("|".join(wide.loc[rows, "set"]).split("|")) <= set(main.keys)
    figures = coverage_figures(wide, test.annotations, main)
    assert figures["pairs"] == int((test.annotations.question_id == main.id).sum()) and figures["coverage"] > 0.8


def test_a_model_without_a_calibration_gets_no_interval(simulated, rubric):
    class Plain:
        rubric = None

    frame = pd.DataFrame({"text_id": ["t"], "judge_id": ["j"], "question_id": ["Q0"], "mean": [3.0], "var": [1.0]})
    out = with_intervals(frame, Plain(), 0.9)
    assert out.lo.isna().all() and out.hi.isna().all()


def test_coverage_by_group_counts_each_groups_pairs_and_flags_under_coverage_beyond_chance():
    question = Rubric.from_dict({"questions": [{"id": "q", "prompt": "q", "options": [1, 2, 3, 4, 5]}]})["q"]
    texts = [f"t{i}" for i in range(6)]
    probs = np.tile([0.1, 0.2, 0.4, 0.2, 0.1], (6, 1))  # mean 3, every interval [2, 4]
    predictions = pd.DataFrame({"text_id": texts, "judge_id": "j", "question_id": "q"}).assign(
        **{f"p_{k}": probs[:, i] for i, k in enumerate(question.keys)}, mean=3.0, lo=2.0, hi=4.0
    )
    other = predictions.iloc[:1].assign(question_id="other", lo=np.nan, hi=np.nan)  # no interval: left out
    answers = ["1", "3", "5", "2", "3", "4"]  # group A (t0..t2): 1 of 3 inside; B (t3..t5): 3 of 3
    annotations = pd.DataFrame({"text_id": texts, "judge_id": "j", "question_id": "q", "answer": answers})
    pairs = pair_coverage(pd.concat([predictions, other]), annotations, question)
    assert pairs.inside.tolist() == [False, True, False, True, True, True]
    np.testing.assert_allclose(pairs.p_answer, [0.1, 0.4, 0.1, 0.2, 0.4, 0.2])
    np.testing.assert_allclose(pairs.error, [2, 0, -2, 1, 0, -1])
    table = coverage_by_group(pairs, ["A", "A", "A", "B", "B", "B"], 0.9)
    assert table.index.tolist() == ["A", "B"] and table.pairs.tolist() == [3, 3]  # least covered first
    np.testing.assert_allclose(table.coverage, [1 / 3, 1.0])
    np.testing.assert_allclose(table.width, [2.0, 2.0])
    np.testing.assert_allclose(table.mean_error, [0.0, 0.0])
    # P(at most 1 of 3 inside | 0.9 each) = 0.1^3 + 3 * 0.9 * 0.1^2 = 0.028: beyond chance; all 3 inside is not
    np.testing.assert_allclose(table.p_under, [0.028, 1.0])
    assert coverage_figures(pd.concat([predictions, other]), annotations, question)["coverage"] == pytest.approx(4 / 6)
