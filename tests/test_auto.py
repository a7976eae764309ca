"""model=auto (inner-CV choice among model families), the cumulative-link mixed model and the new baselines."""

import contextlib
import json

import numpy as np
import pandas as pd
import pytest
import yaml
from support.paths import ROOT
from support.scripts import run
from support.settings import FAST, FAST_OVERRIDES, MAIN_INTERVALS

from llmrubric.apps.evaluate import evaluate_predicted
from llmrubric.config import model_file
from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
from llmrubric.io.errors import InputError, NotApplicableError
from llmrubric.io.tables import Tables
from llmrubric.model import auto as auto_module
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.auto_settings import default_candidates
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.core.combine import rule_scores
from llmrubric.model.core.combine import weights as _weights
from llmrubric.model.core.encoding import question_targets
from llmrubric.model.core.inner_cv import InnerFolds
from llmrubric.model.core.memo import one_encoding
from llmrubric.model.core.registry import fit_questions, make
from llmrubric.model.families.baselines import MeanOfSources, RawLinearSystem, RidgeJudge, make_method
from llmrubric.model.families.mixed import MixedOrdinal

FAST_AUTO = {**model_file("auto"), "ensemble": 1}
# 3 inner folds: what these tests check (the choice, its record, tuning, the checkpoint) does not need the shipped 5
FAST_AUTO["auto"] = {**FAST_AUTO["auto"], **MAIN_INTERVALS, "folds": 3}


@pytest.fixture(scope="module")
def sources3(rubric):
    """120 texts of 6 systems answered by 3 LLM sources, 4 judges."""
    return simulate(0, 120, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]


def test_stacking_weights_maximise_the_mixture_likelihood():
    rng = np.random.default_rng(0)
    good, bad = rng.uniform(0.4, 0.9, 400), rng.uniform(0.05, 0.3, 400)
    assert _weights(np.stack([bad, good], axis=1), "select").tolist() == [0.0, 1.0]
    weights = _weights(np.stack([bad, good], axis=1), "stack")
    assert weights[1] > 0.95 and weights.sum() == pytest.approx(1.0)
    mixed = np.where(np.arange(400) % 2 == 0, good, bad), np.where(np.arange(400) % 2 == 0, bad, good)
    both = _weights(np.stack(mixed, axis=1), "stack")
    stacked = np.log(np.stack(mixed, axis=1) @ both).mean()
    assert all(stacked > np.log(m).mean() for m in mixed) and min(both) > 0.2


def test_rule_auto_stacks_only_where_the_inner_folds_agree():
    rng = np.random.default_rng(1)
    good, bad = rng.uniform(0.5, 0.9, 400), rng.uniform(0.05, 0.2, 400)
    folds = np.arange(400) % 5
    one_best = rule_scores(np.stack([bad, good], axis=1), folds)
    assert one_best["select"] == pytest.approx(-np.log(good).mean()) and one_best["chosen"] == "select"
    halves = np.arange(400) % 2 == 0  # each candidate right on half the pairs of every fold: a mixture wins
    mixed = np.stack([np.where(halves, good, bad), np.where(halves, bad, good)], axis=1)
    complementary = rule_scores(mixed, folds)
    assert complementary["stack"] < complementary["select"] - 0.3 and complementary["chosen"] == "stack"
    assert complementary["gain"] > complementary["gain_se"] > 0
    # folds that disagree: the gain of one fold alone is not evidence (one standard error), select stays
    noisy = rule_scores(mixed[folds < 2], folds[folds < 2] * 0 + np.arange((folds < 2).sum()) % 2)
    assert noisy["chosen"] == ("stack" if noisy["gain"] > noisy["gain_se"] else "select")


@pytest.mark.slow
def test_rule_auto_records_both_rules_and_applies_the_lower(sources3, rubric):
    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "rule": "auto", "candidates": ["clmm_all", "ridge_judge"]}}
    model = AutoCalibrator(rubric, settings, FAST, seed=1).fit(sources3)
    scores = model.decision_["rule_cv"]
    assert model.decision_["rule"] == scores["chosen"] == ("stack" if scores["gain"] > scores["gain_se"] else "select")
    if model.decision_["rule"] == "select":
        assert list(model.weights_.values()) == [1.0]


