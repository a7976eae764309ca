"""Hyperparameter search: Optuna (TPE, pruning) over k-fold cross-validation split by text.

A configuration's score is the pooled held-out NLL of the main question over ``inner_folds``
folds of the training texts (the paper's criterion); RMSE and correlations are recorded as
trial attributes, not optimised. Trials are asked in batches (TPE with the constant liar) and
the fold models of a whole batch train as one stacked program
(the network's ``fit_many``), so a batch costs about one fit. Trials are pruned
(asynchronous successive halving or the median rule) on the mean
held-out NLL of the main question of their fold models.

The study lives in ``storage`` (SQLite by default, any SQLAlchemy URL such as PostgreSQL
for many machines): several workers started with the same storage and study name share
it, and a search interrupted and started again resumes where it stopped.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from tqdm.auto import tqdm

from llmrubric.config import SearchConfig, settings_error
from llmrubric.data.splits import text_folds
from llmrubric.evaluation.metrics import point_metrics
from llmrubric.experiments.tracking import Tracker
from llmrubric.io.errors import USER_ERRORS, InputError
from llmrubric.io.files import write_json, write_table
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.encoding import JudgeMap
from llmrubric.model.core.inner_cv import InnerFolds, held_out
from llmrubric.model.core.params import prefixed, quiet_study, sample_space, under
from llmrubric.model.core.registry import (
    Family,
    capabilities,
    entry,
    fit_questions,
    make,
    param_names,
    search_space,
)

log = logging.getLogger(__name__)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


@dataclass
class Setting:
    """A configuration: the ``model.*`` and ``trainer.*`` settings, the registered name tuned (``family``)
    and its parameters set on top (:meth:`Family.set_params`; the ``model.x`` / ``trainer.x`` ones are also
    in ``model`` / ``trainer``)."""

    model: dict
    trainer: dict
    family: str = "network"
    params: dict = field(default_factory=dict)

    def build(self, rubric: Rubric, seed: int = 0) -> Family:
        """The unfitted model of this configuration (:func:`llmrubric.model.core.registry.make`)."""
        return make(self.family, rubric, self.model, self.trainer, seed, params=self.params)

    def base_params(self) -> dict:
        """The parameters a search from this configuration starts at (what :func:`search_space` adapts to)."""
        return {**prefixed("model", self.model), **prefixed("trainer", self.trainer), **self.params}


def suggest(trial: optuna.Trial, space: dict, base: Setting) -> Setting:
    """Sample every parameter of ``space`` (parameters of ``base.family``: ``model.x`` / ``trainer.x`` for the
    network) on top of ``base``."""
    known = param_names(base.family)
    unknown = [key for key in space if key not in known]
    if unknown:
        raise InputError(f"search space key {unknown[0]!r} must be a parameter of {base.family}: {known}")
    return setting_of(sample_space(trial, space), base)


def setting_of(params: dict, base: Setting) -> Setting:
    """The configuration of a finished trial's ``params``."""
    model, trainer = dict(base.model), dict(base.trainer)
    model.update(under("model", params))
    trainer.update(under("trainer", params))
    return Setting(model, trainer, base.family, {**base.params, **params})


def network(rubric: Rubric, model: dict, trainer: dict, seed: int = 0) -> Family:
    """An unfitted network of these settings (the registry's ``network``: its ``fit_many`` trains the fold
    models of many trials as one program, pruning them as they go)."""
    return Setting(model, trainer).build(rubric, seed)


def space_for(search: DictConfig, base: Setting) -> dict:
    """``search.space``, or where empty the space ``base.family``'s settings declare for ``base``
    (:func:`llmrubric.model.core.registry.search_space`); neither is an error naming ``search.space``."""
    entry(base.family, "search.family")
    space = OmegaConf.to_container(search.space, resolve=True) if isinstance(search.space, DictConfig) else search.space
    space = dict(space or {}) or search_space(base.family, base.base_params())
    if not space:
        raise InputError(f"search.family={base.family} declares no search space: give one", setting="search.space")
    return space


