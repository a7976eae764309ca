import json
import subprocess
import sys
import time

import optuna
import pytest
from support.paths import ROOT
from support.search import BASE, search_config
from support.settings import FAST

from llmrubric.data.splits import text_folds
from llmrubric.experiments.search import (
    Objective,
    Setting,
    _FoldData,
    check_space,
    create_study,
    finished_trials,
    run_search,
    setting_of,
    suggest,
)
from llmrubric.io.errors import InputError


def test_space_keys_map_onto_model_and_trainer_settings():
    trial = optuna.trial.FixedTrial({"model.h1": 50, "trainer.lr": 0.002})
    space = {
        "model.h1": {"type": "categorical", "choices": [10, 50]},
        "trainer.lr": {"type": "float", "low": 1e-4, "high": 1e-2},
    }
    setting = suggest(trial, space, BASE)
    assert setting.model["h1"] == 50 and setting.trainer["lr"] == 0.002 and BASE.model["h1"] == 6
    with pytest.raises(InputError, match="must be a parameter of network"):
        suggest(trial, {"lr": {"type": "float", "low": 0, "high": 1}}, BASE)


@pytest.mark.slow
def test_search_selects_by_inner_cv_nll_and_resumes(tmp_path, rubric, search_data):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    setting, study = run_search(rubric, search_data, BASE, search_config(storage, 3), "s", seed=0)
    assert len(study.trials) == 3
    best = study.best_trial
    assert best.value == min(t.value for t in study.trials if t.value is not None)
    assert setting.trainer["lr"] == best.params["trainer.lr"] and setting.model["h1"] == 6
    assert len(best.user_attrs["fold_nll"]) == 3 and -1 <= best.user_attrs["pearson"] <= 1
    _, again = run_search(rubric, search_data, BASE, search_config(storage, 4), "s", seed=0)
    assert len(again.trials) == 4 and [t.number for t in again.trials] == [0, 1, 2, 3]


@pytest.mark.slow
def test_trials_train_with_the_search_patience_and_the_selection_keeps_the_trainers(rubric, search_data):
    space = search_config(None, 1).space
    objective = Objective(
        rubric, search_data, BASE, dict(space), text_folds(search_data.text_ids, 3, 0), seed=0, patience=7
    )
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    [setting] = objective.settings([trial])
    assert setting.trainer["patience"] == 7 and setting.model["ensemble"] == 1
    assert setting_of(trial.params, BASE).trainer["patience"] == BASE.trainer["patience"] == FAST["patience"]


WORKER = """
import json, os, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from omegaconf import OmegaConf
from support.search import BASE, search_config, search_tables
from llmrubric.io.rubric import Rubric
from llmrubric.experiments.search import run_search
rubric = Rubric.load({root!r} + "/conf/rubric/llm_rubric.yaml")
tables = search_tables()
open({go!r} + ".ready", "w").close()
while not os.path.exists({go!r}):  # imported; wait for the other worker
    time.sleep(0.05)
_, study = run_search(rubric, tables, BASE, search_config({storage!r}, 6), "shared", seed=0)
print(json.dumps(sorted(t.number for t in study.trials)))
"""


@pytest.mark.slow
def test_two_workers_share_one_sqlite_study_without_duplicates_or_losses(tmp_path, rubric, search_data):
    """A worker process and this one, started together once the other has imported."""
    storage, go = f"sqlite:///{tmp_path / 'shared.db'}", tmp_path / "go"
    optuna.create_study(study_name="shared", storage=storage, direction="minimize")
    code = WORKER.format(root=str(ROOT), tests=str(ROOT / "tests"), storage=storage, go=str(go))
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not go.with_suffix(".ready").exists():  # however long a loaded machine takes (pytest's timeout)
            assert other.poll() is None, other.communicate()[1][-2000:]
            time.sleep(0.05)
        go.touch()
        _, mine = run_search(rubric, search_data, BASE, search_config(storage, 6), "shared", seed=0)
        out, err = other.communicate(timeout=300)
    finally:
        other.kill()
    assert other.returncode == 0, err[-2000:]
    study = optuna.load_study(study_name="shared", storage=storage)
    numbers = [t.number for t in study.trials]
    surplus = [t for t in study.trials if t.user_attrs.get("fail_reason") == "surplus"]  # asked at once: one a worker
    assert numbers == list(range(len(numbers))) and len(finished_trials(study)) == 6
    assert len(numbers) == 6 + len(surplus) and len(surplus) <= 2
    assert all(t.state.is_finished() for t in study.trials)
    assert len({t.datetime_start for t in study.trials}) == len(numbers)
    assert json.loads(out.strip().splitlines()[-1]) and mine.trials