@pytest.mark.slow
def test_auto_fits_predicts_saves_and_loads_every_question(sources3, rubric, tmp_path):
    train, test = sources3.subset(sources3.text_ids[:90]), sources3.subset(sources3.text_ids[90:])
    model = AutoCalibrator(rubric, FAST_AUTO, FAST, seed=0).fit(train)
    assert sum(model.weights_.values()) == pytest.approx(1.0) and min(model.weights_.values()) >= 0
    assert {part.member for part in model.parts_.values()} == set(default_candidates())
    scored = {n: row for n, row in model.table_.items() if "not_applicable" not in row}
    assert scored and all(np.isfinite(row["nll"]) for row in scored.values())
    assert all(model.parts_[n].where == "beyond" for n in set(model.table_) - set(scored))  # no fold's range changed
    assert model.val_nll_ <= min(row["nll"] for row in model.table_.values() if "nll" in row) + 1e-9
    seconds = model.decision_["seconds"]  # each phase of the fit: the candidates' inner CV within its own
    assert list(seconds) == ["tuning", "inner_cv", "refit", "other_questions_intervals"]
    assert min(seconds.values()) >= 0 and seconds["tuning"] < 0.01  # no tuning trials
    alone = [row["seconds"] for n, row in scored.items() if model.parts_[n].where is None]
    assert 0 < sum(alone) <= seconds["inner_cv"]
    probs = model.predict_proba(test)
    assert probs.shape[1] == len(rubric.questions)
    for q, question in enumerate(rubric.questions):
        np.testing.assert_allclose(probs[:, q, : len(question.options)].sum(axis=1), 1.0, atol=1e-6)
    predictions = model.predict(test)
    assert set(predictions.question_id) == set(rubric.ids)
    model.save(tmp_path / "auto.safetensors")
    loaded = load_model(tmp_path / "auto.safetensors")
    assert isinstance(loaded, AutoCalibrator) and loaded.weights_ == model.weights_
    assert loaded.decision_["seconds"] == seconds
    np.testing.assert_allclose(loaded.predict_proba(test), probs, atol=1e-6)


@pytest.mark.slow
def test_select_keeps_the_candidate_with_the_lowest_inner_nll(sources3, rubric):
    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "rule": "select", "candidates": ["clmm_all", "ridge_judge"]}}
    model = AutoCalibrator(rubric, settings, FAST, seed=1).fit(sources3)
    best = min((n for n in model.table_ if "nll" in model.table_[n]), key=lambda n: model.table_[n]["nll"])
    assert model.weights_ == {best: 1.0} and list(model.members_) == [model.parts_[best].member]


def test_one_encoding_encodes_each_tables_once_and_changes_no_prediction(sources3, rubric):
    train, test = sources3.subset(sources3.text_ids[:90]), sources3.subset(sources3.text_ids[90:])
    fitted = lambda name: fit_questions(make(name, rubric), train, [rubric.main.id])  # noqa: E731
    with one_encoding():
        first = question_targets(train, rubric.main)
        assert question_targets(train, rubric.main) is first  # read, not computed again
        assert question_targets(train.subset(train.text_ids), rubric.main) is not first  # other tables
        with pytest.raises(ValueError, match="read-only"):  # a reader that would change what others read fails
            first[1][0] = -1
        shared = {name: fitted(name) for name in ("clmm_all", "ridge_judge")}
    assert question_targets(train, rubric.main) is not first  # outside a fit: computed as always
    for name, model in shared.items():
        np.testing.assert_array_equal(model.predict_proba(test), fitted(name).predict_proba(test))


