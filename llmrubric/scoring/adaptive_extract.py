"""Adaptive extraction (issue 34): ask each text only the blocks a selector picks, one at a time.

Round by round, a :class:`llmrubric.model.adaptive.Selector` chooses for every open text the next
(question, source) block to ask, or to stop (budget reached, expected gain per unit cost below the
setting, nothing left). The chosen blocks' prompts go through the result cache and the backend as
in :func:`llmrubric.extract.runner.extract`: a block already in the cache costs no call, so an
interrupted run resumes where it stopped and asks nothing twice (the selection is deterministic
given the answers). Blocks never asked are absent from the features table and listed in the
failures table with status ``not_asked``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from llmrubric.extract.backends.base import Backend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.injection import InjectionDetector
from llmrubric.extract.runner import (
    MODE_STATUSES,
    Extraction,
    Usage,
    answer_counts,
    assemble,
    merge,
    split_cached,
    warn,
)
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.model.adaptive import Selector

log = logging.getLogger(__name__)


@dataclass
class _Plan:
    """The askable blocks of every text: ``tasks[row][block]`` (several prompts with ``orders`` > 1),
    their costs (texts, blocks) and which are askable (texts, blocks)."""

    text_ids: list[str]
    tasks: list[dict[int, list[Task]]]
    askable: np.ndarray
    costs: np.ndarray


def check_rubric(trained: Rubric, asked: Rubric, checkpoint: str) -> None:
    """The calibrator's rubric must be the one asked: the same questions, prompts and options."""
    described = lambda r: {q.id: (q.prompt, tuple(q.llm_options)) for q in r.questions}
    mine, theirs = described(asked), described(trained)
    differ = sorted(set(mine) ^ set(theirs)) or [q for q in mine if mine[q] != theirs[q]]
    if differ:
        raise InputError(
            f"the calibrator was trained on another rubric than {asked.source} (question(s) {differ} differ)",
            file=checkpoint,
        )


def check_source(selector: Selector, source: str, tasks: Sequence[Task]) -> None:
    """Some task must ask a block of the calibrator: one of ``source`` and a question it knows."""
    blocks = {(b.source, b.question_id) for b in selector.blocks}
    if not any((source, t.question_id) in blocks for t in tasks):
        sources = sorted({b.source for b in selector.blocks})
        raise InputError(
            f"the calibrator's blocks come from source(s) {sources}, this extraction's source is {source!r}: "
            "no block to ask (set --source to the calibrator's source)",
            setting="--source",
        )


def plan_blocks(tasks: Sequence[Task], selector: Selector, source: str, cost: str) -> _Plan:
    """Match the tasks to the selector's blocks of ``source``; ``cost``: ``calls`` or ``tokens``."""
    check_source(selector, source, tasks)
    index = {(b.source, b.question_id): i for i, b in enumerate(selector.blocks)}
    by_text: dict[str, dict[int, list[Task]]] = defaultdict(lambda: defaultdict(list))
    for t in tasks:
        block = index.get((source, t.question_id))
        if block is not None:
            by_text[t.text_id][block].append(t)
    text_ids = list(by_text)
    askable = np.zeros((len(text_ids), len(selector.blocks)), dtype=bool)
    costs = np.ones(askable.shape)
    for row, text_id in enumerate(text_ids):
        blocks = by_text[text_id]
        askable[row, list(blocks)] = True
        if cost == "tokens":
            length = {b: sum(len(t.prompt) for t in ts) for b, ts in blocks.items()}
            mean = np.mean(list(length.values()))
            for b, n in length.items():
                costs[row, b] = n / mean
    return _Plan(text_ids, [dict(by_text[t]) for t in text_ids], askable, costs)


class _Asker:
    """Gets blocks' results: from the cache where final, else from the backend (and stores them)."""

    def __init__(self, backend: Backend, cache: ResultCache):
        self.backend, self.cache = backend, cache
        self.results: dict[tuple, Result] = {}
        self.cached = self.computed = 0
        self.usage = Usage()
        self.seconds = 0.0

    def ask(self, tasks: list[Task]) -> None:
        hits, todo = split_cached(tasks, self.cache, self.backend.model_id)
        self.results.update(hits)
        self.cached += len(hits)
        start = time.perf_counter()
        for r in self.backend.score(todo):
            self.cache.put(self.backend.model_id, r)
            self.results[key(r.task)] = r
            self.computed += 1
            self.usage.add(r)
        self.seconds += time.perf_counter() - start


def key(t: Task) -> tuple:
    return (t.template_hash, t.key, t.question_id)


