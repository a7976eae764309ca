"""MLflow tracking of train, evaluate and search runs (config group ``logger``).

The store is local and embedded by default: ``sqlite:///<cwd>/mlruns.db`` (the project
root, where ``train.py`` runs), artifacts in ``mlartifacts/`` beside the database.
``logger.tracking_uri`` overrides it, else the ``MLFLOW_TRACKING_URI`` environment variable.
With ``logger=none`` every call is a no-op: mlflow is not imported and nothing is written.

    tracker = Tracker.from_config(cfg)
    with tracker.run("train", tags={"job": "train"}) as run:
        run.log_config(cfg)                       # params, config.yaml, git_commit, data_sha256
        run.log_metrics({"val/nll": 1.02})
        run.log_history(calibrator, "fold0")      # per-epoch train/loss, val/nll
        run.log_artifact("outputs/demo/fold0.safetensors", "checkpoints")

Nested runs (Optuna trials under their study's run)::

    with tracker.run("study") as study:
        for ...:
            with tracker.run(f"trial {n}", nested=True) as trial:   # parent: the study's run
                ...

``nested=True`` makes the run a child (tag ``mlflow.parentRunId``) of ``parent`` (a
:class:`Run` or a run id, e.g. passed to a worker process), else of the innermost open run
of this thread, else of the innermost open run of the main thread (trials in Optuna's
``n_jobs`` threads), all on the same store; with no such run it starts a top-level run.
``train.py`` and ``evaluate.py`` open their runs with ``nested=True``, so calling their
``main(cfg)`` inside a trial's run nests them under the trial.

With a tracking server (``http(s)://`` URI) that stops answering during a run, the run goes
on: each call that fails, and every later one, is dropped, and when the outermost run ends
one warning lists what was not logged (the results are in the run directory regardless).
A server that cannot be reached when the first run starts is an error before any work.

Metric keys are namespaced ``train/``, ``val/``, ``test/``; qualifiers follow the metric
name (``val/nll/fold0``, ``train/loss/fold0/pretrain``). A run that raises ends FAILED
(tag ``error``), Ctrl-C ends it KILLED, an ``optuna.TrialPruned`` ends it KILLED with tag
``pruned``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)
DB_FILE = "mlruns.db"
ARTIFACTS_DIR = "mlartifacts"
DATA_KEYS = ("annotations", "features", "texts")
MAX_PARAM_CHARS = 6000  # mlflow's limit on a parameter value

_lock = threading.Lock()
_stacks: dict[int, list[Run]] = {}  # open runs per thread id, innermost last


@dataclass
class _Store:
    """A tracking store as this process sees it (shared by its trackers): open runs, and for a
    server that stopped answering, why, and what was not logged since."""

    open: int = 0
    lost: str | None = None
    dropped: list[str] = field(default_factory=list)


_stores: dict[str, _Store] = {}


class TrackingError(RuntimeError):
    """The tracking store cannot be used (names the store and how to turn tracking off)."""


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the SQLite file ``mlruns.db`` in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / DB_FILE}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores and in-memory SQLite)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path).resolve() if path and path != ":memory:" else None


@functools.cache
def git_commit() -> str:
    """``git rev-parse HEAD`` of the code's repository, ``unknown`` outside one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