@pytest.mark.slow
def test_a_fit_that_encodes_its_tables_once_predicts_what_encoding_them_again_predicts(sources3, rubric, monkeypatch):
    train, test = sources3.subset(sources3.text_ids[:90]), sources3.subset(sources3.text_ids[90:])
    candidates = {"candidates": ["network", "clmm_all", "ridge_judge"], "intervals": "all"}
    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], **candidates}}
    once = AutoCalibrator(rubric, settings, FAST, seed=0, group="system").fit(train)
    monkeypatch.setattr(auto_module, "one_encoding", contextlib.nullcontext)  # every reader encodes them again
    again = AutoCalibrator(rubric, settings, FAST, seed=0, group="system").fit(train)
    assert once.weights_ == again.weights_ and once.inner_nll_ == again.inner_nll_
    np.testing.assert_array_equal(once.predict_proba(test), again.predict_proba(test))
    assert list(once.conformals_) == list(again.conformals_)
    for question_id, conformal in once.conformals_.items():
        np.testing.assert_array_equal(conformal.pairs, again.conformals_[question_id].pairs)


def test_inner_folds_by_system_never_split_a_system(sources3, rubric):
    folds = InnerFolds.of(sources3, rubric.main, "system", 5, seed=0, strict=True)
    systems = lambda tables: set(tables.texts.system_id)  # noqa: E731
    assert folds.group == "system" and folds.fallback is None and len(folds.splits) == 5
    assert all(not systems(train) & systems(test) for train, test in folds.splits)
    assert set().union(*(systems(test) for _, test in folds.splits)) == systems(sources3)
    assert len(folds.answers) == len(folds.fold_of) == sum(len(p) for p in folds.pairs)


@pytest.mark.slow
def test_too_few_systems_is_an_error_or_a_recorded_fallback(sources3, rubric):
    names = sorted(sources3.texts.system_id.unique())[:2]
    two = sources3.subset(sources3.texts.text_id[sources3.texts.system_id.isin(names)])
    forced = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "group": "system"}}
    with pytest.raises(InputError, match="at least 3 training systems") as error:
        AutoCalibrator(rubric, forced, FAST, group="system").fit(two)
    assert error.value.setting == "model.auto.group"
    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "candidates": ["ridge_judge"]}}
    model = AutoCalibrator(rubric, settings, FAST, group="system").fit(two)
    assert model.group == "text" and "at least 3 training systems" in model.fallback_


@pytest.mark.slow
def test_a_candidate_that_does_not_apply_is_recorded_and_a_bug_stops_the_run(sources3, rubric, monkeypatch):
    def not_for_these_data(self, tables, questions=None):
        raise NotApplicableError("needs what these data lack")

    def broken(self, tables, questions=None):
        raise ValueError("broken on purpose")

    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "candidates": ["clmm_all", "ridge_judge"]}}
    monkeypatch.setattr(MixedOrdinal, "fit", not_for_these_data)
    model = AutoCalibrator(rubric, settings, FAST).fit(sources3)
    assert "needs what these data lack" in model.table_["clmm_all"]["not_applicable"]
    assert "clmm_all-level" not in model.table_
    assert [model.parts_[n].member for n in model.weights_] == ["ridge_judge"]
    only = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "candidates": ["clmm_all"]}}
    with pytest.raises(InputError, match="no candidate applies") as error:
        AutoCalibrator(rubric, only, FAST).fit(sources3)
    assert error.value.setting == "model.auto.candidates"
    monkeypatch.setattr(MixedOrdinal, "fit", broken)
    with pytest.raises(ValueError, match="broken on purpose"):
        AutoCalibrator(rubric, settings, FAST).fit(sources3)


@pytest.mark.parametrize(
    "auto, setting",
    [
        ({"candidates": ["network", "forest"]}, "model.auto.candidates"),
        ({"candidates": []}, "model.auto.candidates"),
        ({"rule": "vote"}, "model.auto.rule"),
        ({"group": "judge"}, "model.auto.group"),
        ({"folds": 1}, "model.auto.folds"),
        ({"tune_trials": -1}, "model.auto.tune_trials"),
        ({"bb_draws": 0}, "model.auto.bb_draws"),
        ({"fold_ensemble": 0}, "model.auto.fold_ensemble"),
        ({"fold_ensemble": 2.5}, "model.auto.fold_ensemble"),
    ],
)
def test_bad_auto_settings_name_the_setting(rubric, auto, setting):
    with pytest.raises(InputError) as error:
        AutoCalibrator(rubric, {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], **auto}})
    assert error.value.setting == setting


