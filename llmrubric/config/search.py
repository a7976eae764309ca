"""Hyperparameter search settings (``search.*``, ``conf/search/``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SearchConfig:
    """Optuna search (``search.*``, :mod:`llmrubric.experiments.search`); ``search=optuna`` turns it on
    and sets the space. Each training split (the outer folds under ``protocol=cv``: nested CV) gets
    its own study; the selected configuration is refitted on the whole split.

    Attributes:
        n_trials: finished trials per study (a resumed study continues to this count).
        batch: trials asked at once (TPE, constant liar) and trained as one stacked program.
        ensemble: networks per fold model while searching (the refit uses ``model.ensemble``; a family
            without the parameter ignores it).
        patience: early-stopping patience while searching (the refit uses ``trainer.patience``; as ``ensemble``).
        inner_folds: selection by k-fold CV of the training texts, split by ``text_id``.
        seed: the TPE sampler's seed: the search is reproducible from its config.
        startup_trials: random trials before TPE (and the median pruner's warm-up in trials).
        pruner: ``successive_halving`` (Optuna's ASHA) or ``median``.
        pruner_warmup_epochs: epochs before a trial can be pruned (the first rung).
        reduction_factor: successive halving keeps the best 1/3 at epochs 10, 30, 90, 270.
        storage: the study's database; ``postgresql://user@host/db`` for several machines.
        heartbeat_seconds: running trials beat; a resumed search re-queues the trials of a killed one.
        family: the registered name tuned (``network``: the network of ``model.*``; any name whose settings
            declare a search space, e.g. ``clmm_all``), fitted on each inner fold and scored as the network.
        space: the parameters searched (the family's: ``model.*`` / ``trainer.*`` for the network), types
            categorical, int, float; empty: the space the family's settings declare.
    """

    enabled: bool = False
    family: str = "network"
    n_trials: int = 100
    batch: int = 10
    ensemble: int = 1
    patience: int | None = 10
    inner_folds: int = 5
    seed: int = 0
    startup_trials: int = 10
    pruner: str = "successive_halving"
    pruner_warmup_epochs: int = 10
    reduction_factor: int = 3
    storage: str | None = "sqlite:///${run_dir}/optuna.db"
    heartbeat_seconds: int = 60
    progress: bool = True
    space: dict[str, Any] = field(default_factory=dict)
