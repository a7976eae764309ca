"""Hyperparameter search: Optuna (TPE, pruning) over k-fold cross-validation split by text.

A configuration's score is the mean held-out NLL of the main question over ``inner_folds``
folds of the training texts (the paper's criterion); RMSE and correlations are recorded as
trial attributes, not optimised. All fold models of a trial (times the ensemble members)
train as one stacked program (:func:`llmrubric.calibrator.fit_together`), so a trial
costs about one fit. Trials are pruned on the mean early-stopping NLL of the finetune phase.

The study lives in ``storage`` (SQLite by default, any SQLAlchemy URL such as PostgreSQL
for many machines): several workers started with the same storage and study name share
it, and a search interrupted and started again resumes where it stopped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from llmrubric.calibrator import Calibrator, fit_together
from llmrubric.data import JudgeMap
from llmrubric.errors import InputError
from llmrubric.metrics import evaluate
from llmrubric.rubric import Rubric
from llmrubric.schemas import Tables, write_json, write_table
from llmrubric.splits import text_folds
from llmrubric.tracking import Tracker

log = logging.getLogger(__name__)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


@dataclass
class Setting:
    """A configuration: network and trainer settings."""

    model: dict
    trainer: dict


def suggest(trial: optuna.Trial, space: dict, base: Setting) -> Setting:
    """Sample every parameter of ``space`` (keys ``model.x`` / ``trainer.x``) on top of ``base``."""
    model, trainer = dict(base.model), dict(base.trainer)
    for key, spec in space.items():
        group, _, name = key.partition(".")
        target = {"model": model, "trainer": trainer}.get(group)
        if target is None or not name:
            raise InputError(f"search space key {key!r} must start with 'model.' or 'trainer.'")
        kind = spec["type"]
        if kind == "categorical":
            value = trial.suggest_categorical(key, list(spec["choices"]))
        elif kind == "int":
            value = trial.suggest_int(key, spec["low"], spec["high"], step=spec.get("step", 1), log=spec.get("log", False))
        elif kind == "float":
            value = trial.suggest_float(key, spec["low"], spec["high"], log=spec.get("log", False))
        else:
            raise InputError(f"search space {key!r}: unknown type {kind!r} (categorical, int, float)")
        target[name] = value
    return Setting(model, trainer)


def setting_of(params: dict, base: Setting) -> Setting:
    """The configuration of a finished trial's ``params``."""
    model, trainer = dict(base.model), dict(base.trainer)
    for key, value in params.items():
        group, _, name = key.partition(".")
        {"model": model, "trainer": trainer}[group][name] = value
    return Setting(model, trainer)


def cross_validate(
    rubric: Rubric, tables: Tables, setting: Setting, folds: pd.DataFrame, seed: int, on_epoch=None
) -> tuple[dict, pd.DataFrame]:
    """Train the fold models of ``setting`` together; pooled metrics of their held-out predictions.

    Returns the metrics (``nll``, ``rmse``, correlations, ``fold_nll``) and the predictions.
    """
    judges = JudgeMap.from_annotations(tables.annotations)
    ks = sorted(folds.fold.unique())
    trains = [tables.subset(folds.text_id[folds.fold != k]) for k in ks]
    tests = [tables.subset(folds.text_id[folds.fold == k]) for k in ks]
    models = [Calibrator(rubric, setting.model, setting.trainer, seed) for _ in ks]
    fit_together(models, trains, judges, on_epoch=on_epoch)
    parts = [m.predict(t, questions=[rubric.main.id]) for m, t in zip(models, tests)]
    fold_nll = [evaluate(p, t.annotations, rubric.main)["nll"] for p, t in zip(parts, tests)]
    predictions = pd.concat(parts, ignore_index=True)
    metrics = evaluate(predictions, tables.annotations, rubric.main)
    metrics.pop("per_judge", None)
    return {**metrics, "fold_nll": fold_nll}, predictions