def cross_validate(
    rubric: Rubric, tables: Tables, setting: Setting, folds: pd.DataFrame, seed: int, on_epoch=None
) -> tuple[dict, pd.DataFrame]:
    """Train the fold models of ``setting`` together; pooled metrics of their held-out predictions.

    Returns the metrics (``nll``, ``rmse``, correlations, ``fold_nll``) and the predictions.
    """
    cv = _FoldData(rubric, tables, folds)
    models = cv.calibrators(setting, seed)
    if capabilities(models[0]).joint_fit:
        models[0].fit_many(models, cv.trains, cv.judges, on_epoch=on_epoch)
    else:
        for model, train in zip(models, cv.trains):
            fit_questions(model, train, [rubric.main.id])
    return cv.score(models)


class _FoldData:
    """The k training/test splits of one set of folds (:class:`~llmrubric.model.core.inner_cv.InnerFolds`, whose
    out-of-fold NLL scores a configuration as ``model=auto``'s inner folds score a candidate), the network's test
    pairs encoded once for every configuration."""

    def __init__(self, rubric: Rubric, tables: Tables, folds: pd.DataFrame):
        self.rubric, self.tables = rubric, tables
        self.judges = JudgeMap.from_annotations(tables.annotations)
        self.folds = InnerFolds.from_frame(tables, rubric.main, folds)
        self.trains = self.folds.trains
        self.tests = [test for _, test in self.folds.splits]
        self._encoded: list | None = None

    def calibrators(self, setting: Setting, seed: int) -> list[Family]:
        return [setting.build(self.rubric, seed) for _ in self.tests]

    def score(self, models: list[Family], frames: bool = True) -> tuple[dict, pd.DataFrame | None]:
        """Pooled held-out metrics of fitted fold models on the main question (and each fold's NLL),
        computed from the test pairs (encoded once for the network); with ``frames``, also their predictions table."""
        main = self.rubric.main
        values = np.asarray(main.values, float)
        joint = capabilities(models[0]).joint_fit
        probs = np.concatenate(self._held_out(models) if joint else held_out(models, self.folds, self.rubric))
        pooled, fold_nll = self.folds.nll(probs)
        answers = self.folds.answers
        metrics = {**point_metrics(values[answers], probs @ values), "nll": pooled, "n": len(answers)}
        metrics["fold_nll"] = fold_nll
        if not frames:
            return metrics, None
        if joint:
            parts = [m.predict(t, questions=[main.id], data=d) for m, t, d in zip(models, self.tests, self._encoded)]
        else:
            parts = [p[p.question_id == main.id] for p in (m.predict(t) for m, t in zip(models, self.tests))]
        return metrics, pd.concat(parts, ignore_index=True)

    def _held_out(self, models: list[Family]) -> list[np.ndarray]:
        """Each fold's main-question probabilities of its held-out pairs, encoded once (the network)."""
        if self._encoded is None:
            self._encoded = [m.encode(t) for m, t in zip(models, self.tests)]
        q, k = self.rubric.ids.index(self.rubric.main.id), len(self.rubric.main.options)
        return [
            model.predict_proba(data)[(data.y[:, q] >= 0).numpy(), q, :k] for model, data in zip(models, self._encoded)
        ]