@functools.cache
def _file_sha256(path: str, size: int, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_files(cfg: DictConfig) -> list[Path]:
    """Existing data files the config points at: ``data.{train,test}.{annotations,features,texts}``,
    and the release files of an LLM-Rubric ``root``/``split`` loader."""
    files: list[Path] = []
    data = cfg.get("data")
    for part in ("train", "test"):
        node = data.get(part) if data is not None else None
        if node is None:
            continue
        node = OmegaConf.to_container(node, resolve=True)
        candidates = [Path(node[k]) for k in DATA_KEYS if isinstance(node.get(k), str)]
        if node.get("_target_") == "llmrubric.data.llm_rubric.load" and node.get("root"):
            from llmrubric.data.llm_rubric import FILES

            candidates += [Path(node["root"]) / f for f in FILES.get(node.get("split"), ())]
        for path in candidates:
            if path.is_file() and path.resolve() not in files:
                files.append(path.resolve())
    return files


def data_sha256(cfg: DictConfig) -> str:
    """SHA-256 over the contents of :func:`data_files`, in config order (``none`` without files)."""
    files = data_files(cfg)
    if not files:
        return "none"
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(_file_sha256(str(path), stat.st_size, stat.st_mtime).encode())
    return digest.hexdigest()


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """``{"a.b": "value"}`` from nested dicts; lists become compact JSON, cut at mlflow's limit."""
    if isinstance(config, Mapping):
        out: dict[str, str] = {}
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    value = config if isinstance(config, str) else json.dumps(config, separators=(",", ":"), default=str)
    if len(value) > MAX_PARAM_CHARS:
        value = value[: MAX_PARAM_CHARS - 1] + "…"
    return {prefix[:-1]: value}


def metric_keys(values: Mapping, prefix: str, suffix: str | None = None) -> dict[str, float]:
    """Numbers of a nested mapping as ``prefix/key[/subkey][/suffix]`` metric keys (others dropped):
    ``metric_keys({"rmse": 0.6, "per_judge": {"rmse": 0.5}}, "test", "ridge")`` →
    ``{"test/rmse/ridge": 0.6, "test/per_judge/rmse/ridge": 0.5}``; characters MLflow refuses in a key
    (a rater's e-mail address as a judge id: ``@``) become ``_``."""
    out = {}
    for key, value in values.items():
        key = re.sub(r"[^\w\-. /]", "_", str(key))
        if isinstance(value, Mapping):
            out.update(metric_keys(value, f"{prefix}/{key}", suffix))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out["/".join(filter(None, (prefix, str(key), suffix)))] = float(value)
    return out


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


class Tracker:
    """Opens runs in one MLflow experiment of one store; disabled, every call is a no-op."""

    def __init__(self, experiment: str = "llmrubric", tracking_uri: str | None = None, enabled: bool = True):
        self.enabled = enabled
        self.experiment = experiment
        self.tracking_uri = (tracking_uri or default_tracking_uri()) if enabled else None
        self.remote = bool(self.tracking_uri) and self.tracking_uri.startswith(("http://", "https://"))
        self.store = _stores.setdefault(self.tracking_uri, _Store()) if enabled else None

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Tracker:
        """From the ``logger`` group (``enabled``, ``experiment``, ``tracking_uri``); off without one."""
        logger = cfg.get("logger")
        if logger is None or not logger.get("enabled", False):
            return cls(enabled=False)
        return cls(str(logger.get("experiment") or "llmrubric"), logger.get("tracking_uri"), True)

    def __repr__(self) -> str:
        return f"Tracker({self.experiment!r}, {self.tracking_uri!r})" if self.enabled else "Tracker(disabled)"

    @property
    def client(self):
        return _client(self.tracking_uri)

    def experiment_id(self) -> str:
        """The experiment's id, created on first use (artifacts beside a SQLite store)."""
        return _experiment_id(self.tracking_uri, self.experiment)

    @contextmanager
    def run(
        self,
        name: str,
        nested: bool = False,
        tags: Mapping[str, Any] | None = None,
        parent: Run | str | None = None,
        start_time: float | None = None,
    ) -> Iterator[Run]:
        """Open a run named ``name`` for the ``with`` block (``start_time``: epoch seconds, default now);
        see the module docstring for nesting."""
        if not self.enabled:
            yield NullRun()
            return
        parent_id = self._parent_id(parent) if nested else None
        all_tags = {"git_commit": git_commit(), **{k: str(v) for k, v in (tags or {}).items()}}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run_id = None
        if self.store.lost is None:
            try:
                experiment_id = self.experiment_id()
                start_ms = int(start_time * 1000) if start_time is not None else None
                run_id = self.client.create_run(
                    experiment_id, start_time=start_ms, tags=all_tags, run_name=name
                ).info.run_id
            except Exception as e:
                if not (self.remote and self.store.open):
                    if isinstance(e, TrackingError):
                        raise
                    raise TrackingError(
                        f"cannot start an MLflow run in {self.tracking_uri}: {e} (logger=none turns tracking off)"
                    ) from e
                self.lose(e)
        run = Run(self, run_id, name)
        if run_id is None:
            self.store.dropped.append(f"run {name!r} (never created)")
        stack = _thread_stack()
        with _lock:
            stack.append(run)
            self.store.open += 1
        status = "FINISHED"
        try:
            yield run
        except BaseException as e:
            optuna = sys.modules.get("optuna")
            if optuna is not None and isinstance(e, optuna.TrialPruned):
                status = "KILLED"
                run.set_tags({"pruned": str(e) or "true"})
            elif isinstance(e, (KeyboardInterrupt, SystemExit)):
                status = "KILLED"
            else:
                status = "FAILED"
                run.set_tags({"error": f"{type(e).__name__}: {e}"[:5000]})
            raise
        finally:
            with _lock:
                stack.remove(run)
                self.store.open -= 1
                outermost = self.store.open == 0
            run.send(f"status {status}", lambda: self.client.set_terminated(run.id, status))
            if outermost and self.store.dropped:
                log.warning(
                    "MLflow server %s stopped answering (%s); not logged: %s. The results are in the run directory.",
                    self.tracking_uri,
                    self.store.lost,
                    "; ".join(self.store.dropped),
                )
                self.store.dropped = []

    def lose(self, error: BaseException) -> None:
        """The server stopped answering: every later call is dropped."""
        if self.store.lost is None:
            self.store.lost = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"

    def _parent_id(self, parent: Run | str | None) -> str | None:
        if parent is not None:
            return parent.id if isinstance(parent, (Run, NullRun)) else str(parent)
        for runs in (_thread_stack(), _thread_stack(threading.main_thread().ident)):
            with _lock:
                same_store = [r for r in runs if r.tracker.tracking_uri == self.tracking_uri]
            if same_store:
                return same_store[-1].id
        return None


class Run:
    """An open MLflow run: parameters, metrics, tags and artifacts."""

    def __init__(self, tracker: Tracker, run_id: str | None, name: str = ""):
        self.tracker, self.id, self.name = tracker, run_id, name

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    @property
    def client(self):
        return self.tracker.client

    def send(self, what: str, call) -> None:
        """Make one store call; on a tracking server that stopped answering (or had before), drop it and note ``what``."""
        if self.id is not None and self.tracker.store.lost is None:
            try:
                call()
                return
            except Exception as e:
                if not self.tracker.remote:
                    raise
                self.tracker.lose(e)
        if self.id is not None:
            self.tracker.store.dropped.append(f"{what} of run {self.name!r} ({self.id})")

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.send(
            f"tags {sorted(tags)}",
            lambda: self.client.log_batch(self.id, tags=[RunTag(k, str(v)) for k, v in tags.items()]),
        )

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Parameters (nested mappings flattened to ``a.b`` keys)."""
        from mlflow.entities import Param

        flat = flatten(dict(params))
        self.send(
            f"{len(flat)} params", lambda: self.client.log_batch(self.id, params=[Param(k, v) for k, v in flat.items()])
        )

    def log_config(self, cfg: DictConfig) -> None:
        """The resolved config: flattened params, ``config.yaml``, tags ``data_sha256`` and ``overrides``."""
        self.log_params(OmegaConf.to_container(cfg, resolve=True))
        self.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        tags = {"data_sha256": data_sha256(cfg)}
        try:
            from hydra.core.hydra_config import HydraConfig

            tags["overrides"] = " ".join(HydraConfig.get().overrides.task)
        except ValueError:
            pass
        self.set_tags(tags)

    def log_metrics(self, metrics: Mapping[str, float | None], step: int | None = None) -> None:
        """Metrics at ``step`` (default 0); None and NaN values are skipped."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if _finite(v)]
        if batch:
            self.send(f"metrics {[m.key for m in batch]}", lambda: self.client.log_batch(self.id, metrics=batch))

    def log_history(self, summaries: Any, split: str | None = None) -> None:
        """Per-epoch ``train/loss`` and ``val/nll`` of a fitted calibrator (or its ``summaries_``),
        stepped by epoch, as ``<metric>/<split>/<phase>[/m<member>]`` (member only in ensembles)."""
        from mlflow.entities import Metric

        summaries = getattr(summaries, "summaries_", summaries)
        now = int(time.time() * 1000)
        batch = []
        for member, summary in enumerate(summaries):
            for phase, result in summary.items():
                if not isinstance(result, dict):  # e.g. the member's fitted temperatures
                    continue
                suffix = "/".join(filter(None, (split, phase, f"m{member}" if len(summaries) > 1 else None)))
                for row in result.get("history") or []:
                    for key in ("train/loss", "val/nll"):
                        if _finite(row.get(key)):
                            batch.append(Metric(f"{key}/{suffix}", float(row[key]), now, int(row["epoch"])))
        if batch:
            self.send(
                f"history {sorted({m.key for m in batch})}", lambda: self.client.log_batch(self.id, metrics=batch)
            )

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a file into the run's artifacts (under ``artifact_path``)."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such file to log as an artifact")
        self.send(f"artifact {Path(path).name}", lambda: self.client.log_artifact(self.id, str(path), artifact_path))

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        """Copy a directory's contents into the run's artifacts."""
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"{directory}: no such directory to log as artifacts")
        self.send(
            f"artifacts of {directory}", lambda: self.client.log_artifacts(self.id, str(directory), artifact_path)
        )

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write ``text`` as the artifact ``artifact_file`` (e.g. ``config.yaml``)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            path.write_text(text)
            parent = str(Path(artifact_file).parent)
            self.send(
                f"artifact {artifact_file}",
                lambda: self.client.log_artifact(self.id, str(path), None if parent == "." else parent),
            )

    def log_dict(self, data: Mapping, artifact_file: str) -> None:
        """Write ``data`` as a JSON artifact (e.g. a selected configuration with its fold scores)."""
        self.log_text(json.dumps(data, indent=2, default=str), artifact_file)


class NullRun:
    """The run of a disabled tracker: every call does nothing."""

    id = None

    def __getattr__(self, name: str):
        if name.startswith("log_") or name == "set_tags":
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def _thread_stack(ident: int | None = None) -> list[Run]:
    with _lock:
        return _stacks.setdefault(threading.get_ident() if ident is None else ident, [])


@functools.cache
def _client(uri: str):
    try:
        from mlflow import MlflowClient

        path = sqlite_path(uri)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    except Exception as e:
        raise TrackingError(
            f"MLflow tracking store {uri} cannot be opened: {e} (logger=none turns tracking off)"
        ) from e
    return client


@functools.cache
def _experiment_id(uri: str, name: str) -> str:
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        path = sqlite_path(uri)
        location = (path.parent / ARTIFACTS_DIR).as_uri() if path is not None else None
        try:
            return client.create_experiment(name, artifact_location=location and f"{location}/{_safe(name)}")
        except MlflowException:
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise TrackingError(
            f"MLflow experiment {name!r} in {uri} is deleted; restore it (mlflow experiments restore) or set logger.experiment"
        )
    return experiment.experiment_id


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "experiment"