class Objective:
    """Optuna objective: mean held-out NLL of a sampled configuration over the inner folds."""

    def __init__(self, rubric: Rubric, tables: Tables, base: Setting, space: dict, folds: pd.DataFrame, seed: int, tracker=None, parent=None):
        self.rubric, self.tables, self.base, self.space, self.folds, self.seed = rubric, tables, base, space, folds, seed
        self.tracker, self.parent = tracker, parent

    def __call__(self, trial: optuna.Trial) -> float:
        setting = suggest(trial, self.space, self.base)

        def report(phase, epoch, val_nll):
            live = val_nll[~val_nll.isnan()]
            if phase != "finetune" or not len(live):
                return
            value = float(live.mean())
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at finetune epoch {epoch} (early-stopping NLL {value:.4f})")

        metrics, _ = cross_validate(self.rubric, self.tables, setting, self.folds, self.seed, on_epoch=report)
        for key in ("rmse", "pearson", "spearman", "kendall"):
            trial.set_user_attr(key, float(metrics[key]))
        trial.set_user_attr("fold_nll", [float(v) for v in metrics["fold_nll"]])
        if self.tracker is not None:
            with self.tracker.run(f"trial-{trial.number}", nested=True, parent=self.parent, tags={"job": "trial"}) as run:
                run.log_params(trial.params)
                run.log_metrics({f"val/{k}": float(metrics[k]) for k in ("nll", "rmse", "pearson", "spearman", "kendall")})
                for k, value in enumerate(metrics["fold_nll"]):
                    run.log_metrics({"val/fold_nll": float(value)}, step=k)
        return float(metrics["nll"])


def create_study(search: DictConfig | dict, study_name: str) -> optuna.Study:
    """The study of ``search`` (sampler, pruner, storage), created or loaded to resume."""
    search = OmegaConf.create(search) if isinstance(search, dict) else search
    sampler = optuna.samplers.TPESampler(seed=search.seed, n_startup_trials=search.startup_trials)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=search.startup_trials, n_warmup_steps=search.pruner_warmup_epochs)
    return optuna.create_study(
        study_name=study_name, storage=search.storage, sampler=sampler, pruner=pruner, direction="minimize", load_if_exists=True
    )


def run_search(
    rubric: Rubric, tables: Tables, base: Setting, search: DictConfig, study_name: str, seed: int, tracker=None, parent=None
) -> tuple[Setting, optuna.Study]:
    """Select a configuration by ``search.inner_folds``-fold CV on ``tables``; runs until the
    study holds ``search.n_trials`` finished trials (so a resumed search does not start over).
    With a :class:`llmrubric.tracking.Tracker`, each trial is an MLflow run nested under ``parent``."""
    study = create_study(search, study_name)
    folds = text_folds(tables.text_ids, search.inner_folds, seed)
    objective = Objective(rubric, tables, base, OmegaConf.to_container(search.space, resolve=True), folds, seed, tracker, parent)
    done = len(study.get_trials(deepcopy=False, states=FINISHED))
    remaining = max(0, int(search.n_trials) - done)
    if remaining:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        stop = optuna.study.MaxTrialsCallback(int(search.n_trials), states=FINISHED)
        study.optimize(objective, n_trials=remaining, callbacks=[stop], show_progress_bar=search.progress)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise InputError(f"study {study_name!r} has no completed trial to select from")
    return setting_of(study.best_trial.params, base), study


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial: number, state, value (mean held-out NLL), parameters and reported metrics."""
    return study.trials_dataframe(attrs=("number", "state", "value", "params", "user_attrs", "duration"))


def select_for_split(cfg: DictConfig, rubric: Rubric, split, run=None) -> Setting:
    """Search on one training split (``train.py search=optuna``); writes
    ``<run_dir>/search/<split>/selected.json`` and ``trials.csv`` and returns the selection."""
    base = Setting(OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.trainer, resolve=True))
    tracker = Tracker.from_config(cfg) if run is not None else None
    setting, study = run_search(rubric, split.train, base, cfg.search, f"{cfg.name}-{split.name}", cfg.seed, tracker, run)
    out = Path(cfg.run_dir) / "search" / split.name
    best = study.best_trial
    write_json(
        {"model": setting.model, "trainer": setting.trainer, "trial": best.number, "nll": best.value, **best.user_attrs},
        out / "selected.json",
    )
    write_table(trials_frame(study), out / "trials.csv")
    if run is not None:
        run.log_artifacts(out, f"search/{split.name}")
    log.info("%s: selected trial %d of %d (inner-CV NLL %.4f): %s", split.name, best.number, len(study.trials), best.value, best.params)
    return setting