@pytest.mark.parametrize(("fold_ensemble", "in_folds"), [(3, 3), (None, 5), (8, 5)])
def test_inner_fold_models_keep_at_most_fold_ensemble_networks_and_the_refit_all(rubric, fold_ensemble, in_folds):
    settings = {**model_file("auto"), "ensemble": 5}
    model = AutoCalibrator(rubric, {**settings, "auto": {**settings["auto"], "fold_ensemble": fold_ensemble}})
    assert model._fold_candidate("network").get_params()["model.ensemble"] == in_folds
    assert model._candidate("network").get_params()["model.ensemble"] == 5
    assert model._fold_candidate("network").seeds == model._candidate("network").seeds[:in_folds]  # its first ones
    assert "model.ensemble" not in model._fold_candidate("ridge_judge").get_params()  # no ensemble: as it is


@pytest.mark.slow
def test_tune_trials_tune_each_candidate_with_a_search_space_on_the_inner_folds(sources3, rubric, tmp_path):
    auto = {**FAST_AUTO["auto"], "candidates": ["clmm_own", "ridge_judge"], "rule": "select", "system_level": "off"}
    tuned = {**FAST_AUTO, "auto": {**auto, "tune_trials": 2}}
    model = AutoCalibrator(rubric, tuned, FAST, seed=1).fit(sources3)
    record = model.table_["clmm_own"]["tuned"]
    nlls = [trial["nll"] for trial in record["trials"]]
    assert len(nlls) == 2 and np.isfinite(nlls).all() and "tuned" not in model.table_["ridge_judge"]
    assert record["trials"][0]["params"] == {"rounds": 4, "inputs": "own"}  # the first trial: its own settings
    assert record["params"] == record["trials"][int(np.argmin(nlls))]["params"]
    assert model.table_["clmm_own"]["nll"] == pytest.approx(min(nlls)) and list(model.weights_) == ["clmm_own"]
    assert model.members_["clmm_own"].get_params() == record["params"]
    model.save(tmp_path / "tuned.safetensors")
    loaded = load_model(tmp_path / "tuned.safetensors")
    assert loaded.choice()["inner_cv"]["clmm_own"]["tuned"] == record
    assert loaded.members_["clmm_own"].get_params() == record["params"]
    assert AutoCalibrator(rubric, tuned, FAST, seed=1).fit(sources3).table_["clmm_own"]["tuned"] == record
    untuned = AutoCalibrator(rubric, {**FAST_AUTO, "auto": auto}, FAST, seed=1).fit(sources3)
    assert not any("tuned" in row for row in untuned.table_.values())
    assert untuned.table_["clmm_own"]["nll"] == pytest.approx(nlls[0])


@pytest.mark.slow
def test_tune_trials_tune_a_network_candidate_and_refit_it_with_the_best_trial(sources3, rubric):
    small = sources3.subset(sources3.text_ids[:60])
    auto = {**FAST_AUTO["auto"], "candidates": ["ordinal"], "folds": 2, "system_level": "off", "tune_trials": 2}
    model = AutoCalibrator(rubric, {**FAST_AUTO, "auto": auto}, FAST, seed=1).fit(small)
    record = model.table_["ordinal"]["tuned"]
    assert len(record["trials"]) == 2 and all(np.isfinite(t["nll"]) for t in record["trials"])
    assert {t["params"]["model.personalize"] for t in record["trials"]} == {"none"}  # the cumulative head's space
    params = model.members_["ordinal"].get_params()
    assert {key: params[key] for key in record["params"]} == record["params"]


