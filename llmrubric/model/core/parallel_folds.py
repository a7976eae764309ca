"""``model=auto``'s inner-CV fits, in this process or spread over a pool of worker processes
(``model.auto.workers``).

The tables to fit on (the inner folds' training tables, then all the training data for the refit that a family with
``joint_fit``, the network, trains with its folds as one program) are cut into one contiguous share per worker. Each
worker fits every candidate's models of its share: the network's program on those tables (a smaller program of the
same members: its members train independently, so a share's results equal the whole program's,
``tests/test_stacked.py``), then the other candidates' fold models, reading each table's encoding once, as one
process does. This process is the last share's worker: it fits that share (the heaviest: the refit on all the data)
while the pool's workers start (a forkserver imports the package first, seconds in which one core would idle). The
other candidates' refits on all the data, which would follow the weights (:meth:`FoldFits.add_refit`), are taken one
by one by the workers done with their shares (a shared claim per refit; one that ends with no weight is fitted in
time the worker would idle). The fitted models come back to this process, which does everything after: a worker's
share as soon as it is fitted, its refits apart, so that this process reads the fold models (their held-out
predictions and levels) while the workers fit refits; the refits no worker has taken by then follow the weights.

:func:`pool_workers` decides how many workers run: one (this process, no pool) when ``model.auto.workers`` is 1,
when this process is itself a worker of a process pool (``benchmarks/robustness.py --workers 2``,
``experiments/variants.py``: nested pools would oversubscribe the cores) or when the training data have fewer than
:data:`MIN_WORK` annotation rows × candidates. Below that a pool does not pay: starting it (a forkserver that imports
the package, 3-5 s, once per process) and what one process shares and two do not (a network program split in two
costs more CPU than one, up to twice on small data; each worker and then the parent encode their tables) cost more
than the second core saves. Measured wall seconds of the shipped fit on 2 idle cores, pool against none (this
process fitting the last share while the worker starts): DS1..DS5 of the LLM-Rubric release at 30 % of its texts
(7,850) 23.7 against 24.0 s, at 50 % (13,495) 26.5 against 25.5 s, whole (26,680) 36.7 against 48.0 s; DialSumm at
70 % of its texts (58,800) 110-120 s against 178 s (``benchmarks/results/train_cost.json``). The threshold sits
between the even 13,495 and the 23 % saved at 26,680.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from llmrubric.io.errors import NotApplicableError
from llmrubric.io.tables import Tables
from llmrubric.model.core.accelerator import needs_fabric
from llmrubric.model.core.memo import one_encoding
from llmrubric.model.core.registry import fit_questions
from llmrubric.model.core.threads import one_thread, single_threaded

MIN_WORK = 20_000  # annotation rows × candidates from which a pool of workers pays (module doc: measured)
# imported once by the forkserver, not by each worker's first fit; torch's optimizers import torch._dynamo when the
# first one is built (0.7 s), which every fit's new worker would pay again
PRELOAD = ["llmrubric.model", "torch._dynamo"]
_WORKER: dict = {}  # a worker process's tables and main question id (set by :func:`_start`)


def pool_workers(setting: int, annotations: int, candidates: int) -> int:
    """The workers to run: ``setting`` (``model.auto.workers``) capped by the CPUs this process may use, or 1 in a
    worker of another process pool or where ``annotations`` rows × ``candidates`` < :data:`MIN_WORK` (module doc)."""
    if setting <= 1 or multiprocessing.parent_process() is not None or annotations * candidates < MIN_WORK:
        return 1
    return max(1, min(setting, _cpus()))


def start_early(setting: int, annotations: int, candidates: int, wait: bool = False) -> bool:
    """Start now the forkserver of the pool :func:`pool_workers` would run on these data (it imports the package:
    seconds, once per process), so that it imports while this process does other work (``wait``: return once a
    worker has started from it); False (nothing started) where no pool would run."""
    if pool_workers(setting, annotations, candidates) < 2 or _start_method() != "forkserver":
        return False
    context = multiprocessing.get_context("forkserver")
    _preload(context)
    from multiprocessing import forkserver

    with _without_main():  # the forkserver, and workers forked from it, would run the caller's script
        forkserver.ensure_running()
        if wait:
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                pool.submit(os.getpid).result()
    return True


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _preload(context) -> None:
    """The modules the forkserver imports once (the package, and Lightning Fabric where training needs it)."""
    context.set_forkserver_preload(PRELOAD + (["lightning_fabric"] if needs_fabric("auto") else []))


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
    candidate fitted when its result is asked for) or over a pool (every job submitted at the first :meth:`result`).
    Use it as a context manager: leaving it shuts the pool down.

    Over ``n`` workers the tables are cut into ``n`` contiguous shares (the last holds the refit on all the data),
    and each worker fits every candidate on its share: the network's program on those tables first, then the other
    candidates' fold models, so that a worker encodes each of its tables once, as one process does. This process is
    the last share's worker (``n - 1`` in the pool). On 2 workers and 5 inner folds the pool's worker takes folds
    0-2, this process folds 3-4 and the network's refit (its heavier network program balances the pool's later
    start and the other candidates' third fold)."""

    def __init__(self, tables: list[Tables], main_id: str, workers: int):
        self.tables, self.main_id, self.workers = tables, main_id, workers
        self.shares = [list(map(int, s)) for s in np.array_split(np.arange(len(tables)), min(workers, len(tables)))]
        self.jobs: dict[str, list[Job]] = {}  # each candidate's: one per share it has tables in, in their order
        self.futures: list[Future] = []  # each share's outcomes but the last's, candidate name → Outcome
        self.refit_futures: list[Future] = []  # each worker's refits (name → Outcome), done after its share
        self.own: dict[str, Outcome] = {}  # the last share's, fitted in this process
        self.refits: dict[str, object] = {}  # unfitted models to fit on all the data (the last table) early
        self.claims = None  # a shared flag per refit: taken by a worker done with its share, or withdrawn
        self.pool: ProcessPoolExecutor | None = None
        self.worker_cpu_seconds = 0.0  # the CPU seconds of the jobs the pool's workers ran (their start not included)

    def add(self, name: str, models: list, tables: list[int], judges=None) -> None:
        """Candidate ``name``'s ``models`` to fit on the tables numbered ``tables``, jointly with ``judges``."""
        if self.workers == 1:
            self.jobs[name] = [Job(name, models, tables, judges)]
            return
        mine = [[i for i, t in enumerate(tables) if t in share] for share in self.shares]
        self.jobs[name] = [Job(name, [models[i] for i in m], [tables[i] for i in m], judges) for m in mine if m]

    def add_refit(self, name: str, model) -> None:
        """Candidate ``name``'s ``model`` to fit on all the data (every question) before the weights are known, by a
        worker that would otherwise wait; the caller fits what :meth:`collect_refits` does not return."""
        self.refits[name] = model

    def result(self, name: str) -> Outcome:
        """Candidate ``name``'s fitted models (in the order added) or the error that left it out, and the seconds its
        fits took (summed over its jobs; their CPU seconds in a worker are added to :attr:`worker_cpu_seconds`)."""
        if self.pool is None and self.workers > 1:
            self._submit()
        if self.pool is None:
            outcomes = [job.run(self.tables, self.main_id) for job in self.jobs[name]]
        else:
            outcomes = [future.result()[name] for future in self.futures if name in future.result()]
            self.worker_cpu_seconds += sum(o.cpu_seconds for o in outcomes)
            outcomes += [self.own[name]] if name in self.own else []  # the last share: its tables come last
        error = next((o.error for o in outcomes if o.error is not None), None)
        models = None if error is not None else [m for o in outcomes for m in o.models]
        return Outcome(models, error, sum(o.seconds for o in outcomes), sum(o.cpu_seconds for o in outcomes))

    def _submit(self) -> None:
        """Each share's jobs but the last to one worker of a new pool, the joint programs first, then the last share
        in this process while they run (the pool's start, a forkserver importing the package, overlaps its fits);
        no pool (this process fits them all, :attr:`workers` 1) where a model's class is defined in the
        ``__main__`` script, which the workers do not run (:func:`_without_main`)."""
        jobs = [job for jobs in self.jobs.values() for job in jobs]
        if any(type(m).__module__ == "__main__" for job in jobs for m in job.models):
            self.workers = 1
            self.jobs = {name: [_joined(jobs)] for name, jobs in self.jobs.items()}
            return
        context = multiprocessing.get_context(_start_method())
        if context.get_start_method() == "forkserver":
            _preload(context)
        bundles = [
            sorted((j for j in jobs if j.tables[0] in share), key=lambda j: j.judges is None) for share in self.shares
        ]
        self.claims = context.Array("b", max(1, len(self.refits)))  # with a lock; workers inherit it at their start
        refits = list(enumerate(self.refits.items()))
        with ThreadPoolExecutor(1) as starter:  # starting a worker waits for the forkserver's import: not this one
            started = starter.submit(self._start_pool, context, [(bundle, refits) for bundle in bundles[:-1]])
            try:
                with one_thread(blas=True):  # one core, as each worker
                    self.own = {job.name: job.run(self.tables, self.main_id) for job in bundles[-1]}
            finally:
                started.result()

    def collect_refits(self) -> dict[str, object]:
        """The refits of :meth:`add_refit` the workers fitted, in the order added: what the caller need not fit
        again. Those no worker has taken yet are withdrawn (the caller fits them after the weights, only those that
        have weight), and the ones a worker is fitting are waited for."""
        if self.claims is None:
            return {}
        for i in range(len(self.refits)):
            _claim(self.claims, i)
        fitted = {}
        for future in self.refit_futures:
            for name, outcome in future.result().items():
                self.worker_cpu_seconds += outcome.cpu_seconds
                if outcome.models is not None:
                    fitted[name] = outcome.models[0]
        self.refit_futures = []
        return {name: fitted[name] for name in self.refits if name in fitted}

    def _start_pool(self, context, bundles: list[tuple]) -> None:
        """A pool of one worker for each of ``bundles`` (its share's jobs, the refits it may take), each given its
        share, then the refits (a worker takes the next task once done with its share)."""
        self.pool = ProcessPoolExecutor(
            len(bundles), mp_context=context, initializer=_start, initargs=(self.tables, self.main_id, self.claims)
        )
        with _without_main():  # the workers start at the first submission
            self.futures = [self.pool.submit(_run_share, jobs) for jobs, _ in bundles]
            self.refit_futures = [self.pool.submit(_run_refits, refits) for _, refits in bundles]

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