class Objective:
    """Scores a batch of trials: the inner-fold models of every trial train as one stacked program.

    A trial's value is the pooled held-out NLL of the main question over the inner folds; its
    RMSE, correlations and per-fold NLL are trial attributes. After every epoch a trial reports
    the mean held-out NLL of the main question of its fold models (one step per epoch, across
    both phases) and may be pruned from step ``warmup`` on; a trial whose training diverges is
    failed with the reason. Trials train with ``ensemble`` networks per fold model and, when
    given, early-stopping ``patience`` (search budgets; the selection keeps the base's).
    """

    def __init__(
        self,
        rubric,
        tables,
        base: Setting,
        space: dict,
        folds,
        seed: int,
        ensemble: int = 1,
        warmup: int = 10,
        tracker=None,
        parent=None,
        patience: int | None = None,
    ):
        self.cv = _FoldData(rubric, tables, folds)
        self.base, self.space, self.seed, self.ensemble, self.warmup = base, space, seed, ensemble, warmup
        self.tracker, self.parent, self.patience = tracker, parent, patience

    def settings(self, trials: list[optuna.Trial]) -> list[Setting]:
        settings = [suggest(t, self.space, self.base) for t in trials]
        budget = {"model.ensemble": self.ensemble, "trainer.patience": self.patience}
        known = param_names(self.base.family)
        for setting in settings:
            for key, value in budget.items():
                if value is None or key not in known:
                    continue
                group, _, name = key.partition(".")
                getattr(setting, group)[name] = value
                if key in setting.params:
                    setting.params[key] = value
        return settings

    def run(self, study: optuna.Study, trials: list[optuna.Trial]) -> None:
        """Train, score and tell every trial of the batch; a trial whose sampled combination the
        model refuses (e.g. ``model.head=ordinal`` with ``model.personalize=input``) is failed with
        the reason and trains nothing."""
        accepted = []
        for trial, setting in zip(trials, self.settings(trials)):
            try:
                accepted.append((trial, self.cv.calibrators(setting, self.seed)))
            except InputError as e:
                trial.set_user_attr("fail_reason", f"refused: {e}")
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if accepted:
            self._train(study, *(list(x) for x in zip(*accepted)))

    def _train(self, study: optuna.Study, trials: list[optuna.Trial], models: list[list[Family]]) -> None:
        if not capabilities(models[0][0]).joint_fit:
            self._train_each(study, trials, models)
            return
        owner = [t for t, fold_models in enumerate(models) for _ in fold_models]
        pruned: dict[int, str] = {}
        steps, last = [0] * len(trials), [math.nan] * len(trials)

        def report(phase, epoch, main_nll):
            reported = []
            for t, trial in enumerate(trials):
                values = [v for i, v in main_nll.items() if owner[i] == t]
                if t in pruned or not values:
                    continue
                live = torch.cat(values)
                live = live[~live.isnan()]
                if not len(live):
                    continue
                steps[t], last[t] = steps[t] + 1, float(live.mean())
                trial.report(last[t], steps[t])
                reported.append(t)
            stop = []
            for t in reported:  # judged once the whole batch has reported this step
                if steps[t] >= self.warmup and trials[t].should_prune():
                    pruned[t] = f"pruned at {phase} epoch {epoch} (held-out NLL {last[t]:.4f})"
                    stop += [i for i, o in enumerate(owner) if o == t]
            return stop

        flat = [m for fold_models in models for m in fold_models]
        flat[0].fit_many(
            flat, [t for _ in models for t in self.cv.trains], self.cv.judges, on_epoch=report, tolerate_divergence=True
        )
        for t, (trial, fold_models) in enumerate(zip(trials, models)):
            diverged = [m.diverged_ for m in fold_models if m.diverged_]
            if t in pruned:
                trial.set_user_attr("pruned", pruned[t])
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            elif diverged:
                trial.set_user_attr("fail_reason", diverged[0])
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                self._tell(study, trial, self.cv.score(fold_models, frames=False)[0])

    def _train_each(self, study: optuna.Study, trials: list[optuna.Trial], models: list[list[Family]]) -> None:
        """Fit each trial's fold models on the main question one by one (a family without ``fit_many``: no
        pruning) and tell its score; a fit that fails fails the trial with the reason."""
        main = [self.cv.rubric.main.id]
        for trial, fold_models in zip(trials, models):
            try:
                for model, train in zip(fold_models, self.cv.trains):
                    fit_questions(model, train, main)
                metrics, _ = self.cv.score(fold_models, frames=False)
            except (*USER_ERRORS, ValueError, RuntimeError) as e:
                trial.set_user_attr("fail_reason", " ".join(str(e).split())[:300])
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            self._tell(study, trial, metrics)

    def _tell(self, study: optuna.Study, trial: optuna.Trial, metrics: dict) -> None:
        """Tell ``trial``'s pooled NLL, its other figures as attributes."""
        for key in ("rmse", "pearson", "spearman", "kendall"):
            trial.set_user_attr(key, float(metrics[key]))
        trial.set_user_attr("fold_nll", [float(v) for v in metrics["fold_nll"]])
        study.tell(trial, float(metrics["nll"]))
        self._track(trial, metrics)

    def _track(self, trial: optuna.Trial, metrics: dict) -> None:
        if self.tracker is None:
            return
        with self.tracker.run(f"trial-{trial.number}", nested=True, parent=self.parent, tags={"job": "trial"}) as run:
            run.log_params(trial.params)
            run.log_metrics({f"val/{k}": float(metrics[k]) for k in ("nll", "rmse", "pearson", "spearman", "kendall")})
            for k, value in enumerate(metrics["fold_nll"]):
                run.log_metrics({"val/fold_nll": float(value)}, step=k)


