"""Run tasks through a backend with the cache: skip what is done, store each result as it
arrives, and build the features table plus a record of everything that is not a feature."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from llmrubric.extract.answers import ANSWER_STATUSES
from llmrubric.extract.backends.base import Backend
from llmrubric.extract.cache import FINAL, ResultCache
from llmrubric.extract.injection import InjectionDetector
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import validate_features

log = logging.getLogger(__name__)
FAILURE_COLUMNS = ["text_id", "source", "question_id", "status", "reason"]
# a block of a mode without logprobs that is absent: no answer named an option, no valid distribution, no answer in time;
# a block of any mode on a server that went down (no endpoint answered for down_after seconds)
MODE_STATUSES = (*(s for s in ANSWER_STATUSES if s != "parsed"), "timeout", "server_down")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run: ``kept`` results of this run are in the cache, ``after`` of them answered after the
    signal (requests that were in flight), ``cache`` its path."""

    def __init__(self, kept: int, after: int, cache: str):
        super().__init__(f"{kept} results kept in {cache}, {after} of them answered after the signal")
        self.kept, self.after, self.cache = kept, after, cache


@dataclass
class Signal:
    """Whether and when Ctrl-C came during a run."""

    at: float | None = None


@contextmanager
def stop_on_interrupt(backend: Backend):
    """Ctrl-C (SIGINT) during the block: the ``backend`` sends no new request (:meth:`Backend.stop`; a local
    backend stops at once) and the results of those in flight still arrive; a second Ctrl-C stops at once.
    Yields the :class:`Signal`. Outside the main thread (no signal handler there) it changes nothing.

    Python runs a signal's handler in the main thread, when that thread next gets the interpreter: on a busy
    machine that can be after a request thread has sent one more request. So the signal is also written to a
    wakeup socket at delivery (:func:`signal.set_wakeup_fd`), which the backend's request threads read before each
    request (:meth:`Backend.watch`)."""
    got = Signal()
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    backend.watch(lambda: _delivered(reader, signal.SIGINT))

    def handler(signum, frame):
        if got.at is not None:
            raise KeyboardInterrupt
        got.at = time.monotonic()
        log.warning(
            "interrupted (Ctrl-C): no new request is sent; waiting for those in flight (Ctrl-C again: stop now)"
        )
        backend.stop()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(previous_fd)
        backend.watch(lambda: False)
        reader.close()
        writer.close()


def _delivered(reader: socket.socket, signum: int) -> bool:
    """Whether signal ``signum`` was written to the wakeup socket ``reader`` (peeked at: it stays there)."""
    try:
        return int(signum) in reader.recv(256, socket.MSG_PEEK)
    except OSError:  # nothing written yet (BlockingIOError), or the run is over
        return False


@dataclass
class Extraction:
    """``features``: canonical table; ``failures``: one row per block that is not in it
    (failed, incomplete, not_applicable, the statuses of the modes without logprobs) or carries a warning
    (unparsed_answers: a sampled block some of whose answers named no option; truncated; low_label_mass: the
    labels' total probability is below ``min_label_mass``; possible_injection: the injection
    detector matched the text; such a block stays in the features)."""

    features: pd.DataFrame
    failures: pd.DataFrame
    summary: dict = field(default_factory=dict)


