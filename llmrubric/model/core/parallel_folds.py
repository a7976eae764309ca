"""``model=auto``'s inner-CV fits, in this process or spread over a pool of worker processes
(``model.auto.workers``).

Each candidate's fold models are one or more jobs. A family with ``joint_fit`` (the network) trains its fold models
and its refit on all the data as one training program; over ``n`` workers its calibrators are split into ``n``
contiguous groups, each group one program in its own worker (the members of a stacked program train independently:
a group's results equal the whole program's, ``tests/test_stacked.py``). Every other candidate's fold models are one
job each. The jobs go to the pool longest first (the network's groups, then the others by training rows), so both
cores stay busy; the fitted models come back to the parent, which does everything after.

:func:`pool_workers` decides how many workers run: one (this process, no pool) when ``model.auto.workers`` is 1,
when this process is itself a worker of a process pool (``benchmarks/robustness.py --workers 2``,
``experiments/variants.py``: nested pools would oversubscribe the cores) or when the data are too small for a pool to
pay: starting the workers (a forkserver that imports the package once, about 6 s of CPU) and sending them the
tables cost more than the fits save below :data:`MIN_WORK` annotation rows × candidates.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from llmrubric.io.errors import NotApplicableError
from llmrubric.io.tables import Tables
from llmrubric.model.core.memo import one_encoding
from llmrubric.model.core.registry import fit_questions
from llmrubric.model.core.threads import single_threaded

MIN_WORK = 60_000  # annotation rows × candidates from which a pool of workers pays (module doc; measured)
_WORKER: dict = {}  # a worker process's tables and main question id (set by :func:`_start`)


def pool_workers(setting: int, annotations: int, candidates: int) -> int:
    """The workers to run: ``setting`` (``model.auto.workers``) capped by the CPUs this process may use, or 1 in a
    worker of another process pool or where ``annotations`` rows × ``candidates`` < :data:`MIN_WORK` (module doc)."""
    if setting <= 1 or multiprocessing.parent_process() is not None or annotations * candidates < MIN_WORK:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(setting, cpus))


@dataclass
class Outcome:
    """A job's fitted models (None where the family declared the data unfit: ``error``), its wall seconds and the
    CPU seconds of the process that ran it."""

    models: list | None
    error: NotApplicableError | None
    seconds: float
    cpu_seconds: float


@dataclass
class Job:
    """Fold models of one candidate to fit: ``models`` on the tables numbered ``tables`` (in :class:`FoldFits`'
    list), as one program with the judge map ``judges`` (a ``joint_fit`` family) or one by one on the main
    question (``judges`` None)."""

    name: str
    models: list
    tables: list[int]
    judges: object = None
    rows: int = 0  # the training rows (annotations) of its tables: the job's size when ordering

    def run(self, tables: list[Tables], main_id: str) -> Outcome:
        """The fitted models, or the error where the family declares the data unfit."""
        start, cpu = time.perf_counter(), time.process_time()
        data = [tables[i] for i in self.tables]
        try:
            with one_encoding():
                if self.judges is not None:
                    models = self.models[0].fit_many(self.models, data, self.judges)
                else:
                    models = [fit_questions(m, t, [main_id]) for m, t in zip(self.models, data)]
        except NotApplicableError as e:
            return Outcome(None, e, time.perf_counter() - start, time.process_time() - cpu)
        return Outcome(models, None, time.perf_counter() - start, time.process_time() - cpu)


class FoldFits:
    """The fits of every candidate's fold models on ``tables`` (the inner folds' training tables, then all the
    training data): :meth:`add` each candidate, then :meth:`result` of each, in this process (``workers`` 1: each
    candidate fitted when its result is asked for) or over a pool (its jobs submitted at the first :meth:`result`).
    Use it as a context manager: leaving it shuts the pool down."""

    def __init__(self, tables: list[Tables], main_id: str, workers: int):
        self.tables, self.main_id, self.workers = tables, main_id, workers
        self.jobs: dict[str, list[Job]] = {}
        self.futures: dict[str, list[Future]] = {}  # each candidate's, in the order of its jobs
        self.pool: ProcessPoolExecutor | None = None
        self.worker_cpu_seconds = 0.0  # the CPU seconds of the jobs the workers ran (their start not included)

    def add(self, name: str, models: list, tables: list[int], judges=None) -> None:
        """Candidate ``name``'s ``models`` to fit on the tables numbered ``tables``, jointly with ``judges``."""
        rows = [len(self.tables[i].annotations) for i in tables]
        if self.workers == 1:
            self.jobs[name] = [Job(name, models, tables, judges, sum(rows))]
        elif judges is not None:
            groups = np.array_split(np.arange(len(models)), min(self.workers, len(models)))
            self.jobs[name] = [
                Job(name, [models[i] for i in g], [tables[i] for i in g], judges, sum(rows[i] for i in g))
                for g in groups
            ]
        else:
            self.jobs[name] = [Job(name, [m], [t], None, r) for m, t, r in zip(models, tables, rows)]

    def result(self, name: str) -> Outcome:
        """Candidate ``name``'s fitted models (in the order added) or the error that left it out, and the seconds its
        fits took (summed over its jobs; their CPU seconds in a worker are added to :attr:`worker_cpu_seconds`)."""
        if self.pool is None and self.workers > 1:
            self._submit()
        if self.pool is None:
            outcomes = [job.run(self.tables, self.main_id) for job in self.jobs[name]]
        else:
            outcomes = [future.result() for future in self.futures[name]]
            self.worker_cpu_seconds += sum(o.cpu_seconds for o in outcomes)
        error = next((o.error for o in outcomes if o.error is not None), None)
        models = None if error is not None else [m for o in outcomes for m in o.models]
        return Outcome(models, error, sum(o.seconds for o in outcomes), sum(o.cpu_seconds for o in outcomes))

    def _submit(self) -> None:
        """Every job to a new pool, the joint programs first, then the others by training rows, largest first; none
        (this process fits them, :attr:`workers` 1) where a model's class is defined in the ``__main__`` script,
        which the workers do not run (:func:`_without_main`)."""
        jobs = sorted((job for jobs in self.jobs.values() for job in jobs), key=lambda j: (j.judges is None, -j.rows))
        if any(type(m).__module__ == "__main__" for job in jobs for m in job.models):
            self.workers = 1
            return
        context = multiprocessing.get_context(_start_method())
        if context.get_start_method() == "forkserver":
            context.set_forkserver_preload(["llmrubric.model"])
        self.pool = ProcessPoolExecutor(
            self.workers, mp_context=context, initializer=_start, initargs=(self.tables, self.main_id)
        )
        with _without_main():  # the workers start at the first job
            submitted = {id(job): self.pool.submit(_run, job) for job in jobs}
        self.futures = {name: [submitted[id(job)] for job in jobs] for name, jobs in self.jobs.items()}

    def __enter__(self) -> FoldFits:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


@contextmanager
def _without_main():
    """The ``__main__`` module anonymous while inside: workers started then do not run the caller's script again
    (as spawned workers do, so that an unguarded script would fit again in each); their jobs need only the package."""
    main = sys.modules["__main__"]
    saved = {key: main.__dict__.pop(key) for key in ("__file__", "__spec__") if key in main.__dict__}
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _start_method() -> str:
    """``forkserver`` where the platform has it (the package imported once, each worker forked from that clean
    process), else ``spawn``: never ``fork`` of a process whose torch may already run threads."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _start(tables: list[Tables], main_id: str) -> None:
    """A worker's start: one thread for torch and BLAS, the tables kept for its jobs, which share one memo of
    their encodings for the worker's life (:func:`~llmrubric.model.core.memo.one_encoding`) as in one process."""
    single_threaded()
    scope = one_encoding()
    scope.__enter__()
    _WORKER.update(tables=tables, main_id=main_id, scope=scope)


def _run(job: Job):
    return job.run(_WORKER["tables"], _WORKER["main_id"])