def search_settings(search: DictConfig | dict) -> DictConfig:
    """``search`` over the defaults of :class:`llmrubric.config.SearchConfig` (a composed config has
    them already; a dict of a test or benchmark gets them here), typed."""
    given = OmegaConf.to_container(search, resolve=True) if isinstance(search, DictConfig) else search
    try:
        return OmegaConf.merge(OmegaConf.structured(SearchConfig), given)
    except OmegaConfBaseException as e:
        raise settings_error(e) from None


def create_study(search: DictConfig | dict, study_name: str) -> optuna.Study:
    """The study of ``search`` (sampler, pruner, storage), created or loaded to resume."""
    return open_study(search, study_name)[0]


def open_study(search: DictConfig | dict, study_name: str) -> tuple[optuna.Study, Heartbeats]:
    """The study of ``search`` and its :class:`Heartbeats`.

    With a database storage, running trials send heartbeats; trials of a killed search stop
    beating, and a search that resumes fails them and queues their configurations again."""
    search = search_settings(search)
    sampler = TrialSeededTPE(seed=search.seed, n_startup_trials=search.startup_trials, constant_liar=True)
    if search.pruner == "successive_halving":
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=search.pruner_warmup_epochs, reduction_factor=search.reduction_factor
        )
    elif search.pruner == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=search.startup_trials)
    else:
        raise InputError(f"search.pruner must be successive_halving or median, not {search.pruner!r}")
    storage = search.storage
    if storage:
        beat = int(search.heartbeat_seconds)
        try:
            storage = _open_storage(storage, beat)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            raise InputError(f"search.storage {_hide_password(storage)!r} cannot be opened: {reason}") from e
    study = optuna.create_study(
        study_name=study_name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction="minimize",
        load_if_exists=True,
    )
    return study, Heartbeats(study, storage)


RDBStorage = optuna.storages.RDBStorage  # the class a study's database is opened with
SCHEMA_RACE = ("already exists", "UNIQUE constraint failed", "duplicate key")


