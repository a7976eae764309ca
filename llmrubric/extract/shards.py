"""Extraction in shards: a stable partition of the texts, and N submitit jobs (local or Slurm).

``shard_of`` puts each text in one of N shards by the sha256 of its id, so every run and machine
agrees. :func:`launch` runs one job per shard, each into its own cache beside the main one (one
writer per SQLite file, as a shared file system needs), then merges those caches into the main
cache; the caller's cached-only pass writes the outputs of a one-process run.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from llmrubric.config import conf_path, load_file
from llmrubric.extract.backends.base import Backend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.runner import Extraction, extract
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError, JobFailed
from llmrubric.io.rubric import Rubric

log = logging.getLogger(__name__)
COUNTS = ("cached", "computed")  # a shard job's, summed over the jobs
RUN_COUNTS = ("requests", "retries", "prompt_tokens", "output_tokens", "computed_tokens")


def shard_of(text_id: str, n: int) -> int:
    """The shard (0 … n-1) of a text: its id's sha256 mod ``n``."""
    return int.from_bytes(hashlib.sha256(str(text_id).encode()).digest()[:8], "big") % n


def parse_shard(value: str) -> tuple[int, int]:
    """``"K/N"`` → ``(K, N)`` with 0 ≤ K < N."""
    k, _, n = str(value).partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        k = n = -1
    if not 0 <= k < n:
        raise InputError(f"expected K/N with 0 <= K < N (shard K of N, e.g. 0/4), not {value!r}", setting="--shard")
    return k, n


def shard_cache(cache: Path, k: int, n: int) -> Path:
    """The cache of shard ``k`` of ``n`` beside the main cache ``cache``."""
    return cache.with_name(f"{cache.stem}.shard-{k}-of-{n}{cache.suffix}")


def launcher_settings(name: str, overrides: Sequence[str] = ()) -> dict:
    """A launcher config: ``local`` or ``slurm`` (``conf/extract/launcher/``) or a YAML file, with Hydra overrides."""
    shipped = conf_path("extract", "launcher", f"{name}.yaml")
    return load_file(shipped if shipped.is_file() else name, list(overrides), "launcher config")


class CachedModel(Backend):
    """The model the shard jobs ran, known by its id: computes nothing (for the cached-only pass)."""

    def __init__(self, model_id: str):
        self._model_id = model_id

    @property
    def model_id(self) -> str:
        return self._model_id

    def score(self, tasks: Sequence[Task]) -> Iterator[Result]:
        if tasks:
            raise RuntimeError("CachedModel scores nothing")
        return iter(())


def run_shard(settings: dict, tasks: list[Task], cache: str, source: str) -> dict:
    """One shard job: its tasks into its own cache. Returns the model id and the run's counts."""
    from llmrubric.extract.backends import make_backend_from

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend = make_backend_from(settings)
    store = ResultCache(cache)
    try:
        summary = extract(tasks, backend, store, source, progress=False).summary
    finally:
        store.close()
        backend.close()
    run = summary["this_run"]
    return {
        "model_id": backend.model_id,
        **{key: summary[key] for key in COUNTS},
        "this_run": {**{key: run.get(key, 0) for key in RUN_COUNTS}, "answers": run["answers"]},
    }