def extract_adaptive(
    tasks: Sequence[Task],
    backend: Backend,
    cache: ResultCache,
    source: str,
    selector: Selector,
    skipped: Sequence[dict] = (),
    rubric: Rubric | None = None,
    progress: bool = True,
    min_label_mass: float = 0.0,
    detector: InjectionDetector | None = None,
) -> Extraction:
    """Ask every text the blocks ``selector`` picks, round by round; features of the blocks asked."""
    plan = plan_blocks(tasks, selector, source, selector.settings["cost"])
    n_texts = len(plan.text_ids)
    state = selector.empty(plan.text_ids)
    askable, asked = plan.askable.copy(), np.zeros(n_texts, dtype=int)
    open_, stopped = np.ones(n_texts, dtype=bool), [""] * n_texts
    asker, select_seconds, rounds = _Asker(backend, cache), 0.0, 0
    bar = tqdm(total=n_texts, desc=f"adaptive {source}", unit="text", disable=not progress, dynamic_ncols=True)
    try:
        while open_.any():
            start = time.perf_counter()
            choice, gain = selector.choose(state, askable, asked, plan.costs)
            select_seconds += time.perf_counter() - start
            rounds += 1
            chosen = {}
            for row in np.flatnonzero(open_):
                if choice[row] < 0:
                    open_[row], stopped[row] = False, selector.stop_reason(asked[row], gain[row], askable[row])
                    bar.update(1)
                    continue
                chosen[row] = int(choice[row])
                askable[row, chosen[row]], asked[row] = False, asked[row] + 1
            asker.ask([t for row, b in chosen.items() for t in plan.tasks[row][b]])
            for row, b in chosen.items():
                block_tasks = plan.tasks[row][b]
                r = merge(block_tasks, [asker.results.get(key(t)) for t in block_tasks])
                if r is not None and r.status == "ok":
                    state = selector.observe(state, row, b, r.probs)
            bar.set_postfix(calls=asker.computed, cached=asker.cached, saved=int(askable[~open_].sum()))
    finally:
        bar.close()
    extraction = _extraction(plan, asker, askable, stopped, source, skipped, rubric, min_label_mass, detector)
    extraction.summary = _summary(extraction, plan, asker, asked, select_seconds, rounds)
    warn(extraction.summary, source, min_label_mass)
    log.info("adaptive extract %s: %s", source, ", ".join(f"{k} {v}" for k, v in extraction.summary.items()))
    return extraction


def _extraction(plan, asker, unasked, stopped, source, skipped, rubric, min_label_mass, detector) -> Extraction:
    """The :class:`Extraction` of the asked tasks, with a ``not_asked`` failure row per block never asked."""
    asked_tasks = [t for row in plan.tasks for ts in row.values() for t in ts if key(t) in asker.results]
    not_asked = [
        {
            "text_id": plan.text_ids[row],
            "question_id": plan.tasks[row][b][0].question_id,
            "status": "not_asked",
            "reason": stopped[row],
        }
        for row, b in zip(*np.nonzero(unasked))
    ]
    return assemble(asked_tasks, asker.results, source, [*skipped, *not_asked], rubric, min_label_mass, detector)


def _summary(
    extraction: Extraction, plan: _Plan, asker: _Asker, asked: np.ndarray, select_seconds: float, rounds: int
) -> dict:
    """Counts of the run: prompts asked, cached and computed, blocks asked and saved, the statuses of a mode's
    absent blocks and answers, requests and tokens (as a plain run counts them: :class:`llmrubric.extract.runner.Usage`),
    and where the time went."""
    status = extraction.failures.status.value_counts() if len(extraction.failures) else {}
    askable = int(plan.askable.sum())
    return {
        "prompts": len(asker.results),
        "cached": asker.cached,
        "computed": asker.computed,
        "done": int(sum(r.status == "ok" for r in asker.results.values())),
        "failed": int(status.get("failed", 0)),
        "incomplete": int(status.get("incomplete", 0)),
        "not_applicable": int(status.get("not_applicable", 0)),
        "truncated": int(status.get("truncated", 0)),
        "low_label_mass": int(status.get("low_label_mass", 0)),
        "possible_injection": int(status.get("possible_injection", 0)),
        **{name: int(status.get(name, 0)) for name in (*MODE_STATUSES, "unparsed_answers")},
        **answer_counts(asker.results.values()),
        "texts": len(plan.text_ids),
        "askable_blocks": askable,
        "asked_blocks": int(asked.sum()),
        "saved_blocks": askable - int(asked.sum()),
        "mean_blocks_per_text": float(asked.mean()),
        "rounds": rounds,
        "llm_seconds": asker.seconds,
        "select_seconds": select_seconds,
        **asker.usage.counts(asker.backend),
    }
