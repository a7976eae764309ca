"""From a composed Hydra config to data splits, shared by train.py, evaluate.py and benchmarks.

Protocols: ``cv`` (k folds of the training texts), ``systems`` (leave one system out: each
system's texts are one fold, so every model is tested on a system it never saw),
``system_groups`` (the systems dealt into ``system_groups`` folds: one model scores each held-out
group of systems, as a user ranks several new systems; ``grouping_seeds`` groupings, one set of
models each: the first gives every held-out figure, all give the Kendall within held-out groups),
``holdout`` (train on ``data.train``, test on ``data.test``, or on a seeded
``test_fraction`` of the training texts when there is no test set). Folds are saved beside
the checkpoints so that evaluation uses exactly the texts the models did not see.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from llmrubric.data.splits import (
    holdout_texts,
    load_folds,
    save_folds,
    system_folds,
    system_groupings,
    text_folds,
)
from llmrubric.io.errors import USER_ERRORS, InputError, report
from llmrubric.io.guards import check_range, check_writable_dir
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.scoring.intervals import DEFAULT_COVERAGE, check_coverage

log = logging.getLogger(__name__)
FOLDS_FILE = "folds.csv"
PROTOCOLS = ("cv", "systems", "system_groups", "holdout")
SYSTEM_PROTOCOLS = ("systems", "system_groups")  # every fold is held-out whole systems


@dataclass
class Split:
    """One model to train: its name (checkpoint stem), training and test tables."""

    name: str
    train: Tables
    test: Tables
    grouping: int = 0  # protocol=system_groups: which grouping of the systems (0: the one every figure uses)


def load_rubric(cfg: DictConfig) -> Rubric:
    rubric = Rubric.from_dict(
        OmegaConf.to_container(cfg.rubric, resolve=True),
        source=f"rubric={cfg.rubric.get('name', '?')}",
        warn_main=not cfg.get("main_question"),
    )
    return rubric.with_main(cfg.main_question) if cfg.get("main_question") else rubric


def load_data(cfg: DictConfig, rubric: Rubric) -> tuple[Tables, Tables | None]:
    train = instantiate(cfg.data.train, _partial_=True)(rubric=rubric)
    test = instantiate(cfg.data.test, _partial_=True)(rubric=rubric) if cfg.data.get("test") else None
    return train, test


def make_folds(cfg: DictConfig, train: Tables) -> pd.DataFrame | None:
    """Fold of each training text (None when an explicit test set is used)."""
    if cfg.protocol == "cv":
        return text_folds(train.text_ids, cfg.folds, cfg.seed)
    if cfg.protocol == "systems":
        return system_folds(train)
    if cfg.protocol == "system_groups":
        return system_groupings(train, cfg.system_groups, cfg.seed, cfg.grouping_seeds)
    if cfg.protocol == "holdout":
        if cfg.data.get("test"):
            return None
        kept, held = holdout_texts(train.text_ids, cfg.test_fraction, cfg.seed)
        return pd.DataFrame({"text_id": held + kept, "fold": [0] * len(held) + [1] * len(kept)})
    raise InputError(f"unknown protocol {cfg.protocol!r} (use {', '.join(PROTOCOLS)})")


def splits_from_folds(cfg: DictConfig, folds: pd.DataFrame | None, train: Tables, test: Tables | None) -> list[Split]:
    if folds is None:
        if test is None:
            raise InputError("holdout without data.test needs a folds file")
        return [Split("model", train, test)]
    if "grouping" in folds:  # protocol=system_groups: each grouping's folds; the first keeps the plain names
        return [
            Split(f"grouping{g}_{s.name}" if g else s.name, s.train, s.test, int(g))
            for g, part in folds.groupby("grouping", sort=True)
            for s in splits_from_folds(cfg, part.drop(columns="grouping"), train, test)
        ]
    evaluated = sorted(folds.fold.unique()) if cfg.protocol in ("cv", *SYSTEM_PROTOCOLS) else [0]
    out = []
    for k in evaluated:
        held = folds.text_id[folds.fold == k]
        rest = folds.text_id[folds.fold != k]
        out.append(Split(f"fold{k}", train.subset(rest), train.subset(held)))
    return out


def prepare(cfg: DictConfig, create_folds: bool, folds_dir: str | Path | None = None) -> tuple[Rubric, list[Split]]:
    """Rubric and splits of an experiment; ``create_folds`` writes the folds (to ``folds_dir``,
    default ``run_dir``), else reads them from ``run_dir``."""
    rubric = load_rubric(cfg)
    train, test = load_data(cfg, rubric)
    path = Path(cfg.run_dir) / FOLDS_FILE
    if create_folds:
        folds = make_folds(cfg, train)
        if folds is not None:
            save_folds(folds, Path(folds_dir or cfg.run_dir) / FOLDS_FILE)
    else:
        folds = load_folds(path) if path.exists() else None
        if folds is None and not cfg.data.get("test"):
            raise InputError("no folds file; run train.py with the same config first", file=str(path))
    return rubric, splits_from_folds(cfg, folds, train, test)


PREDICTION_FORMATS = ("csv", "parquet", "tsv", "jsonl")


def check_settings(cfg: DictConfig) -> Rubric:
    """Every setting of train.py and evaluate.py, checked before any work; an error names the setting."""
    from llmrubric.model.auto_settings import build_model
    from llmrubric.model.core.label_rule import settings_of
    from llmrubric.model.core.registry import capabilities
    from llmrubric.model.families.baselines import make_method

    rubric = load_rubric(cfg)
    seed = check_range("seed", cfg.seed, integer=True)
    model, trainer = (OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "trainer"))
    build_model(rubric, model, trainer, seed)
    settings_of(model)
    if cfg.search.get("enabled"):
        from llmrubric.experiments.search import check_space, searched_setting, space_for

        base = searched_setting(cfg)
        check_space(space_for(cfg.search, base), base, rubric)
        refit = capabilities(base.family)
        if not (refit.joint_fit or refit.members):
            raise InputError(
                f"train.py refits the network or model=auto, not {base.family}: tune it with "
                "llmrubric.experiments.search.run_search",
                setting="search.family",
            )
    if cfg.protocol not in PROTOCOLS:
        raise InputError(f"{cfg.protocol!r} is not a protocol ({', '.join(PROTOCOLS)})", setting="protocol")
    if cfg.protocol == "cv":
        check_range("folds", cfg.folds, 2, integer=True)
    if cfg.protocol == "system_groups":
        check_range("system_groups", cfg.system_groups, 2, integer=True)
        check_range("grouping_seeds", cfg.grouping_seeds, 1, integer=True)
    if cfg.protocol == "holdout" and not cfg.data.get("test"):
        check_range("test_fraction", cfg.test_fraction, 0, 1, open_low=True, open_high=True)
    check_coverage(cfg.get("coverage", DEFAULT_COVERAGE))
    if cfg.predictions_format not in PREDICTION_FORMATS:
        raise InputError(
            f"{cfg.predictions_format!r} is not an output format ({', '.join(PREDICTION_FORMATS)})",
            setting="predictions_format",
        )
    for name in cfg.get("baselines") or []:
        try:
            make_method(name, rubric, seed)
        except InputError as e:
            raise InputError(str(e), setting="baselines") from None
    check_writable_dir(cfg.run_dir, "run_dir")
    return rubric


def checked_once(cfg: DictConfig) -> None:
    """:func:`check_settings` where :class:`CheckSettings` did not run: a Hydra run's settings are
    checked by the callback before Hydra writes anything; a multirun job's (Hydra calls no
    ``on_run_start`` there) and a direct call's (``train_app(cfg)``) here."""
    if not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN):
        check_settings(cfg)


class CheckSettings(Callback):
    """Hydra callback (``hydra.callbacks`` of ``conf/config.yaml``): :func:`check_settings` before
    Hydra creates ``run_dir`` or writes anything, once per run."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        if config.hydra.runtime.choices.get("model") == "default":
            log.warning("model=default is an alias of model=network (the network alone): use model=network")
        try:
            check_settings(config)
        except (*USER_ERRORS, KeyboardInterrupt) as e:
            sys.exit(report(e))
