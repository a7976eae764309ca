"""The system level with partial pooling (llmrubric/model/core/system_level.py) and its use by model=auto."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.config import model_file
from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
from llmrubric.io.errors import InputError, NotApplicableError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, load_tables
from llmrubric.model import auto as auto_module
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.core.system_level import LevelPrior, SystemLevel, tilt

VALUES = np.arange(1.0, 5.0)


def _split(value: np.ndarray) -> np.ndarray:
    """(n, 4) distributions on 1..4 with mean ``value``: mass on the two options around it."""
    value = np.clip(value, 1.0, 4.0)
    low = np.minimum(np.floor(value), 3.0).astype(int)
    p = np.zeros((len(value), 4))
    p[np.arange(len(value)), low - 1] = low + 1 - value
    p[np.arange(len(value)), low] = value - low
    return p


def leveled_data(rng, systems=40, texts=30, slope=0.85, tau=0.15, within=0.3, same=False):
    """Systems whose human mean is ``0.4 + slope · x_s + N(0, tau²)`` (``x_s``: the LLM's system mean);
    within a system the human answer follows the LLM's with the flatter ``within`` slope. Human answers
    are drawn around their target by stochastic rounding (mean exactly the target)."""
    x_sys = np.full(systems, 2.5) if same else rng.uniform(1.8, 3.2, systems)
    level = 0.4 + slope * x_sys + (0.0 if same else rng.normal(0, tau, systems))
    ann, feats, info = [], [], []
    for s in range(systems):
        x = np.clip(x_sys[s] + rng.normal(0, 0.4, texts), 1.0, 4.0)
        target = np.clip(level[s] + within * (x - x_sys[s]), 1.0, 4.0)
        for t in range(texts):
            text = f"s{s}t{t}"
            info.append((text, f"S{s:02d}"))
            feats += [(text, "llm", "Q0", str(k + 1), float(v)) for k, v in enumerate(_split(x[t : t + 1])[0])]
            for j in range(2):
                answer = int(np.floor(target[t]) + (rng.random() < target[t] - np.floor(target[t])))
                ann.append((text, f"j{j}", "Q0", str(min(answer, 4))))
    annotations = pd.DataFrame(ann, columns=["text_id", "judge_id", "question_id", "answer"])
    features = pd.DataFrame(feats, columns=["text_id", "source", "question_id", "option", "prob"])
    texts = pd.DataFrame(info, columns=["text_id", "system_id"])
    return Tables(annotations, features, texts), x_sys, level


def expected_answers(tables, rubric, within=0.3):
    """A text model's in-sample expected answers: the flat within-system line through the LLM's answer."""
    from llmrubric.model.core.encoding import question_targets
    from llmrubric.model.core.system_level import source_means

    pairs, _ = question_targets(tables, rubric.main)
    x = pd.Series(source_means(tables, rubric, list(tables.text_ids)), index=tables.text_ids)
    return 2.5 + within * (x.reindex(pairs.text_id).to_numpy() - 2.5)


def test_tilting_hits_the_target_mean_keeps_the_support_and_sums_to_one():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), 200)
    p[:50, 0] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    targets = rng.uniform(1.2, 3.8, 200)
    out = tilt(p, VALUES, targets)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)
    assert (out >= 0).all() and (out[:50, 0] == 0).all()
    np.testing.assert_allclose(
        out @ VALUES, np.where(np.arange(200) < 50, np.maximum(targets, 2.0003), targets), atol=1e-6
    )
    np.testing.assert_allclose(tilt(p, VALUES, p @ VALUES), p, atol=1e-7)  # the own mean: unchanged


@pytest.mark.slow
def test_the_level_recovers_a_known_system_relation_and_its_spread(rubric):
    tables, x_sys, level = leveled_data(np.random.default_rng(1))
    fit = SystemLevel(rubric).fit(tables, expected_answers(tables, rubric))
    record = fit.record()
    assert record["form"] == "line" and fit.systems_ == 40 and record["summary"] == "llm"
    assert record["slope"]["mean"] == pytest.approx(0.85, abs=0.15) and record["slope"]["sd"] < 0.15
    assert record["intercept"] == pytest.approx(0.4 + 0.85 * record["x_centre"], abs=0.05)
    assert 0.15 / 1.6 < record["tau"]["mean"] < 0.15 * 1.6 and record["tau"]["q10"] < record["tau"]["q90"]
    known = fit.known_.loc[[f"S{s:02d}" for s in range(40)], "mean"].to_numpy()
    assert np.sqrt(np.mean((known - level) ** 2)) < 0.1  # a training system: close to its own mean


def test_a_new_system_gets_the_prior_and_its_labels_narrow_the_posterior(rubric):
    tables, _, _ = leveled_data(np.random.default_rng(2), systems=12)
    fit = SystemLevel(rubric).fit(tables, expected_answers(tables, rubric))
    new, x_new, level_new = leveled_data(np.random.default_rng(3), systems=1)
    new = Tables(new.annotations, new.features, new.texts.assign(system_id="NEW"))
    pairs = new.annotations.drop_duplicates(["text_id", "judge_id"])[["text_id", "judge_id"]]
    levels = fit.levels(new, pairs, expected_answers(new, rubric))
    prior_mean, prior_var = fit.prior(levels.x.to_numpy())
    assert not levels.known.iloc[0] and levels.x.iloc[0] == pytest.approx(x_new[0], abs=0.1)
    assert levels["mean"].iloc[0] == pytest.approx(prior_mean[0]) and levels["var"].iloc[0] == pytest.approx(
        prior_var[0]
    )
    assert 4 < levels["df"].iloc[0] < 1000  # the mixture over tau: heavier tails than a normal
    widths = [fit.posterior(prior_mean, prior_var, level_new, fit.sigma_within_**2 / k)[1][0] for k in (1, 5, 20, 80)]
    assert widths[0] < prior_var[0] and all(a > b for a, b in zip(widths, widths[1:]))


def test_with_all_systems_the_same_the_level_adds_nothing(rubric):
    tables, _, _ = leveled_data(np.random.default_rng(4), systems=12, same=True)
    fit = SystemLevel(rubric).fit(tables, expected_answers(tables, rubric))
    assert fit.record()["tau"]["mean"] < 0.07
    spread = fit.known_["mean"].std()
    assert spread < 0.05  # every training system pooled to (nearly) one level


def test_applied_distributions_are_proper_and_restore_identically(rubric, tmp_path):
    tables, _, _ = leveled_data(np.random.default_rng(5), systems=8)
    fit = SystemLevel(rubric).fit(tables, expected_answers(tables, rubric))
    new, _, _ = leveled_data(np.random.default_rng(6), systems=2)
    new = Tables(new.annotations, new.features, new.texts.assign(system_id="new" + new.texts.system_id))
    pairs = new.annotations.drop_duplicates(["text_id", "judge_id"])[["text_id", "judge_id"]]
    base = np.random.default_rng(7).dirichlet(np.ones(4), len(pairs))
    out = fit.apply(new, pairs, base)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-9)
    assert (out >= 0).all()
    levels = fit.levels(new, pairs, base @ VALUES)
    system = pairs.text_id.map(new.texts.set_index("text_id").system_id).to_numpy()
    means = pd.Series(out @ VALUES).groupby(system).mean()  # a new system's mean is its level
    np.testing.assert_allclose(means.to_numpy(), levels["mean"].reindex(means.index).to_numpy(), atol=1e-6)
    again = SystemLevel.from_state(rubric, *fit.state())
    np.testing.assert_array_equal(again.apply(new, pairs, base), out)


@pytest.fixture(scope="module")
def six(rubric):
    """120 texts of 6 systems answered by 3 LLM sources, 4 judges."""
    return simulate(0, 120, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]


def _auto(level: str, candidates=("ridge_judge",), **settings):
    auto = {"candidates": list(candidates), "system_level": level, **MAIN_INTERVALS, **settings}
    return {**model_file("auto"), "ensemble": 1, "auto": auto}


@pytest.mark.slow
def test_auto_compares_with_and_without_the_level_and_saves_it(six, rubric, tmp_path):
    systems = six.texts.set_index("text_id").system_id
    held = sorted(systems.unique())[0]
    train, test = six.subset(systems.index[systems != held]), six.subset(systems.index[systems == held])
    model = AutoCalibrator(rubric, _auto("auto"), FAST, group="system").fit(train)
    assert set(model.table_) == {
        "ridge_judge",
        "ridge_judge-level",
        "ridge_judge-beyond",
    }  # an inner fold holds out a system beyond the rest
    assert np.isfinite(model.table_["ridge_judge-level"]["nll"]) and model.level_record_["compared"]
    forced = AutoCalibrator(rubric, _auto("on"), FAST, group="system").fit(train)
    assert forced.weights_ == {"ridge_judge-level": 1.0} and "ridge_judge" in forced.levels_
    probs = forced.predict_proba(test)
    np.testing.assert_allclose(probs[:, 0, :4].sum(axis=1), 1.0, atol=1e-9)
    forced.save(tmp_path / "auto.safetensors")
    loaded = load_model(tmp_path / "auto.safetensors")
    np.testing.assert_allclose(loaded.predict_proba(test), probs, atol=1e-9)
    assert loaded.level_record_["levels"]["ridge_judge"]["systems"] == 5
    off = AutoCalibrator(rubric, _auto("off"), FAST, group="system").fit(train)
    assert set(off.table_) == {"ridge_judge"} and off.level_record_["reason"] == "model.auto.system_level=off"


@pytest.mark.slow
def test_why_a_level_variant_is_left_out_is_in_the_decision_record(six, rubric, monkeypatch):
    systems = six.texts.set_index("text_id").system_id
    train = six.subset(systems.index[systems != sorted(systems.unique())[0]])
    real = auto_module.fold_levels

    def never_beyond(*args):
        levelled, beyond, seconds, error = real(*args)
        return levelled, np.zeros_like(beyond), seconds, error

    monkeypatch.setattr(auto_module, "fold_levels", never_beyond)
    model = AutoCalibrator(rubric, _auto("auto"), FAST, group="system").fit(train)
    assert "beyond its training systems' range" in model.table_["ridge_judge-beyond"]["not_applicable"]
    assert "beyond its training systems' range" in model.decision_["not_applicable"]["ridge_judge-beyond"]
    assert np.isfinite(model.table_["ridge_judge-level"]["nll"])

    def too_few(*args):
        raise NotApplicableError("a system level needs at least 3 training systems with labels and a summary, found 2")

    monkeypatch.setattr(SystemLevel, "fit", lambda self, *a: too_few())
    model = AutoCalibrator(rubric, _auto("auto"), FAST, group="system").fit(train)
    for name in ("ridge_judge-level", "ridge_judge-beyond"):
        assert "needs at least 3 training systems" in model.table_[name]["not_applicable"]
    assert list(model.weights_) == ["ridge_judge"]


@pytest.mark.slow
def test_too_few_systems_for_a_level_is_recorded_or_an_error(six, rubric):
    one = six.subset(six.texts.text_id[six.texts.system_id == six.texts.system_id.iloc[0]])
    with pytest.raises(InputError, match="system level needs 3") as error:
        AutoCalibrator(rubric, _auto("on"), FAST).fit(one)
    assert error.value.setting == "model.auto.system_level"
    model = AutoCalibrator(rubric, _auto("auto"), FAST).fit(one)
    assert set(model.table_) == {"ridge_judge"} and not model.level_record_["compared"]
    assert "1 training system(s)" in model.level_record_["reason"]
    with pytest.raises(InputError) as error:
        AutoCalibrator(rubric, _auto("sometimes"), FAST).fit(six)
    assert error.value.setting == "model.auto.system_level"


def test_the_level_waits_for_level_min_systems_training_systems(six, rubric):
    from llmrubric.model.core.system_level import level_plan

    systems = six.texts.set_index("text_id").system_id
    four = six.subset(systems.index[systems.isin(sorted(systems.unique())[:4])])
    assert level_plan(rubric, four, "auto", min_systems=4)["compared"]
    plan = level_plan(rubric, four, "auto", min_systems=5)
    assert not plan["compared"] and "needs 5 (model.auto.level_min_systems)" in plan["reason"]
    assert level_plan(rubric, four, "on", min_systems=5)["compared"]  # on: the level wherever it can be fitted
    with pytest.raises(InputError) as error:
        AutoCalibrator(rubric, _auto("auto", level_min_systems=2), FAST).fit(four)
    assert error.value.setting == "model.auto.level_min_systems"


@pytest.mark.slow
def test_a_system_without_labels_is_recorded_and_a_text_without_system_refused(six, rubric):
    systems = six.texts.set_index("text_id").system_id
    quiet = sorted(systems.unique())[-1]
    labelled = six.annotations[~six.annotations.text_id.map(systems).eq(quiet)]
    tables = Tables(labelled, six.features, six.texts)
    model = AutoCalibrator(rubric, _auto("on"), FAST, group="system").fit(tables)
    assert model.level_record_["systems_without_labels"] == [quiet]
    test = six.subset(systems.index[systems == quiet])
    nameless = Tables(test.annotations.drop(columns="system_id"), test.features, None)
    with pytest.raises(InputError, match="no system_id") as error:
        model.predict_proba(nameless)
    assert error.value.column == "system_id"


@pytest.mark.slow
def test_score_texts_writes_levels_and_the_leaderboard_ranks_by_them(six, rubric, tmp_path):
    from llmrubric.cli import main as cli

    systems = six.texts.set_index("text_id").system_id
    new = sorted(systems.unique())[0]
    train = six.subset(systems.index[systems != new])
    model = AutoCalibrator(rubric, _auto("on"), FAST, group="system").fit(train)
    model.save(tmp_path / "auto.safetensors")
    six.features.to_csv(tmp_path / "features.csv", index=False)
    six.texts.to_csv(tmp_path / "texts.csv", index=False)
    args = ["score", "texts", str(tmp_path / "auto.safetensors"), str(tmp_path / "features.csv")]
    args += ["--texts", str(tmp_path / "texts.csv"), "--out", str(tmp_path / "scores.csv"), "--chunk-texts", "7"]
    assert cli([*args, "--predictions", str(tmp_path / "pred.csv"), "--questions", "Q0", "--no-progress"]) == 0
    levels = pd.read_csv(tmp_path / "scores.levels.csv").set_index("system_id")
    assert not levels.known[new] and levels.known.drop(new).all() and (levels.level_sd > 0).all()
    inside = levels.x.drop(new).min() <= levels.x[new] <= levels.x.drop(new).max()
    assert levels.beyond[new] == (not inside) and not levels.beyond.drop(new).any()
    summary = __import__("json").loads((tmp_path / "scores.summary.json").read_text())
    assert summary["beyond_training_range"] == ([] if inside else [new]), (inside, levels.x.to_dict())
    whole = model.system_levels(six, model.predict(six)[["text_id", "judge_id"]].assign(round="1"))
    np.testing.assert_allclose(levels.level.to_numpy(), whole.set_index("system_id").level.reindex(levels.index))
    board = ["leaderboard", "build", str(tmp_path / "pred.csv"), "--texts", str(tmp_path / "texts.csv")]
    board += ["--levels", str(tmp_path / "scores.levels.csv"), "--bootstrap", "20", "--no-plot"]
    assert cli([*board, "--out-dir", str(tmp_path / "board")]) == 0
    rows = pd.DataFrame(__import__("json").loads((tmp_path / "board" / "leaderboard.json").read_text())["leaderboard"])
    assert list(rows.level) == sorted(rows.level, reverse=True) and (rows.level_low < rows.level_high).all()
    labelled = six.annotations[six.annotations.text_id.isin(systems.index[systems == new][:10])]
    labelled.to_csv(tmp_path / "labels.csv", index=False)
    labels = ["--annotations", str(tmp_path / "labels.csv"), "--missing-systems", "drop"]
    assert cli([*board, *labels, "--out-dir", str(tmp_path / "labelled")]) == 0
    with_labels = pd.DataFrame(
        __import__("json").loads((tmp_path / "labelled" / "leaderboard.json").read_text())["leaderboard"]
    ).set_index("system")
    before = rows.set_index("system")
    width = lambda r: r.level_high - r.level_low  # noqa: E731
    assert with_labels.level_labels[new] == 10 and width(with_labels.loc[new]) < width(before.loc[new])


def test_level_posterior_weighs_the_prior_against_the_labels_ppi_pp_interval():
    from scipy import stats

    from llmrubric.scoring.levels import level_posterior

    labelled = {"estimate": 3.0, "low": 2.5, "high": 3.5}
    flat = level_posterior(0.0, 1e9, labelled, 10, small_sample="normal")
    assert flat["estimate"] == pytest.approx(3.0) and flat["high"] - flat["low"] == pytest.approx(1.0)
    tight = level_posterior(4.0, 1e-9, labelled, 10, small_sample="normal")
    assert tight["estimate"] == pytest.approx(4.0) and tight["high"] - tight["low"] < 1e-3
    z = stats.norm.ppf(0.975)
    var = (0.5 / z) ** 2  # the prior as precise as the labels: the mean halfway, the width / sqrt(2)
    even = level_posterior(4.0, var, labelled, 10, small_sample="normal")
    assert even["estimate"] == pytest.approx(3.5) and even["high"] - even["low"] == pytest.approx(1 / np.sqrt(2))
    student = level_posterior(4.0, var, labelled, 10, small_sample="student")
    ratio = (student["high"] - student["low"]) / (even["high"] - even["low"])
    assert student["estimate"] == pytest.approx(3.5) and ratio == pytest.approx(stats.t.ppf(0.975, 9) / z)
    point = {"estimate": 2.0, "low": 2.0, "high": 2.0}
    assert level_posterior(4.0, var, point, 10) == point


GENERATOR = Path(__file__).resolve().parents[2] / "shared" / "generators" / "multisystem.py"


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The shared generator's 8 systems and one human-written reference far above them (seed 0)."""
    if not GENERATOR.is_file():
        pytest.skip(f"the shared multi-system generator is not at {GENERATOR}")
    out = tmp_path_factory.mktemp("references") / "data"
    subprocess.run(
        [sys.executable, str(GENERATOR), str(out), "--references", "1", "--systems", "8", "--seed", "0"],
        check=True,
        capture_output=True,
    )
    rubric = Rubric.load(out / "rubric.yaml")
    return rubric, load_tables(out / "annotations.csv", out / "features.csv", rubric, out / "texts.csv")


def _held_out(tables, system):
    systems = tables.texts.set_index("text_id").system_id
    return tables.subset(systems.index[systems != system]), tables.subset(systems.index[systems == system])


def _level_of(rubric, train, test, model="ridge_judge"):
    """(fitted level, levels table of ``test``, the text model's main-question probabilities of ``test``)."""
    from llmrubric.config import group
    from llmrubric.model.auto_settings import candidate
    from llmrubric.model.core.encoding import question_targets
    from llmrubric.model.core.registry import fit_questions

    main, values = rubric.main, np.asarray(rubric.main.values, float)
    index, k = rubric.ids.index(main.id), len(values)
    text_model = fit_questions(
        candidate(model, rubric, model_file("auto"), group("trainer", "fast"), 0), train, [main.id]
    )
    pairs, _ = question_targets(train, main)
    level = SystemLevel(rubric).fit(train, text_model.predict_proba(train, pairs)[:, index, :k] @ values)
    held, _ = question_targets(test, main)
    probs = text_model.predict_proba(test, held)[:, index, :k]
    return level, level.levels(test, held, probs @ values), held, probs


@pytest.mark.slow
def test_a_reference_far_above_the_training_systems_is_placed_on_the_line_with_a_wide_interval(references):
    from llmrubric.model.core.system_level import t_interval

    rubric, tables = references
    train, test = _held_out(tables, "ref00")
    level, table, _, _ = _level_of(rubric, train, test)
    main = test.annotations[test.annotations.question_id == rubric.main.id]
    truth = main.answer.astype(float).mean()
    means = train.annotations[train.annotations.question_id == rubric.main.id]
    system_of = train.texts.set_index("text_id").system_id
    human = means.answer.astype(float).groupby(means.text_id.map(system_of).to_numpy()).mean()
    line = np.polyfit(level.train_x_, human.reindex(level.known_.index).to_numpy(), 1)
    raw_error = abs(np.polyval(line, table.x.iloc[0]) - truth)
    assert truth - table["mean"].iloc[0] > 0.5  # the LLMs see only part of the gap: no method gets close without labels
    assert abs(table["mean"].iloc[0] - truth) <= raw_error + 0.05
    low, high = t_interval(table["mean"], table["var"], table["df"], 0.8)
    assert low[0] <= truth <= high[0]
    inside = level.predictive(np.asarray([np.median(level.train_x_)]))[1][0]
    assert table["var"].iloc[0] > 4 * inside  # extrapolation widens the level


@pytest.mark.slow
def test_the_held_out_systems_labels_never_reach_its_prediction(references):
    rubric, tables = references
    train, test = _held_out(tables, "sys03")
    _, table, held, probs = _level_of(rubric, train, test)
    flipped = test.annotations.assign(answer=lambda a: (6 - a.answer.astype(int)).astype(str))
    other = Tables(flipped, test.features, test.texts)
    level, _, _, _ = _level_of(rubric, train, test)
    again = level.levels(other, held, probs @ np.asarray(rubric.main.values, float))
    pd.testing.assert_frame_equal(table, again)
    np.testing.assert_array_equal(level.apply(test, held, probs), level.apply(other, held, probs))


def test_a_main_question_without_llm_answers_is_summarised_by_the_text_model(rubric):
    tables, _, level = leveled_data(np.random.default_rng(8), systems=10)
    expected = expected_answers(tables, rubric)
    other = Tables(tables.annotations, tables.features.assign(question_id="Q1"), tables.texts)
    fit = SystemLevel(rubric).fit(other, expected)
    assert fit.record()["summary"] == "model" and fit.record()["slope"]["mean"] > 0.5
    with pytest.raises(InputError, match="no LLM answers") as error:
        SystemLevel(rubric, LevelPrior(summary="llm")).fit(other, expected)
    assert error.value.setting == "model.auto.level_summary"
    assert SystemLevel(rubric).fit(tables, expected).record()["summary"] == "llm"


@pytest.mark.slow
def test_three_training_systems_fit_levels_in_inner_folds_of_two_and_the_decision_is_recorded(six, rubric):
    systems = six.texts.set_index("text_id").system_id
    three = six.subset(systems.index[systems.isin(sorted(systems.unique())[:3])])
    model = AutoCalibrator(rubric, _auto("auto", level_min_systems=3, rule="select"), FAST, group="system").fit(three)
    assert "error" not in model.table_["ridge_judge-level"] and len(model.table_["ridge_judge-level"]["fold_nll"]) == 3
    decision = model.choice()["decision"]
    assert decision["best_with_level"] == "ridge_judge-level" and decision["best_without_level"] == "ridge_judge"
    assert decision["reason"].startswith("lowest inner-CV NLL: " + max(model.weights_, key=model.weights_.get))


@pytest.mark.slow
def test_levels_given_for_one_call_do_not_stick_to_the_model(six, rubric):
    from llmrubric.model.core.system_level import system_summaries

    systems = six.texts.set_index("text_id").system_id
    names = list(system_summaries(six, rubric, systems).sort_values().index)
    held = [names[2], names[0]]  # one inside the training systems' range of summaries, one below it
    train = six.subset(systems.index[~systems.isin(held)])
    model = AutoCalibrator(rubric, _auto("on"), FAST, group="system").fit(train)
    first, second = (six.subset(systems.index[systems == s]) for s in held)
    pairs = first.annotations[["text_id", "judge_id"]].drop_duplicates().assign(round="1")
    levels = model.member_levels(first, pairs)
    assert not levels["ridge_judge"].beyond.iloc[0]
    chunk = model.predict_proba(first, pairs.iloc[:8], levels)
    alone = model.predict_proba(first, pairs.iloc[:8])
    assert not np.allclose(chunk, alone)  # the chunk's level is its system's, not the chunk's own
    np.testing.assert_allclose(model.predict_proba(first, pairs, levels), model.predict_proba(first, pairs), atol=1e-12)
    later = model.predict_proba(second)  # a later call without levels: its own system's level, never NaN
    assert np.isfinite(later[:, 0, :4]).all()


def test_a_labelled_system_without_llm_answers_gets_the_pooled_prior_and_is_recorded(rubric):
    tables, _, level = leveled_data(np.random.default_rng(9), systems=10)
    quiet = tables.texts.text_id[tables.texts.system_id == "S03"]
    features = tables.features[~tables.features.text_id.isin(quiet)]
    fit = SystemLevel(rubric, LevelPrior(summary="llm")).fit(
        Tables(tables.annotations, features, tables.texts), expected_answers(tables, rubric)
    )
    assert fit.record()["systems_without_summary"] == ["S03"] and fit.systems_ == 9
    known = fit.known_.loc["S03"]
    labels = tables.annotations[tables.annotations.text_id.isin(quiet)].answer.astype(float).mean()
    assert abs(known["mean"] - labels) < 0.1 and np.isfinite(known["var"])  # its own labels, on a prior of every x


def test_system_level_on_without_a_summary_is_one_error_naming_the_setting(six, rubric):
    no_main = Tables(six.annotations, six.features[six.features.question_id != rubric.main.id], six.texts)
    settings = {**_auto("on"), "auto": {**_auto("on")["auto"], "level_summary": "llm"}}
    with pytest.raises(InputError, match="level_summary=llm") as error:
        AutoCalibrator(rubric, settings, FAST, group="system").fit(no_main)
    assert error.value.setting == "model.auto.system_level"


@pytest.mark.slow
def test_a_main_question_without_blocks_gets_a_level_by_the_model_summary_without_warnings(six, rubric, caplog):
    no_main = Tables(six.annotations, six.features[six.features.question_id != rubric.main.id], six.texts)
    with caplog.at_level("INFO"):
        model = AutoCalibrator(rubric, _auto("auto"), FAST, group="system").fit(no_main)
        forced = AutoCalibrator(rubric, _auto("on"), FAST, group="system").fit(no_main)
    assert "error" not in model.table_["ridge_judge-level"] and np.isfinite(model.table_["ridge_judge-level"]["nll"])
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert forced.level_record_["levels"]["ridge_judge"]["summary"] == "model"


@pytest.mark.slow
def test_the_beyond_variant_applies_the_level_only_beyond_the_training_range(references):
    from llmrubric.model.families.levelled import Levelled

    rubric, tables = references
    systems = tables.texts.set_index("text_id").system_id
    train = tables.subset(systems.index[~systems.isin(["ref00", "sys03"])])
    test = tables.subset(systems.index[systems.isin(["ref00", "sys03"])])
    level, table, held, probs = _level_of(rubric, train, test)
    text_model = type("Base", (), {"rubric": rubric})()  # applied() reads only the base's rubric
    assert table.beyond.to_dict() == {"ref00": True, "sys03": False}
    base = np.full((len(held), len(rubric.ids), probs.shape[1]), np.nan)
    base[:, 0] = probs
    levelled = {where: Levelled(text_model, where=where, base_name="m", level=level) for where in ("all", "beyond")}
    out = {"m": base, **{f"m-{w}": lv.applied(test, held, base) for w, lv in levelled.items()}}
    out["m-level"] = out.pop("m-all")
    ref = held.text_id.map(systems).eq("ref00").to_numpy()
    values = np.asarray(rubric.main.values, float)
    np.testing.assert_array_equal(out["m-beyond"][~ref, 0], probs[~ref])  # within the range: the member alone
    np.testing.assert_allclose(out["m-beyond"][ref, 0], out["m-level"][ref, 0])  # beyond it: with its level
    assert (out["m-beyond"][ref, 0] @ values).mean() == pytest.approx(table.loc["ref00", "mean"], abs=1e-6)
    assert (out["m-beyond"][ref, 0] @ values).mean() > (probs[ref] @ values).mean() + 0.3