def extract(
    tasks: Sequence[Task],
    backend: Backend,
    cache: ResultCache,
    source: str,
    skipped: Sequence[dict] = (),
    rubric: Rubric | None = None,
    progress: bool = True,
    min_label_mass: float = 0.0,
    compute: bool = True,
    detector: InjectionDetector | None = None,
) -> Extraction:
    """Score every task not already in ``cache`` (none with ``compute=False``: only what the
    cache holds, failed results with their reasons, the rest reported as ``no result``);
    return features of all tasks."""
    keys = [(t.template_hash, t.key, t.question_id) for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("two tasks have the same cache key (same prompt and question id)")
    model_id = backend.model_id
    results, todo = split_cached(tasks, cache, model_id, compute)
    cached = sum(r.status in FINAL for r in results.values())
    bar = tqdm(
        total=len(tasks),
        initial=cached,
        desc=f"extract {source}",
        unit="prompt",
        disable=not progress,
        dynamic_ncols=True,
    )
    usage = Usage()
    start = time.perf_counter()
    kept = after = 0
    try:
        with stop_on_interrupt(backend) as interrupt:
            for r in backend.score(todo if compute else []):
                if r.status == "interrupted" and not r.detail.get("requests"):
                    continue  # never asked: nothing to keep
                cache.put(model_id, r)
                results[(r.task.template_hash, r.task.key, r.task.question_id)] = r
                usage.add(r)
                kept, after = kept + 1, after + (interrupt.at is not None)
                bar.update(1)
    finally:
        bar.close()
    if interrupt.at is not None:
        raise Interrupted(kept, after, cache.path)
    llm_seconds = time.perf_counter() - start
    extraction = assemble(tasks, results, source, skipped, rubric, min_label_mass, detector)
    s = extraction.failures.status.value_counts() if len(extraction.failures) else {}
    extraction.summary = {
        "prompts": len(tasks),
        "cached": cached,
        "computed": len(todo) if compute else 0,
        "done": int(sum(r.status == "ok" for r in results.values())),
        "failed": int(s.get("failed", 0)),
        "incomplete": int(s.get("incomplete", 0)),
        "not_applicable": int(s.get("not_applicable", 0)),
        "truncated": int(s.get("truncated", 0)),
        "low_label_mass": int(s.get("low_label_mass", 0)),
        "possible_injection": int(s.get("possible_injection", 0)) if detector else None,
        **{status: int(s.get(status, 0)) for status in MODE_STATUSES},
        "unparsed_answers": int(s.get("unparsed_answers", 0)),
        **label_mass_quantiles(results.values()),
        **answer_counts(results.values()),
        **usage.counts(backend if compute else None),
        "llm_seconds": llm_seconds,
    }
    warn(extraction.summary, source, min_label_mass)
    log.info("extract %s: %s", source, ", ".join(f"{k} {v}" for k, v in extraction.summary.items()))
    return extraction


@dataclass
class Usage:
    """What a run computed: the requests, tokens and answers of its results (a result's ``detail`` counts a mode's
    requests and answers)."""

    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    computed_tokens: int = 0
    answers: Counter = field(default_factory=Counter)

    def add(self, r: Result) -> None:
        """``r``'s figures less those of the run that got its earlier answers (a resumed block)."""
        earlier = r.task.resume or {}
        self.requests += r.detail.get("requests", 1) - earlier.get("requests", 0)
        self.prompt_tokens += r.prompt_tokens - earlier.get("prompt_tokens", 0)
        self.output_tokens += r.detail.get("output_tokens", 0) - earlier.get("output_tokens", 0)
        self.computed_tokens += r.computed_tokens - earlier.get("prompt_tokens", 0)
        self.answers.update(r.detail.get("statuses", {}))
        self.answers.subtract(earlier.get("statuses", {}))

    def counts(self, backend: Backend | None) -> dict:
        """The summary's ``this_run``: ``requests``, ``prompt_tokens``, ``output_tokens``, ``computed_tokens`` and
        ``answers`` (per status) that this run asked for (a resumed block's earlier answers not again); a server
        backend's own count of requests, ``retries`` and output tokens replaces the first (retries and continuations
        included). A summary's other counts describe every block of the output, cached ones too (``llm_seconds``:
        this run's time)."""
        counts = {**asdict(self), "answers": {k: n for k, n in self.answers.items() if n}}
        stats = getattr(backend, "stats", None)
        if stats and "output_tokens" in stats:
            counts.update({k: stats[k] for k in ("requests", "retries", "output_tokens")})
        return {"this_run": counts}


def split_cached(
    tasks: Sequence[Task], cache: ResultCache, model_id: str, compute: bool = True
) -> tuple[dict[tuple, Result], list[Task]]:
    """(the results ``cache`` holds for ``tasks`` by their key, the tasks still to ask): a final result (``ok``,
    ``incomplete``) is kept, any other is asked again (:func:`again`); with ``compute=False`` every stored result
    is kept."""
    results: dict[tuple, Result] = {}
    todo = []
    for t in tasks:
        hit = cache.get(model_id, t)
        if hit is not None and (hit.status in FINAL or not compute):
            results[(t.template_hash, t.key, t.question_id)] = hit
        else:
            todo.append(again(t, hit))
    return results, todo


def again(task: Task, earlier: Result | None) -> Task:
    """The task a rerun asks for a block without a final result: resumed from its answers where a run was cut short
    (``partial``: Ctrl-C, a server down, a request that failed); the next ``attempt`` (new seeds, new answers)
    where its answers were read to no result; as it was where it has no answers (never asked; a logprob request)."""
    detail = earlier.detail if earlier is not None else {}
    if detail.get("partial"):
        return replace(task, attempt=int(detail.get("attempt", 0)), resume=detail)
    if detail.get("statuses"):
        return replace(task, attempt=int(detail.get("attempt", 0)) + 1)
    return task


def warn(summary: dict, source: str, min_label_mass: float) -> None:
    """Log the blocks of low label mass and those that may judge an injection, if any."""
    if summary["low_label_mass"]:
        log.warning(
            "%s: %d blocks have label mass below min_label_mass %g (marked low_label_mass in the failures table); "
            "check the prompt's answer format, label_prefix and chat_template",
            source,
            summary["low_label_mass"],
            min_label_mass,
        )
    if summary["possible_injection"]:
        log.warning(
            "%s: %d blocks judge a text that may hold instructions to the judge (marked possible_injection)",
            source,
            summary["possible_injection"],
        )


def answer_counts(results) -> dict:
    """The answers behind the sampled, verbalized or reasoned blocks: per answer status (parsed, unparseable,
    ...) and the mean number of parsed answers per sampled block (None without such blocks)."""
    statuses: dict[str, int] = defaultdict(int)
    samples = []
    for r in results:
        for status, n in r.detail.get("statuses", {}).items():
            statuses[status] += n
        if r.status == "ok" and "samples" in r.detail:
            samples.append(r.detail["samples"])
    return {"answers": dict(statuses), "mean_samples": float(np.mean(samples)) if samples else None}


def label_mass(r: Result) -> float | None:
    """Total probability of a block's labels (None unless every label's mass is known)."""
    if r.status != "ok" or not r.probs or any(p is None for p in r.probs.values()):
        return None
    return float(sum(r.probs.values()))


def label_mass_quantiles(results) -> dict:
    masses = [m for m in map(label_mass, results) if m is not None]
    if not masses:
        return {"label_mass_min": None, "label_mass_p10": None, "label_mass_median": None}
    q = np.quantile(masses, [0.0, 0.1, 0.5])
    return {"label_mass_min": float(q[0]), "label_mass_p10": float(q[1]), "label_mass_median": float(q[2])}


def merge(tasks: Sequence[Task], results: Sequence[Result | None]) -> Result | None:
    """One block asked in several prompts (option orders): the first missing or not-ok result,
    else the options' mean probabilities (and the first warning)."""
    for r in results:
        if r is None or r.status != "ok":
            return r
    if len(results) == 1:
        return results[0]
    probs = {o: sum(r.probs[o] for r in results) / len(results) for o in tasks[0].options}
    samples = [r.detail["samples"] for r in results if "samples" in r.detail]
    detail = {"samples": sum(samples)} if samples else {}
    return Result(tasks[0], probs, "ok", "", warning=next((r.warning for r in results if r.warning), ""), detail=detail)


def assemble(
    tasks: Sequence[Task],
    results: dict,
    source: str,
    skipped: Sequence[dict],
    rubric: Rubric | None,
    min_label_mass: float = 0.0,
    detector: InjectionDetector | None = None,
) -> Extraction:
    """Features rows from ``ok`` results (a block asked in several prompts gets their mean);
    every other outcome, warning, low label mass or the ``detector``'s match as a failures row."""
    rows, failures = [], [{**s, "source": source} for s in skipped]
    blocks: dict[tuple[str, str], list[Task]] = defaultdict(list)
    for t in tasks:
        blocks[(t.text_id, t.question_id)].append(t)
    found_in: dict[str, str | None] = {}  # each text searched once, not once per question or item
    for (text_id, question_id), block in blocks.items():
        r = merge(block, [results.get((t.template_hash, t.key, t.question_id)) for t in block])
        where = {"text_id": text_id, "source": source, "question_id": question_id}
        if detector and block[0].text and text_id not in found_in:
            found_in[text_id] = detector.find(block[0].text)
        found = found_in.get(text_id)
        if found:
            failures.append({**where, "status": "possible_injection", "reason": f"the text holds {found!r}"})
        if r is None:
            failures.append({**where, "status": "failed", "reason": "no result"})
            continue
        if r.status != "ok":
            failures.append({**where, "status": r.status, "reason": r.reason})
            continue
        if r.warning:
            failures.append({**where, "status": "truncated", "reason": r.warning})
        lost = {k: n for k, n in r.detail.get("statuses", {}).items() if k != "parsed"}
        if lost:
            reason = f"{sum(lost.values())} of {sum(r.detail['statuses'].values())} answers were not read ({lost})"
            failures.append({**where, "status": "unparsed_answers", "reason": reason})
        mass = label_mass(r)
        if mass is not None and mass < min_label_mass:
            failures.append(
                {
                    **where,
                    "status": "low_label_mass",
                    "reason": f"label mass {mass:.3g} below min_label_mass {min_label_mass:g}",
                }
            )
        samples = {"samples": r.detail["samples"]} if "samples" in r.detail else {}
        rows.extend({**where, "option": o, "prob": r.probs[o], **samples} for o in block[0].options)
    columns = ["text_id", "source", "question_id", "option", "prob"]
    features = pd.DataFrame(rows, columns=columns + (["samples"] if any("samples" in row for row in rows) else []))
    if "samples" in features.columns:
        features["samples"] = features["samples"].astype("Int64")
    if len(features):
        features.index = pd.RangeIndex(1, len(features) + 1)
        features.attrs["source"] = f"<features {source}>"
        features = validate_features(features, rubric).reset_index(drop=True)
    return Extraction(features, pd.DataFrame(failures, columns=FAILURE_COLUMNS))