def _open_storage(url: str, beat: int, attempts: int = 5) -> optuna.storages.RDBStorage:
    """The study storage (a SQLite file's folder created); workers that open a new database at the same moment
    race to create its schema, and the loser, finding the tables made by the other, opens it again."""

    database = make_url(url).database if url.startswith("sqlite") else None
    if database and database != ":memory:":  # the study store resumes a search: its folder (run_dir) is made for it
        Path(database).parent.mkdir(parents=True, exist_ok=True)

    # a database server's connections are few and shared by every worker (PostgreSQL's max_connections): a storage
    # holds none between its operations, so a study that is never closed keeps none open
    pooling = {} if url.startswith("sqlite") else {"engine_kwargs": {"poolclass": NullPool}}

    def open_it() -> optuna.storages.RDBStorage:
        return RDBStorage(
            url, heartbeat_interval=beat, grace_period=2 * beat, heartbeat_stale_trial_callback=_requeue, **pooling
        )

    for attempt in range(attempts - 1):
        try:
            return open_it()
        except SQLAlchemyError as e:
            if not any(m in str(e) for m in SCHEMA_RACE):
                raise
            time.sleep(0.2 * (attempt + 1))
    return open_it()


def _hide_password(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError):
        return url


class TrialSeededTPE(optuna.samplers.TPESampler):
    """TPE whose draws for a trial are seeded by ``seed`` and the trial's draw index (its number
    less the re-runs of killed trials numbered before it: they draw nothing), and by the
    parameter's name for the independent draws (the random start-up trials). Workers sharing a
    study therefore draw different configurations (equally seeded samplers would repeat each
    other's), and a trial's configuration depends neither on which worker drew it nor on the order
    of the draws: a search spread over workers and kills runs those of a one-worker search. Each
    draw is made by a TPE sampler of the same options seeded for it (Optuna keeps a sampler's
    random generators private)."""

    RELATIVE = 2**32  # the key of a trial's joint (multivariate TPE) draw; parameter keys are CRC-32s below it

    def __init__(self, seed: int | None = None, **options):
        super().__init__(seed=seed, **options)
        self.base_seed, self.options, self.draw_index = seed, options, {}

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        super().before_trial(study, trial)
        earlier = study.get_trials(deepcopy=False)[: trial.number]
        skipped = sum("requeued_from" in t.user_attrs or t.user_attrs.get("fail_reason") == "surplus" for t in earlier)
        self.draw_index[trial.number] = trial.number - skipped

    def sample_independent(self, study, trial, param_name, param_distribution):
        if self.base_seed is None:
            return super().sample_independent(study, trial, param_name, param_distribution)
        sampler = self.seeded(trial, zlib.crc32(param_name.encode()))
        return sampler.sample_independent(study, trial, param_name, param_distribution)

    def sample_relative(self, study, trial, search_space):
        if self.base_seed is None:
            return super().sample_relative(study, trial, search_space)
        return self.seeded(trial, self.RELATIVE).sample_relative(study, trial, search_space)

    def seeded(self, trial: optuna.trial.FrozenTrial, key: int) -> optuna.samplers.TPESampler:
        """A TPE sampler of this one's options, seeded for draw ``key`` of ``trial``."""
        entropy = [int(self.base_seed), self.draw_index.get(trial.number, trial.number), key]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        return optuna.samplers.TPESampler(seed=seed, **self.options)