@pytest.mark.slow
def test_a_diverging_trial_is_failed_with_its_reason_and_the_search_goes_on(tmp_path, rubric, search_data):
    storage = f"sqlite:///{tmp_path / 'nan.db'}"
    config = search_config(storage, 2)
    config.space = {"trainer.lr": {"type": "categorical", "choices": [0.01, 1.0e300]}}
    study = optuna.create_study(study_name="nan", storage=storage, direction="minimize")
    study.enqueue_trial({"trainer.lr": 1.0e300})
    study.enqueue_trial({"trainer.lr": 0.01})
    setting, study = run_search(rubric, search_data, BASE, config, "nan", seed=0)
    failed, complete = study.trials
    assert (
        failed.state == optuna.trial.TrialState.FAIL and "non-finite training loss" in failed.user_attrs["fail_reason"]
    )
    assert complete.state == optuna.trial.TrialState.COMPLETE and setting.trainer["lr"] == 0.01


KILLED = """
import sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from support.search import BASE, search_config, search_tables
from llmrubric.io.rubric import Rubric
from llmrubric.experiments.search import run_search
rubric = Rubric.load({root!r} + "/conf/rubric/llm_rubric.yaml")
tables = search_tables()
config = search_config({storage!r}, 8)
config.batch, config.heartbeat_seconds = 2, 1
run_search(rubric, tables, BASE, config, "killed", seed=0)
"""


@pytest.mark.slow
def test_a_killed_search_resumes_without_repeating_finished_trials(tmp_path, rubric, search_data):
    storage = f"sqlite:///{tmp_path / 'killed.db'}"
    watched = optuna.create_study(study_name="killed", storage=storage, direction="minimize")  # one connection pool
    code = KILLED.format(root=str(ROOT), tests=str(ROOT / "tests"), storage=storage)
    worker = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 240
    while time.time() < deadline and worker.poll() is None:
        states = [t.state for t in watched.trials]
        if (
            states.count(optuna.trial.TrialState.COMPLETE) + states.count(optuna.trial.TrialState.PRUNED) >= 2
            and optuna.trial.TrialState.RUNNING in states
        ):
            break
        time.sleep(0.1)
    worker.kill()
    assert worker.wait() != 0, "the search ended before it could be killed"
    worker.stderr.close()
    trials = watched.trials
    before = {t.number: (t.params, t.value, t.state) for t in trials if t.state.is_finished()}
    interrupted = [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert interrupted
    time.sleep(2.5)  # past the heartbeat grace period (2 × 1 s)
    config = search_config(storage, 8)
    config.batch, config.heartbeat_seconds = 2, 1
    _, study = run_search(rubric, search_data, BASE, config, "killed", seed=0)
    trials = {t.number: t for t in study.trials}
    assert all((trials[n].params, trials[n].value, trials[n].state) == value for n, value in before.items())
    assert all(trials[n].state == optuna.trial.TrialState.FAIL for n in interrupted)
    requeued = {t.user_attrs["requeued_from"]: t for t in study.trials if "requeued_from" in t.user_attrs}
    assert sorted(requeued) == [
        n for n in interrupted if trials[n].params
    ]  # a trial killed before sampling has nothing to re-run
    assert all(
        t.params.items() >= trials[n].params.items() for n, t in requeued.items()
    )  # a kill mid-sampling leaves some unsampled
    assert len(finished_trials(study)) == 8


@pytest.mark.slow
def test_cross_validation_scores_equal_the_metrics_of_its_predictions(rubric, search_data):
    from llmrubric.data.splits import text_folds
    from llmrubric.evaluation.metrics import evaluate
    from llmrubric.experiments.search import cross_validate

    metrics, predictions = cross_validate(
        rubric, search_data, BASE, text_folds(search_data.text_ids, 3, seed=0), seed=0
    )
    expected = evaluate(predictions, search_data.annotations, rubric.main, per_judge=False)
    for key in ("nll", "rmse", "pearson", "spearman", "kendall", "n"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5)
    assert len(metrics["fold_nll"]) == 3 and min(metrics["fold_nll"]) <= metrics["nll"] <= max(metrics["fold_nll"])


@pytest.mark.slow
def test_a_trial_killed_before_its_first_heartbeat_does_not_stall_a_resumed_search(tmp_path, rubric, search_data):
    storage = f"sqlite:///{tmp_path / 'silent.db'}"
    config = search_config(storage, 2)
    config.batch, config.heartbeat_seconds = 2, 1
    silent = create_study(config, "silent").ask()  # asked, then its worker died before any heartbeat
    time.sleep(2.5)  # past the grace period (2 × 1 s)
    _, study = run_search(rubric, search_data, BASE, config, "silent", seed=0)
    assert study.trials[silent.number].state == optuna.trial.TrialState.FAIL
    assert len(finished_trials(study)) == 2


@pytest.mark.slow
def test_a_trial_killed_mid_sampling_reruns_with_the_parameters_it_had_sampled(tmp_path, rubric, search_data):
    storage = f"sqlite:///{tmp_path / 'partial.db'}"
    config = search_config(storage, 1)
    config.batch, config.heartbeat_seconds = 1, 1
    partial = create_study(config, "partial").ask()
    lr = partial.suggest_float("trainer.lr", 1e-3, 3e-2, log=True)  # killed before model.personalize was sampled
    time.sleep(2.5)  # past the grace period (2 × 1 s)
    _, study = run_search(rubric, search_data, BASE, config, "partial", seed=0)
    assert study.trials[partial.number].state == optuna.trial.TrialState.FAIL
    [rerun] = [t for t in study.trials if t.user_attrs.get("requeued_from") == partial.number]
    assert rerun.state == optuna.trial.TrialState.COMPLETE and rerun.params["trainer.lr"] == lr
    assert rerun.params["model.personalize"] in ("input", "none")


def test_a_space_with_choices_the_model_always_refuses_fails_before_training(rubric):
    ordinal = Setting({"head": "ordinal", "inputs": "expected", "personalize": "none", "ensemble": 1}, BASE.trainer)
    space = {"model.personalize": {"type": "categorical", "choices": ["none", "deltas"]}}
    with pytest.raises(InputError, match="refuses 'deltas'") as refused:
        check_space(space, ordinal, rubric)
    assert refused.value.setting == "search.space.model.personalize"
    check_space({"model.inputs": {"type": "categorical", "choices": ["expected", "both"]}}, ordinal, rubric)


@pytest.mark.slow
def test_a_trial_whose_combination_the_model_refuses_is_failed_and_the_batch_trains_the_rest(rubric, search_data):
    space = {
        "model.head": {"type": "categorical", "choices": ["softmax", "ordinal"]},
        "model.personalize": {"type": "categorical", "choices": ["input", "none"]},
    }
    base = Setting({**BASE.model, "inputs": "expected"}, BASE.trainer)
    check_space(space, base, rubric)  # each choice is accepted in some combination
    objective = Objective(rubric, search_data, base, space, text_folds(search_data.text_ids, 3, 0), seed=0)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"model.head": "ordinal", "model.personalize": "input"})
    study.enqueue_trial({"model.head": "softmax", "model.personalize": "input"})
    objective.run(study, [study.ask(), study.ask()])
    refused, trained = study.trials
    assert refused.state == optuna.trial.TrialState.FAIL and refused.user_attrs["fail_reason"].startswith("refused:")
    assert trained.state == optuna.trial.TrialState.COMPLETE and trained.value > 0


