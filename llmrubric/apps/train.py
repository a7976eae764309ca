"""Train the calibration network(s) of an experiment and save checkpoints.

    llmrubric train experiment=llm_rubric_real      # synthetic → real
    llmrubric train experiment=llm_rubric_cv        # 5 fold models, trained together as one stacked program
    llmrubric train model.h1=50 trainer.lr=0.001    # any setting from conf/
    llmrubric train search=optuna experiment=llm_rubric_real   # select by 5-fold CV, then refit

Returns the mean held-out (early-stopping) NLL of the main question, the value a
hyperparameter search minimises. Logs an MLflow run (``logger=none``: off): config, per-split
``val/nll/<split>`` and per-epoch histories, the checkpoints and folds as artifacts.

The run directory changes as a whole: folds and checkpoints are written to a staging folder
(in ``run_dir``, or in its nearest existing parent when it does not exist yet) and moved into
``run_dir`` only when every model is trained, so a failed or interrupted training leaves the
previous run intact (and creates no ``run_dir``; Hydra's record of the run is staged likewise,
:mod:`llmrubric.config.hydra_app`) (checkpoints also carry their training texts'
fingerprint, which evaluate.py checks against the folds).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from llmrubric.config import CONF_PATH, VERSION_BASE, run_app
from llmrubric.experiments.experiment import FOLDS_FILE, SYSTEM_PROTOCOLS, checked_once, prepare
from llmrubric.experiments.tracking import Tracker
from llmrubric.io.errors import reports_errors
from llmrubric.model.core.registry import capabilities, make

log = logging.getLogger("train")


@hydra.main(config_path=CONF_PATH, config_name="config", version_base=VERSION_BASE)
@reports_errors
def train_app(cfg: DictConfig) -> float:
    checked_once(cfg)
    run_dir = Path(cfg.run_dir)
    staging = Path(tempfile.mkdtemp(dir=existing_folder(run_dir), prefix=".train-", suffix=".tmp"))
    try:
        score = train(cfg, run_dir, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return score


def train(cfg: DictConfig, run_dir: Path, staging: Path) -> float:
    # imported here, not at the top: Lightning costs seconds that --help need not pay
    from llmrubric.model.core.label_rule import in_sample_rule

    rubric, splits = prepare(cfg, create_folds=True, folds_dir=staging)
    with Tracker.from_config(cfg).run("train", nested=True, tags={"job": "train"}) as run:
        run.log_config(cfg)
        models = split_models(cfg, rubric, splits, run)
        start = time.perf_counter()
        if capabilities(models[0]).joint_fit:  # the networks of every split train as one program
            with tqdm(desc="training", unit="epoch", disable=len(splits) == 1) as progress:
                models[0].fit_many(models, [split.train for split in splits], progress=progress)
        else:
            for split, model in tqdm(
                list(zip(splits, models)), desc="model=auto", unit="split", disable=len(splits) == 1
            ):
                model.fit(split.train)
                if capabilities(model).members:  # model=auto: what its inner cross-validation chose
                    log_choice(run, split.name, model.choice())
        seconds = time.perf_counter() - start
        for split, model in zip(splits, models):
            if not capabilities(model).members:  # the network alone: its rule from its in-sample predictions
                model.label_rule_ = in_sample_rule(model, split.train, cfg.seed)
        scores = []
        for split, model in zip(splits, models):
            model.save(staging / f"{split.name}.safetensors")
            scores.append(model.val_nll_)
            log.info(
                "%s: %d annotations, %d judges (val NLL %s)",
                split.name,
                len(split.train.annotations),
                len(model.judges_.judges),
                f"{scores[-1]:.4f}" if np.isfinite(scores[-1]) else "n/a",
            )
            run.log_metrics({f"val/nll/{split.name}": scores[-1]})
            run.log_history(model, split.name)
        log.info("%d model(s) trained together in %.1fs", len(models), seconds)
        run.log_metrics({"train/seconds": seconds})
        commit(staging, run_dir, [f"{s.name}.safetensors" for s in splits])
        for split in splits:
            run.log_artifact(run_dir / f"{split.name}.safetensors", "checkpoints")
        if (run_dir / FOLDS_FILE).is_file():
            run.log_artifact(run_dir / FOLDS_FILE)
        log.info("checkpoints and folds written to %s", run_dir)
        score = float(np.nanmean(scores)) if np.isfinite(scores).any() else float("nan")
        run.log_metrics({"val/nll": score})
        return score


def log_choice(run, split: str, choice: dict) -> None:
    """Log ``model=auto``'s choice on ``split``: its weights, and the whole record as a JSON artifact."""
    log.info("%s: model=auto weights %s", split, {k: round(w, 3) for k, w in choice["weights"].items()})
    run.log_dict(choice, f"auto/{split}.json")
    run.log_metrics({f"auto/weight/{name}/{split}": w for name, w in choice["weights"].items()})


def split_models(cfg: DictConfig, rubric, splits, run) -> list:
    """Each split's unfitted model: that of ``model.*`` and ``trainer.*``, or when ``search`` is enabled
    ``search.family`` with the configuration the search selected on the split's training texts."""
    from llmrubric.model.auto_settings import build_model

    if not cfg.search.enabled:
        return [build_model(rubric, dict(cfg.model), dict(cfg.trainer), cfg.seed, auto_group(cfg)) for _ in splits]
    from llmrubric.experiments.search import select_for_split

    selected = [select_for_split(cfg, rubric, split, run) for split in splits]
    return [make(s.family, rubric, s.model, s.trainer, cfg.seed, auto_group(cfg), params=s.params) for s in selected]


def auto_group(cfg: DictConfig) -> str:
    """Inner folds of ``model=auto`` under ``model.auto.group=auto``: by system when the protocol
    scores systems no model saw, else by text."""
    return "system" if cfg.protocol in SYSTEM_PROTOCOLS else "text"


def existing_folder(run_dir: Path) -> Path:
    """``run_dir`` if it exists, else its nearest existing parent: where the staging folder goes, on the file
    system of ``run_dir``, which is created only when the run succeeds."""
    folder = run_dir.absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def commit(staging: Path, run_dir: Path, checkpoints: list[str]) -> None:
    """Move the staged folds and checkpoints into ``run_dir``; the folds of a previous run
    that used none (a given test set) are removed, so nothing stale remains beside them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in checkpoints:
        os.replace(staging / name, run_dir / name)
    if (staging / FOLDS_FILE).is_file():
        os.replace(staging / FOLDS_FILE, run_dir / FOLDS_FILE)
    else:
        (run_dir / FOLDS_FILE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    """``llmrubric train [overrides…]`` (and ``python train.py``): Hydra overrides and flags in ``argv``."""
    run_app(train_app, "train", argv)