class Heartbeats:
    """The heartbeats of a study's running trials, through Optuna's public storage API (none
    without a database storage). :meth:`fail_stale` fails the trials of a killed search: Optuna's
    stale trials (whose heartbeats stopped), and the running trials that never sent one and
    started more than the grace period ago (a worker killed between asking a trial and its
    first heartbeat leaves such a trial; Optuna's own check skips it, so a resumed search would
    wait on it for ever). A trial's first heartbeat marks it (system attribute ``heartbeat``)."""

    MARK = "heartbeat"

    def __init__(self, study: optuna.Study, storage):
        beating = hasattr(storage, "record_heartbeat") and storage.get_heartbeat_interval()
        self.study, self.storage = study, storage if beating else None
        self.interval = storage.get_heartbeat_interval() if beating else None

    def trial_id(self, number: int) -> int:
        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)

    def beat(self, trial: optuna.Trial) -> None:
        """Record a heartbeat for ``trial`` now; the first one marks it."""
        if self.storage is None:
            return
        trial_id = self.trial_id(trial.number)
        self.storage.record_heartbeat(trial_id)
        self.storage.set_trial_system_attr(trial_id, self.MARK, True)

    @contextmanager
    def running(self, trials: list[optuna.Trial]):
        """Record a heartbeat for each of ``trials`` every heartbeat interval while they run."""
        if self.storage is None:
            yield
            return
        ids = [self.trial_id(trial.number) for trial in trials]
        stop = threading.Event()

        def beat():
            while True:
                for trial_id in ids:
                    self.storage.record_heartbeat(trial_id)
                if stop.wait(self.interval):
                    return

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def fail_stale(self) -> None:
        """Fail (and re-queue, :func:`_requeue`) the running trials of killed workers."""
        optuna.storages.fail_stale_trials(self.study)
        if self.storage is None:
            return
        started_before = datetime.now() - timedelta(seconds=self.storage.grace_period)
        for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if self.MARK in trial.system_attrs or trial.datetime_start >= started_before:
                continue
            trial_id = self.trial_id(trial.number)
            try:
                failed = self.storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:  # another worker failed it first
                continue
            if failed:
                _requeue(self.study, self.storage.get_trial(trial_id))


def _requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """A trial of a killed search (failed without a reason): the parameters it had sampled before
    the kill are queued to run again; any the kill cut off are sampled afresh when it reruns."""
    if trial.params:
        study.enqueue_trial(trial.params, user_attrs={"requeued_from": trial.number})


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards ``n_trials``: complete, pruned, or failed for a reason other than an
    interruption (or being surplus)."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=FINISHED)
        if not (
            t.state == optuna.trial.TrialState.FAIL
            and t.user_attrs.get("fail_reason", "interrupted") in ("interrupted", "surplus")
        )
    ]