@pytest.mark.slow
def test_a_worker_that_loses_the_race_to_create_a_new_studys_schema_opens_it_again(tmp_path, monkeypatch):
    from sqlalchemy.exc import IntegrityError, OperationalError

    import llmrubric.experiments.search as search

    real, calls = search.RDBStorage, []

    def racing(url, **kwargs):
        calls.append(url)
        if len(calls) == 1:  # the other worker created the tables first
            raise IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed"))
        return real(url, **kwargs)

    monkeypatch.setattr(search, "RDBStorage", racing)
    study = create_study(search_config(f"sqlite:///{tmp_path / 'study.db'}", 1), "s")
    assert len(calls) == 2 and study.study_name == "s"

    def broken(url, **kwargs):
        calls.append(url)
        raise OperationalError("connect", {}, Exception("unable to open database file"))

    monkeypatch.setattr(search, "RDBStorage", broken)
    calls.clear()
    with pytest.raises(InputError, match="cannot be opened: .*unable to open"):
        create_study(search_config(f"sqlite:///{tmp_path / 'other.db'}", 1), "s")
    assert len(calls) == 1


def test_the_search_tunes_the_mixed_model_and_its_fold_models_have_the_trials_params(rubric, search_data, monkeypatch):
    """``search.family=clmm_all``: its declared space (rounds, inputs), fold models fitted one by one."""
    built = []
    calibrators = _FoldData.calibrators

    def recording(self, setting, seed):
        models = calibrators(self, setting, seed)
        built.append(models)
        return models

    monkeypatch.setattr(_FoldData, "calibrators", recording)
    config = {**search_config(None, 3), "family": "clmm_all", "space": {}, "inner_folds": 2}
    base = Setting(BASE.model, BASE.trainer, "clmm_all")
    setting, study = run_search(rubric, search_data.subset(search_data.text_ids[:60]), base, config, "mixed", seed=0)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 3 and set(complete[0].params) == {"rounds", "inputs"}
    for trial in complete:
        [models] = [m for m in built if {k: m[0].get_params()[k] for k in trial.params} == trial.params]
        assert all(m.fits_ for m in models)  # fitted with the trial's parameters
    assert setting.build(rubric).get_params() == study.best_trial.params