@pytest.mark.slow
def test_a_categorical_question_is_covered_when_only_ordinal_families_have_weight(rubric, monkeypatch):
    from dataclasses import replace

    questions = tuple(replace(q, ordered=False) if q.id == "Q8" else q for q in rubric.questions)
    categorical = replace(rubric, questions=questions)
    tables = simulate(2, 80, 4, 2, rubric)[0]
    monkeypatch.setattr(auto_module, "combine", lambda likelihood, *args: (np.eye(likelihood.shape[1])[0], None))
    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "candidates": ["clmm_all", "ridge_judge"]}}
    model = AutoCalibrator(categorical, settings, FAST).fit(tables)
    assert model.weights_ == {"clmm_all": 1.0, "ridge_judge": 0.0}
    probs = model.predict_proba(tables)
    q8 = categorical.ids.index("Q8")
    ridge = model.members_["ridge_judge"].predict_proba(tables)
    np.testing.assert_allclose(probs[:, q8], ridge[:, q8])
    np.testing.assert_allclose(probs[:, 0], model.members_["clmm_all"].predict_proba(tables)[:, 0])


@pytest.mark.slow
def test_the_mixed_model_recovers_its_own_generating_slope_and_judge_spread(rubric):
    rng = np.random.default_rng(0)
    n_texts, judges = 600, 8
    x = rng.uniform(-1, 1, n_texts)
    shift = rng.normal(0, 0.8, judges)
    rows, feats = [], []
    for t in range(n_texts):
        for j in rng.choice(judges, 3, replace=False):
            latent = 1.5 * x[t] - shift[j] + rng.logistic()
            answer = int(np.digitize(latent, [-2, 0, 2]) + 1)
            rows.append((f"t{t}", f"j{j}", "Q0", str(answer)))
        value, p = 2.5 + x[t], np.zeros(4)  # two neighbouring options whose expected answer is exactly 2.5 + x
        low = int(np.floor(value))
        p[low - 1], p[low] = low + 1 - value, value - low
        feats += [(f"t{t}", "llm", "Q0", str(k + 1), float(v)) for k, v in enumerate(p)]
    annotations = pd.DataFrame(rows, columns=["text_id", "judge_id", "question_id", "answer"])
    features = pd.DataFrame(feats, columns=["text_id", "source", "question_id", "option", "prob"])
    model = MixedOrdinal(rubric, "own").fit(Tables(annotations, features), ["Q0"])
    fit = model.fits_["Q0"]
    expected = np.arange(1.0, 5.0)
    raw = (features.pivot(index="text_id", columns="option", values="prob").to_numpy() @ expected).std()
    assert float(fit.beta[0].detach()) / raw == pytest.approx(1.5, rel=0.25)
    assert 0.2 < float(fit.variances[0]) < 2.0  # the judges' location spread (true variance 0.64)
    probs = model.predict_proba(Tables(annotations, features))[:, 0, :4]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    pairs = pd.DataFrame(
        {
            "text_id": [f"t{t}" for t in range(n_texts)] * 2,
            "judge_id": ["new"] * n_texts + [f"j{np.argmax(shift)}"] * n_texts,
        }
    )
    both = model.predict_proba(Tables(annotations, features), pairs.assign(round="1"))[:, 0, :4]
    unseen, shifted = both[:n_texts], both[n_texts:]
    np.testing.assert_allclose(unseen.sum(axis=1), 1.0, atol=1e-9)
    assert (unseen @ np.arange(4) > shifted @ np.arange(4)).all()  # the population, above the harshest judge


@pytest.mark.slow
def test_mean_of_sources_averages_the_sources_present_and_counts_the_rest(sources3, rubric):
    features = sources3.features
    lacking = sources3.text_ids[:5]
    drop = features.text_id.isin(lacking) & (features.source == "llm-a") & (features.question_id == rubric.main.id)
    none = sources3.text_ids[5]
    drop |= (features.text_id == none) & (features.question_id == rubric.main.id)
    tables = Tables(sources3.annotations, features[~drop], sources3.texts)
    predicted = MeanOfSources(rubric).predict(tables)
    assert none not in set(predicted.text_id) and set(lacking) <= set(predicted.text_id)
    only_bc = MeanOfSources(rubric).predict(Tables(sources3.annotations, features[features.source != "llm-a"]))
    key = ["text_id", "judge_id"]
    merged = predicted.merge(only_bc, on=key, suffixes=("", "_bc"))
    merged = merged[merged.text_id.isin(lacking)]
    np.testing.assert_allclose(merged["mean"], merged["mean_bc"])
    figures = evaluate_predicted(predicted, tables.annotations, rubric.main)
    answered = tables.annotations[(tables.annotations.text_id == none) & (tables.annotations.question_id == "Q0")]
    assert figures["not_predicted"] == len(answered) > 0 and np.isfinite(figures["nll"])
    assert np.isfinite(RidgeJudge(rubric).fit(tables).predict(tables)["mean"]).all()


