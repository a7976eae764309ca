import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf

from llmrubric.errors import InputError
from llmrubric.search import Setting, run_search, suggest

ROOT = Path(__file__).resolve().parents[1]
BASE = Setting({"h1": 6, "h2": 6, "ensemble": 1}, {"pretrain_epochs": 3, "finetune_epochs": 4, "patience": 3, "lr": 0.01})


def search_config(storage: str, n_trials: int) -> dict:
    config = OmegaConf.load(ROOT / "conf" / "search" / "optuna.yaml")
    config.storage, config.n_trials, config.inner_folds, config.startup_trials, config.progress = storage, n_trials, 3, 2, False
    config.space = {
        "model.personalize": {"type": "categorical", "choices": ["input", "none"]},
        "trainer.lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
    }
    return config


def test_space_keys_map_onto_model_and_trainer_settings():
    trial = optuna.trial.FixedTrial({"model.h1": 50, "trainer.lr": 0.002})
    space = {"model.h1": {"type": "categorical", "choices": [10, 50]}, "trainer.lr": {"type": "float", "low": 1e-4, "high": 1e-2}}
    setting = suggest(trial, space, BASE)
    assert setting.model["h1"] == 50 and setting.trainer["lr"] == 0.002 and BASE.model["h1"] == 6
    with pytest.raises(InputError, match="must start with"):
        suggest(trial, {"lr": {"type": "float", "low": 0, "high": 1}}, BASE)


def test_search_selects_by_inner_cv_nll_and_resumes(tmp_path, rubric, simulated):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    setting, study = run_search(rubric, simulated, BASE, search_config(storage, 3), "s", seed=0)
    assert len(study.trials) == 3
    best = study.best_trial
    assert best.value == min(t.value for t in study.trials if t.value is not None)
    assert setting.trainer["lr"] == best.params["trainer.lr"] and setting.model["h1"] == 6
    assert len(best.user_attrs["fold_nll"]) == 3 and -1 <= best.user_attrs["pearson"] <= 1
    _, again = run_search(rubric, simulated, BASE, search_config(storage, 4), "s", seed=0)
    assert len(again.trials) == 4 and [t.number for t in again.trials] == [0, 1, 2, 3]


WORKER = """
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from omegaconf import OmegaConf
from test_search import BASE, search_config
from llmrubric.rubric import Rubric
from llmrubric.schemas import load_tables
from llmrubric.search import run_search
rubric = Rubric.load({root!r} + "/conf/rubric/llm_rubric.yaml")
d = {root!r} + "/data/simulated/"
tables = load_tables(d + "annotations.csv", d + "features.csv", rubric, d + "texts.csv")
_, study = run_search(rubric, tables, BASE, search_config({storage!r}, 6), "shared", seed=0)
print(json.dumps(sorted(t.number for t in study.trials)))
"""


def test_two_workers_share_one_sqlite_study_without_duplicates_or_losses(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(study_name="shared", storage=storage, direction="minimize")
    code = WORKER.format(root=str(ROOT), tests=str(ROOT / "tests"), storage=storage)
    workers = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    assert all(w.returncode == 0 for w in workers), [err[-2000:] for _, err in outputs]
    study = optuna.load_study(study_name="shared", storage=storage)
    numbers = [t.number for t in study.trials]
    assert numbers == list(range(len(numbers))) and 6 <= len(numbers) <= 7
    assert all(t.state.is_finished() for t in study.trials)
    assert len({t.datetime_start for t in study.trials}) == len(numbers)
    assert all(json.loads(out.strip().splitlines()[-1]) for out, _ in outputs)