def _start(tables: list[Tables], main_id: str, claims) -> None:
    """A worker's start: one thread for torch and BLAS, the tables kept for its jobs, which share one memo of
    their encodings for the worker's life (:func:`~llmrubric.model.core.memo.one_encoding`) as in one process, and
    the refits' claims."""
    single_threaded()
    scope = one_encoding()
    scope.__enter__()
    _WORKER.update(tables=tables, main_id=main_id, scope=scope, claims=claims)


def _run_share(jobs: list[Job]) -> dict[str, Outcome]:
    """A worker's share: each candidate's outcome on it."""
    return {job.name: job.run(_WORKER["tables"], _WORKER["main_id"]) for job in jobs}


def _run_refits(refits: list[tuple[int, tuple[str, object]]]) -> dict[str, Outcome]:
    """Each refit no other process has taken, fitted on all the data (the last table)."""
    return {name: _refit(model, _WORKER["tables"][-1]) for i, (name, model) in refits if _claim(_WORKER["claims"], i)}


def _claim(claims, i: int) -> bool:
    """Whether this process takes refit ``i`` (no other has)."""
    with claims.get_lock():
        if claims[i]:
            return False
        claims[i] = 1
        return True


def _refit(model, tables: Tables) -> Outcome:
    """``model`` fitted on ``tables``, every question; models None where it fails (fitted again after the weights,
    where its error stops the run if it has weight)."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        models = [fit_questions(model, tables)]
    except Exception:  # noqa: BLE001 -- not a value: the refit after the weights raises it again
        models = None
    return Outcome(models, None, time.perf_counter() - start, time.process_time() - cpu)


def _joined(jobs: list[Job]) -> Job:
    """One candidate's jobs of every share as one job (one program where the family fits jointly)."""
    return Job(jobs[0].name, [m for j in jobs for m in j.models], [t for j in jobs for t in j.tables], jobs[0].judges)
