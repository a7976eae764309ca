"""Test banks (exam questions or nuggets per query) as JSONL with stable ids.

One line per item: ``query_id, item_id, kind (question/nugget), text, importance
(vital/okay)`` plus optional extra fields (e.g. ``gold``, ``rubric`` for answer quality).
``item_id`` is a hash of query id and text, written once so that people can edit the text
and keep the id. Generation follows RUBRIC Table 1 (questions) and AutoNuggetizer
Figures 1–2 (iterative nuggetization, then vital/okay labels).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmrubric.extract.prompts import PromptTemplate
from llmrubric.io.errors import InputError
from llmrubric.io.files import write_text

log = logging.getLogger(__name__)
KINDS = ("question", "nugget")
IMPORTANCE = ("vital", "okay")
FIELDS = ("query_id", "item_id", "kind", "text", "importance")


def item_id(query_id: str, text: str) -> str:
    """Stable id: sha1 of query id and text, 12 hex digits."""
    return hashlib.sha1(f"{query_id}\0{text.strip()}".encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Item:
    query_id: str
    item_id: str
    kind: str
    text: str
    importance: str = "vital"
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def new(cls, query_id: str, kind: str, text: str, importance: str = "vital", **extra) -> Item:
        return cls(str(query_id), item_id(str(query_id), text), kind, text.strip(), importance, extra)

    def to_dict(self) -> dict:
        return {
            "query_id": self.query_id,
            "item_id": self.item_id,
            "kind": self.kind,
            "text": self.text,
            "importance": self.importance,
            **self.extra,
        }


def write_bank(items: Iterable[Item], path: str | Path) -> Path:
    """Write items as JSONL, atomically."""
    return write_text("".join(json.dumps(i.to_dict(), ensure_ascii=False) + "\n" for i in items), path)


def read_bank(path: str | Path, on_error: str = "raise") -> tuple[list[Item], list[str]]:
    """Read a (possibly hand-edited) test bank; returns items and warnings.

    A malformed line is an :class:`InputError` naming file and line, or with
    ``on_error="skip"`` a recorded warning (the line is left out). A missing ``item_id`` is
    computed; a duplicate ``item_id`` is always an error.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("test bank not found", file=str(path))
    items, warnings, seen = [], [], {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(_parse(line))
        except ValueError as e:
            if on_error != "skip":
                raise InputError(str(e), file=str(path), row=n) from e
            warnings.append(f"{path}: line {n}: {e} (skipped)")
            log.warning(warnings[-1])
            continue
        prev = seen.setdefault(items[-1].item_id, n)
        if prev != n:
            raise InputError(
                f"duplicate item_id {items[-1].item_id!r} (also on line {prev})",
                file=str(path),
                row=n,
                column="item_id",
            )
    if not items:
        raise InputError("the test bank has no valid items", file=str(path))
    return items, warnings


def _parse(line: str) -> Item:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from e
    if not isinstance(data, dict):
        raise ValueError("a test-bank line must be a JSON object")
    for key in ("query_id", "text"):
        if not str(data.get(key, "")).strip():
            raise ValueError(f"missing or empty {key!r}")
    kind = data.get("kind", "question")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    importance = data.get("importance", "vital")
    if importance not in IMPORTANCE:
        raise ValueError(f"importance {importance!r} is not one of {IMPORTANCE}")
    query_id, text = str(data["query_id"]), str(data["text"]).strip()
    extra = {k: v for k, v in data.items() if k not in FIELDS}
    return Item(query_id, str(data.get("item_id") or item_id(query_id, text)), kind, text, importance, extra)


def parse_list(output: str) -> list[str]:
    """The first JSON / Python list of strings in a model's output; ValueError if none."""
    match = re.search(r"\[.*?\]", output, flags=re.S)
    if not match:
        raise ValueError(f"no list in the model output {output[:200]!r}")
    text = match.group(0)
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v.strip() for v in value if v.strip()]
    raise ValueError(f"the model output has no list of strings: {text[:200]!r}")


Generate = Callable[[str], str]


def generate_questions(
    generate: Generate, query_id: str, query: str, n: int = 10, template: PromptTemplate | None = None
) -> list[Item]:
    """Exam questions for one query (RUBRIC Table 1, TREC DL prompt)."""
    template = template or PromptTemplate("generate_questions")
    texts = parse_list(generate(template.render(query=query, n=n)))
    return _unique([Item.new(query_id, "question", t) for t in texts[:n]])


def nuggetize(
    generate: Generate,
    query_id: str,
    query: str,
    passages: Sequence[str],
    per_turn: int = 10,
    max_nuggets: int = 30,
    keep: int = 20,
) -> list[Item]:
    """AutoNuggetizer: update the nugget list over passages ``per_turn`` at a time, then
    label vital/okay (at most 10 per call), sort vital first and keep ``keep`` nuggets.

    A turn whose output has no list keeps the previous list (logged)."""
    update, label = PromptTemplate("nuggetize"), PromptTemplate("nugget_importance")
    nuggets: list[str] = []
    for start in range(0, len(passages), per_turn):
        prompt = update.render(
            query=query, passages=list(passages[start : start + per_turn]), nuggets=nuggets, max_nuggets=max_nuggets
        )
        try:
            nuggets = parse_list(generate(prompt))[:max_nuggets]
        except ValueError as e:
            log.warning(
                "query %s: nuggetization turn %d kept the previous list: %s", query_id, start // per_turn + 1, e
            )
    labels: list[str] = []
    for start in range(0, len(nuggets), 10):
        chunk = nuggets[start : start + 10]
        try:
            got = [v.lower() for v in parse_list(generate(label.render(query=query, nuggets=chunk)))]
        except ValueError:
            got = []
        if len(got) != len(chunk) or any(v not in IMPORTANCE for v in got):
            log.warning(
                "query %s: importance labels %s do not match %d nuggets; labelled okay", query_id, got, len(chunk)
            )
            got = ["okay"] * len(chunk)
        labels.extend(got)
    items = [Item.new(query_id, "nugget", t, imp) for t, imp in zip(nuggets, labels)]
    items.sort(key=lambda i: IMPORTANCE.index(i.importance))
    return _unique(items)[:keep]


def _unique(items: list[Item]) -> list[Item]:
    seen, out = set(), []
    for i in items:
        if i.item_id not in seen:
            seen.add(i.item_id)
            out.append(i)
    return out
