"""Run tasks through a backend with the cache: skip what is done, store each result as it
arrives, and build the features table plus a record of everything that is not a feature."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
from tqdm.auto import tqdm

from llmrubric.extract.backends.base import Backend
from llmrubric.extract.cache import FINAL, ResultCache
from llmrubric.extract.tasks import Result, Task
from llmrubric.rubric import Rubric
from llmrubric.schemas import validate_features

log = logging.getLogger(__name__)
FAILURE_COLUMNS = ["text_id", "source", "question_id", "status", "reason"]


@dataclass
class Extraction:
    """``features``: canonical table; ``failures``: one row per block that is not in it
    (failed, incomplete, not_applicable) or carries a warning (truncated)."""

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
) -> Extraction:
    """Score every task not already in ``cache``; return features of all tasks."""
    keys = [(t.template_hash, t.key, t.question_id) for t in tasks]
    if len(set(keys)) != len(keys):
        raise ValueError("two tasks have the same cache key (same prompt and question id)")
    model_id = backend.model_id
    results: dict[tuple, Result] = {}
    todo = []
    for t in tasks:
        hit = cache.get(model_id, t)
        if hit is not None and hit.status in FINAL:
            results[(t.template_hash, t.key, t.question_id)] = hit
        else:
            todo.append(t)
    cached = len(results)
    bar = tqdm(total=len(tasks), initial=cached, desc=f"extract {source}", unit="prompt", disable=not progress, dynamic_ncols=True)
    computed_tokens = prompt_tokens = 0
    try:
        for r in backend.score(todo):
            cache.put(model_id, r)
            results[(r.task.template_hash, r.task.key, r.task.question_id)] = r
            computed_tokens += r.computed_tokens
            prompt_tokens += r.prompt_tokens
            bar.update(1)
    finally:
        bar.close()
    extraction = assemble(tasks, results, source, skipped, rubric)
    s = extraction.failures.status.value_counts() if len(extraction.failures) else {}
    extraction.summary = {
        "prompts": len(tasks),
        "cached": cached,
        "computed": len(todo),
        "done": int(sum(r.status == "ok" for r in results.values())),
        "failed": int(s.get("failed", 0)),
        "incomplete": int(s.get("incomplete", 0)),
        "not_applicable": int(s.get("not_applicable", 0)),
        "truncated": int(s.get("truncated", 0)),
        "prompt_tokens": prompt_tokens,
        "computed_tokens": computed_tokens,
    }
    log.info("extract %s: %s", source, ", ".join(f"{k} {v}" for k, v in extraction.summary.items()))
    return extraction


def assemble(tasks: Sequence[Task], results: dict, source: str, skipped: Sequence[dict], rubric: Rubric | None) -> Extraction:
    """Features rows from ``ok`` results; every other outcome as a failures row."""
    rows, failures = [], [{**s, "source": source} for s in skipped]
    for t in tasks:
        r = results.get((t.template_hash, t.key, t.question_id))
        if r is None:
            failures.append({"text_id": t.text_id, "source": source, "question_id": t.question_id, "status": "failed", "reason": "no result"})
            continue
        if r.status != "ok":
            failures.append({"text_id": t.text_id, "source": source, "question_id": t.question_id, "status": r.status, "reason": r.reason})
            continue
        if r.warning:
            failures.append({"text_id": t.text_id, "source": source, "question_id": t.question_id, "status": "truncated", "reason": r.warning})
        rows.extend({"text_id": t.text_id, "source": source, "question_id": t.question_id, "option": o, "prob": r.probs[o]} for o in t.options)
    features = pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"])
    if len(features):
        features.index = pd.RangeIndex(1, len(features) + 1)
        features.attrs["source"] = f"<features {source}>"
        features = validate_features(features, rubric).reset_index(drop=True)
    return Extraction(features, pd.DataFrame(failures, columns=FAILURE_COLUMNS))