def test_raw_linear_system_fits_a_line_through_the_system_means(rubric):
    rows, feats = [], []
    for s, answer in enumerate([1, 2, 4, 4]):  # system s: the LLM's mode s + 1, every human answer ``answer``
        for t in range(5):
            text = f"s{s}t{t}"
            p = np.full(4, 0.01) + 0.96 * np.eye(4)[s]
            feats += [(text, "llm", "Q0", str(k + 1), float(v)) for k, v in enumerate(p)]
            rows.append((text, "j1", "Q0", str(answer), f"S{s}"))
    annotations = pd.DataFrame(rows, columns=["text_id", "judge_id", "question_id", "answer", "system_id"])
    features = pd.DataFrame(feats, columns=["text_id", "source", "question_id", "option", "prob"])
    model = RawLinearSystem(rubric).fit(Tables(annotations, features))
    x = np.array([(np.full(4, 0.01) + 0.96 * np.eye(4)[i]) @ np.arange(1, 5) for i in range(4)])
    y = np.array([1.0, 2.0, 4.0, 4.0])
    slope, intercept = np.polyfit(x, y, 1)
    assert model.slope_ == pytest.approx(slope) and model.intercept_ == pytest.approx(intercept)
    assert make_method("raw_linear_system", rubric).name == "raw_linear_system"


@pytest.mark.slow
def test_evaluate_masks_missing_blocks_and_records_the_choice(sources3, rubric, tmp_path):
    """A text lacking one source's block, or every source's, is no reason to refuse the data set. The rubric's
    first three questions only (the main one and two others for the other questions' intervals): each question
    more refits every candidate on every inner fold for its intervals."""
    kept = rubric.ids[:3]
    questions = yaml.safe_load((ROOT / "conf" / "rubric" / "llm_rubric.yaml").read_text())
    questions["questions"] = [q for q in questions["questions"] if q["id"] in kept]
    (tmp_path / "rubric.yaml").write_text(yaml.safe_dump(questions))
    annotations = sources3.annotations[sources3.annotations.question_id.isin(kept)]
    features = sources3.features[sources3.features.question_id.isin(kept)]
    main = features.question_id == rubric.main.id
    lacking, none = sources3.text_ids[:6], sources3.text_ids[6]
    drop = (features.text_id.isin(lacking) & (features.source == "llm-a") & main) | ((features.text_id == none) & main)
    paths = {}
    for name, frame in (
        ("annotations", annotations),
        ("features", features[~drop]),
        ("texts", sources3.texts),
    ):
        paths[name] = tmp_path / f"{name}.csv"
        frame.to_csv(paths[name], index=False)
    args = [
        "experiment=demo",
        f"rubric={tmp_path / 'rubric.yaml'}",
        f"run_dir={tmp_path / 'run'}",
        "logger=none",
        "protocol=system_groups",
        "system_groups=2",
        "grouping_seeds=1",
        "model.ensemble=1",
        "baselines=[expected_llm,mean_of_sources,raw_linear_system,ridge_judge]",
        *[f"data.train.{name}={path}" for name, path in paths.items()],
        *FAST_OVERRIDES,
        "model.auto.intervals=all",  # the shipped setting: every question's intervals are what this test reads
    ]
    for script in ("train.py", "evaluate.py"):
        done = run(script, *args)
        assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    methods = metrics["methods"]
    pairs = lambda texts: int(
        annotations[annotations.text_id.isin(texts) & (annotations.question_id == "Q0")]
        .drop_duplicates(["text_id", "judge_id"])
        .shape[0]
    )
    assert methods["expected_llm/llm-a"]["not_predicted"] == pairs([*lacking, none])
    assert methods["expected_llm"]["not_predicted"] == pairs([none]) and "mean_of_sources" not in methods
    assert metrics["same_as"] == {"mean_of_sources": "expected_llm"}
    assert methods["llm_rubric"]["not_predicted"] == methods["ridge_judge"]["not_predicted"] == 0
    smooth = ("llm_rubric", "ridge_judge", "raw_linear_system")  # a raw LLM source may give an answer probability 0
    assert all(np.isfinite(methods[name]["nll"]) for name in smooth) and methods["llm_rubric"]["n"] > 0
    assert set(metrics["auto"]) == {"fold0", "fold1"}
    for choice in metrics["auto"].values():
        assert sum(choice["weights"].values()) == pytest.approx(1.0) and choice["inner_folds_by"] == "system"
        assert {n.partition("-")[0] for n in choice["inner_cv"]} == set(default_candidates())  # labels of parts
        assert "reason" in choice["system_level"]
    assert "model=auto, fold0: weights" in (tmp_path / "run" / "metrics.md").read_text()
    intervals, curve = methods["llm_rubric"]["intervals"], methods["llm_rubric"]["coverage_curve"]
    assert intervals["nominal"] == 0.9 and intervals["pairs"] == methods["llm_rubric"]["n"]
    assert [c["nominal"] for c in curve] == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    assert curve[4]["coverage"] == intervals["coverage"] and np.all(np.diff([c["width"] for c in curve]) >= 0)
    assert (tmp_path / "run" / "coverage.png").read_bytes()[:4] == b"\x89PNG"
    predictions = pd.read_csv(tmp_path / "run" / "predictions.csv")
    assert predictions.lo.notna().all()  # every question of the rubric is ordered and calibrated
    others = intervals["other_questions"]
    assert set(predictions.question_id) == set(kept)
    assert set(others) == set(predictions.question_id) - {"Q0"} and all(f["coverage"] > 0.6 for f in others.values())
    assert "intervals of Q1: coverage" in (tmp_path / "run" / "metrics.md").read_text()