def launch(
    tasks: Sequence[Task],
    skipped: Sequence[dict],
    rubric: Rubric | None,
    settings: dict,
    source: str,
    cache: Path,
    jobs_dir: Path,
    launcher: dict,
    detector=None,
) -> Extraction:
    """Extract ``tasks`` in ``settings["shards"]`` submitit jobs and return what a one-process
    run would (the counts summed over the jobs). A failed job: :class:`JobFailed` naming it and its
    log, after the finished shards' results are merged (a rerun computes only the rest). The
    ``detector`` (:mod:`llmrubric.extract.injection`) marks blocks in the final pass, as in one process."""
    try:
        import submitit
    except ImportError as e:
        raise InputError("--shards needs submitit (pip install -e '.[scale]')", setting="--launcher") from e
    n = int(settings["shards"])
    if n < 1:
        raise InputError(f"must be at least 1, not {n}", setting="--shards")
    parts = {k: [t for t in tasks if shard_of(t.text_id, n) == k] for k in range(n)}
    parts = {k: part for k, part in parts.items() if part}
    executor = _executor(submitit, jobs_dir, launcher)
    main = ResultCache(cache)
    try:
        for leftover in sorted(cache.parent.glob(f"{cache.stem}.shard-*-of-*{cache.suffix}")):
            _merge_and_remove(main, leftover)  # an interrupted launch's shards
        for k in parts:
            with contextlib.closing(ResultCache(shard_cache(cache, k, n))) as store:
                store.merge(cache, keep=lambda text_id, k=k: shard_of(text_id, n) == k)
        jobs = _submit(executor, parts, settings, source, cache)
        outcomes = _wait(jobs, float(launcher.get("poll_seconds") or 1), not settings.get("no_progress"))
        for k in parts:
            _merge_and_remove(main, shard_cache(cache, k, n))
        failed = {k: o for k, o in outcomes.items() if isinstance(o, str)}
        if failed:
            raise JobFailed(
                f"{len(failed)} of {len(jobs)} shard jobs failed: "
                + "; ".join(f"shard {k}/{n}: {why}" for k, why in failed.items())
                + f"; the other shards' results are in {cache}: run again to compute the rest"
            )
        model_ids = {o["model_id"] for o in outcomes.values()}
        if len(model_ids) != 1:
            raise JobFailed(f"the shard jobs ran different models (set device and dtype): {sorted(model_ids)}")
        result = extract(
            tasks,
            CachedModel(model_ids.pop()),
            main,
            source,
            skipped,
            rubric,
            progress=False,
            min_label_mass=float(settings["min_label_mass"]),
            compute=False,
            detector=detector,
        )
    finally:
        main.close()
    result.summary.update({key: sum(o[key] for o in outcomes.values()) for key in COUNTS})
    runs = [o["this_run"] for o in outcomes.values()]
    answers = sum((Counter(run["answers"]) for run in runs), Counter())
    result.summary["this_run"] = {
        **{key: sum(run[key] for run in runs) for key in RUN_COUNTS},
        "answers": dict(answers),
    }
    return result


def _merge_and_remove(main: ResultCache, path: Path) -> None:
    if path.exists():
        main.merge(path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _executor(submitit, jobs_dir: Path, launcher: dict):
    """The submitit executor of the launcher config (checked before any work)."""
    params = {k: v for k, v in launcher.items() if k not in ("cluster", "poll_seconds") and v is not None}
    try:
        executor = submitit.AutoExecutor(folder=jobs_dir, cluster=launcher.get("cluster"))
        executor.update_parameters(name="llmrubric-extract", **params)
    except (ValueError, NameError, RuntimeError) as e:  # an unknown cluster or key; no srun for slurm
        raise InputError(" ".join(str(e).split()), setting="--launcher") from None
    return executor


def _submit(executor, parts: dict, settings: dict, source: str, cache: Path) -> dict:
    """One job per non-empty shard, as one batch (a Slurm job array)."""
    model = Path(str(settings["model"]))
    job_settings = {**settings, "model": str(model.resolve()) if model.exists() else str(model)}
    n = int(settings["shards"])
    try:
        with executor.batch():
            pending = {
                k: executor.submit(run_shard, job_settings, part, str(shard_cache(cache, k, n).resolve()), source)
                for k, part in parts.items()
            }
    except Exception as e:  # the scheduler refused the batch (no sbatch, a bad partition, …)
        raise JobFailed(f"cannot submit the shard jobs: {' '.join(str(e).split())[:500]}") from e
    return pending


def _wait(jobs: dict, poll: float, progress: bool) -> dict:
    """Wait for every job: shard → its counts, or a one-line reason naming its log."""
    pending = dict(jobs)
    try:
        with tqdm(total=len(jobs), desc="shard jobs", unit="job", disable=not progress, dynamic_ncols=True) as bar:
            while pending:
                for k in [k for k, job in pending.items() if job.done()]:
                    del pending[k]
                    bar.update(1)
                if pending:
                    time.sleep(poll)
    except KeyboardInterrupt:
        for job in pending.values():
            job.cancel(check=False)
        raise
    outcomes = {}
    for k, job in jobs.items():
        try:
            outcomes[k] = job.result()
        except Exception as e:  # whatever ended the job: its error, a kill, a timeout
            outcomes[k] = f"{_why(e)} (job {job.job_id}, log {job.paths.stderr})"
    return outcomes


def _why(error: Exception) -> str:
    """What ended a job, in one line: the last line of its traceback, or that it left no result."""
    text = str(error)
    sections = text.split("-" * 22 + "\n")
    if len(sections) >= 3:  # submitit's FailedJobError: the job's traceback between two rules
        text = sections[1]
    else:
        state = re.search(r"has not produced any output \(state: ([^)]*)\)", text)
        if state:
            return f"the job ended without a result (state {state.group(1)}: killed, out of time or of memory?)"
    lines = [line for line in text.splitlines() if line.strip()] or [type(error).__name__]
    return " ".join(lines[-1].split())[:300]
