"""A small search: the base setting its trials start from, the data they train on, an Optuna config on any
storage, and a three-trial ``search`` group for the Hydra apps."""

from __future__ import annotations

from omegaconf import OmegaConf

from llmrubric.config import group
from llmrubric.experiments.search import Setting
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, load_tables

from .paths import ROOT
from .settings import FAST, SIMULATED

BASE = Setting({"h1": 6, "h2": 6, "ensemble": 1}, dict(FAST))
SEARCH_TEXTS = 120  # the studies' bookkeeping is under test, not the size of the data: trials train on 120 texts

TINY_SEARCH = """
defaults:
  - optuna
  - _self_
n_trials: 3
batch: 3
inner_folds: 2
startup_trials: 2
progress: false
space:
  trainer.lr: {type: float, low: 0.003, high: 0.03, log: true}
  trainer.pretrain_epochs: {type: int, low: 2, high: 4}
  trainer.finetune_epochs: {type: int, low: 2, high: 4}
"""


def search_tables() -> Tables:
    """The first ``SEARCH_TEXTS`` texts of ``data/simulated`` (sorted ids), which every search test and its worker
    processes train on."""
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    tables = load_tables(
        *(SIMULATED / f"{t}.csv" for t in ("annotations", "features")), rubric, SIMULATED / "texts.csv"
    )
    return tables.subset(sorted(tables.text_ids)[:SEARCH_TEXTS])


def search_config(storage: str, n_trials: int) -> dict:
    """The shipped search on ``storage``, shrunk: ``n_trials``, 3 inner folds, 2 random trials first, and no
    pruning (trials are compared whole: the warm-up is longer than the fast trainer's epochs)."""
    config = OmegaConf.create(group("search", "optuna"))  # the shipped search settings
    config.storage, config.n_trials, config.inner_folds, config.startup_trials, config.progress = (
        storage,
        n_trials,
        3,
        2,
        False,
    )
    config.pruner_warmup_epochs = FAST["pretrain_epochs"] + FAST["finetune_epochs"] + 1
    config.space = {
        "model.personalize": {"type": "categorical", "choices": ["input", "none"]},
        "trainer.lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
    }
    return config