@pytest.mark.parametrize("rule", ["select", "stack"])
@pytest.mark.slow
def test_score_texts_and_leaderboard_use_an_auto_checkpoint(sources3, rubric, tmp_path, rule):
    from llmrubric.cli import main as cli

    train, new = sources3.subset(sources3.text_ids[:80]), sources3.subset(sources3.text_ids[80:])
    settings = {**FAST_AUTO, "auto": {**FAST_AUTO["auto"], "rule": rule, "candidates": ["clmm_all", "ridge_judge"]}}
    model = AutoCalibrator(rubric, settings, FAST).fit(train)
    model.save(tmp_path / "auto.safetensors")
    new.features.to_csv(tmp_path / "features.csv", index=False)
    new.texts.to_csv(tmp_path / "texts.csv", index=False)
    args = ["score", "texts", str(tmp_path / "auto.safetensors"), str(tmp_path / "features.csv")]
    args += ["--texts", str(tmp_path / "texts.csv"), "--out", str(tmp_path / "scores.csv")]
    assert cli([*args, "--predictions", str(tmp_path / "pred.csv"), "--questions", "Q0", "--no-progress"]) == 0
    scores = pd.read_csv(tmp_path / "scores.csv", dtype={"text_id": str}).set_index("text_id")
    judges = list(model.judges_.judges)
    pairs = pd.DataFrame(
        {"text_id": np.repeat(new.text_ids, len(judges)), "judge_id": judges * len(new.text_ids), "round": "1"}
    )
    expected = model.predict(new, pairs, ["Q0"]).groupby("text_id")["mean"].mean()
    np.testing.assert_allclose(scores.loc[expected.index, "mean"], expected.to_numpy(), atol=1e-6)
    assert (scores.status == "ok").all()
    board = ["leaderboard", "build", str(tmp_path / "pred.csv"), "--texts", str(tmp_path / "texts.csv")]
    assert cli([*board, "--out-dir", str(tmp_path / "board"), "--bootstrap", "50"]) == 0
    assert any((tmp_path / "board").iterdir())