def run_search(
    rubric: Rubric,
    tables: Tables,
    base: Setting,
    search: DictConfig,
    study_name: str,
    seed: int,
    tracker=None,
    parent=None,
) -> tuple[Setting, optuna.Study]:
    """Select a configuration by ``search.inner_folds``-fold CV on ``tables``; runs until the
    study holds ``search.n_trials`` finished trials (so a resumed search does not start over),
    ``search.batch`` trials at a time as one stacked program; trials running in other workers
    count, so several workers on one storage run ``n_trials`` in all. With a
    :class:`llmrubric.experiments.tracking.Tracker`, each trial is an MLflow run nested under ``parent``."""
    search = search_settings(search)
    space = space_for(search, base)
    check_space(space, base, rubric)
    study, heartbeats = open_study(search, study_name)
    heartbeats.fail_stale()
    folds = text_folds(tables.text_ids, search.inner_folds, seed)
    patience = search.patience
    objective = Objective(
        rubric,
        tables,
        base,
        space,
        folds,
        seed,
        int(search.ensemble),
        int(search.pruner_warmup_epochs),
        tracker,
        parent,
        None if patience is None else int(patience),
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n_trials = int(search.n_trials)
    with tqdm(total=n_trials, desc=f"search {study_name}", unit="trial", disable=not search.progress) as bar:
        while True:
            heartbeats.fail_stale()
            done = len(finished_trials(study))
            bar.n = min(done, n_trials)
            bar.refresh()
            if done >= n_trials:
                break
            trials = []
            while len(trials) < int(search.batch) and _started(study) < n_trials:  # one ask at a time
                trial = study.ask()
                if _surplus(study, trial, n_trials):  # another worker asked the last one first
                    trial.set_user_attr("fail_reason", "surplus")
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    break
                trials.append(trial)
                heartbeats.beat(trial)
            if not trials:  # the rest is running in other workers (or in a killed one, until its heartbeat expires)
                time.sleep(1.0)
                continue
            with heartbeats.running(trials):
                objective.run(study, trials)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise InputError(f"study {study_name!r} has no completed trial to select from")
    return setting_of(study.best_trial.params, base), study


def _started(study: optuna.Study) -> int:
    """Finished trials that count plus the running ones (of every worker)."""
    return len(finished_trials(study)) + len(
        study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    )


def _surplus(study: optuna.Study, trial: optuna.Trial, n_trials: int) -> bool:
    """Whether ``n_trials`` counting trials were already started (finished or running) before ``trial``
    was numbered: workers asking at once each see room for one more; trial numbers settle who was first."""
    earlier = study.get_trials(deepcopy=False)[: trial.number]
    running = [t for t in earlier if t.state == optuna.trial.TrialState.RUNNING]
    counted = {t.number for t in finished_trials(study) if t.number < trial.number}
    return len(counted) + len(running) >= n_trials


def check_space(space: dict, base: Setting, rubric: Rubric) -> None:
    """Fail before any training on a bad key, type or bound (the space is sampled once), or on a
    categorical choice the model refuses in every combination with the space's other categorical
    choices (the rest at ``base``): e.g. ``model.personalize: [deltas, input]`` with
    ``model.head=ordinal``. The error names ``search.space.<key>``."""
    suggest(quiet_study(optuna.samplers.RandomSampler(seed=0)).ask(), space, base)
    categorical = {k: list(v["choices"]) for k, v in space.items() if v.get("type") == "categorical"}
    for key, choices in categorical.items():
        others = {k: c for k, c in categorical.items() if k != key}
        for choice in choices:
            reasons = (
                _refusal(rubric, setting_of({key: choice, **dict(zip(others, combination))}, base))
                for combination in itertools.product(*others.values())
            )
            first = next(reasons)
            if first and all(reasons):  # stops at the first combination the model accepts
                raise InputError(
                    f"the model refuses {choice!r} whatever the other choices: {first}", setting=f"search.space.{key}"
                )


def _refusal(rubric: Rubric, setting: Setting) -> str | None:
    """Why the model refuses ``setting``, or None."""
    try:
        setting.build(rubric)
    except InputError as e:
        return str(e)
    return None


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per trial: number, state, value (mean held-out NLL), parameters and reported metrics."""
    return study.trials_dataframe(attrs=("number", "state", "value", "params", "user_attrs", "duration"))


def searched_setting(cfg: DictConfig) -> Setting:
    """The configuration a search starts from: ``search.family`` of ``model.*`` and ``trainer.*`` (the
    network by default; under ``model=auto`` its network candidate: the search tunes one family, not the
    choice among families)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    family = cfg.search.get("family", "network")
    if model.get("family") == "auto":
        log.info("search=optuna tunes %s: model.family=auto is not used by the search and its refit", family)
    return Setting({**model, "family": "network"}, OmegaConf.to_container(cfg.trainer, resolve=True), family)


def select_for_split(cfg: DictConfig, rubric: Rubric, split, run=None) -> Setting:
    """Search on one training split (``train.py search=optuna``); writes
    ``<run_dir>/search/<split>/selected.json`` and ``trials.csv`` and returns the selection."""
    base = searched_setting(cfg)
    tracker = Tracker.from_config(cfg) if run is not None else None
    setting, study = run_search(
        rubric, split.train, base, cfg.search, f"{cfg.name}-{split.name}", cfg.seed, tracker, run
    )
    out = Path(cfg.run_dir) / "search" / split.name
    best = study.best_trial
    write_json(
        {
            "family": setting.family,
            "params": setting.params,
            "model": setting.model,
            "trainer": setting.trainer,
            "trial": best.number,
            "nll": best.value,
            **best.user_attrs,
        },
        out / "selected.json",
    )
    write_table(trials_frame(study), out / "trials.csv")
    if run is not None:
        run.log_artifacts(out, f"search/{split.name}")
    log.info(
        "%s: selected trial %d of %d (inner-CV NLL %.4f): %s",
        split.name,
        best.number,
        len(study.trials),
        best.value,
        best.params,
    )
    return setting
