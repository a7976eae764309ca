"""Question families → tasks: rubric Likert questions and per-item test-bank questions.

Every family renders a Jinja template (``conf/prompts/<name>.j2``) whose long text variable
comes first and whose question comes last, so that a text's prompts share a prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from llmrubric.extract.prompts import PromptTemplate, text_hash
from llmrubric.extract.tasks import Task
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import source_of


def _has_references(row: dict) -> bool:
    value = row.get("has_references")
    if value is not None and not (isinstance(value, float) and pd.isna(value)):
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "y")
        return bool(value)
    return bool(re.search(r"\[\d+\]|\bSources?:", str(row.get("text", ""))))


# Applicability rules a rubric's ``applicable_if`` can name; each sees one texts row.
RULES: dict[str, Callable[[dict], bool]] = {"has_references": _has_references}


def _check_texts(texts: pd.DataFrame, columns: Sequence[str] = ("text_id", "text")) -> None:
    src = source_of(texts)
    for column in columns:
        if column not in texts.columns:
            raise InputError(
                f"the texts table needs a {column!r} column (has {list(texts.columns)})", file=src, column=column
            )
    empty = texts["text"].isna() | (texts["text"].astype(str).str.strip() == "")
    if empty.any():
        row = texts.index[empty.argmax()]
        raise InputError(f"empty text for text_id {texts.at[row, 'text_id']!r}", file=src, row=int(row), column="text")
    dup = texts["text_id"].duplicated()
    if dup.any():
        row = texts.index[dup.argmax()]
        raise InputError(f"duplicate text_id {texts.at[row, 'text_id']!r}", file=src, row=int(row), column="text_id")


def likert_tasks(
    texts: pd.DataFrame, rubric: Rubric, template: PromptTemplate, orders: int = 1
) -> tuple[list[Task], list[dict]]:
    """One task per (text, applicable rubric question); also the skipped (masked) blocks.

    The options offered are the question's ``llm_options`` (e.g. '1'..'4'); their labels are
    those keys. A question not applicable to a text (``applicable_if`` false) is not asked.
    ``orders`` > 1 asks each question again with the options listed in rotated orders (1 2 3 4,
    2 3 4 1, …), against a position bias; the extractor averages a block's prompts.
    """
    if orders < 1:
        raise InputError(f"orders must be at least 1, not {orders}")
    _check_texts(texts)
    for q in rubric.questions:
        if not q.llm_options:
            raise InputError(f"rubric question {q.id!r} has no options", file=rubric.source)
        if q.applicable_if and q.applicable_if not in RULES:
            raise InputError(
                f"question {q.id!r}: unknown applicability rule {q.applicable_if!r} (known: {sorted(RULES)})",
                file=rubric.source,
            )
    tasks, skipped = [], []
    for row in texts.to_dict("records"):
        text_id, text = str(row["text_id"]), str(row["text"])
        for q in rubric.questions:
            if q.applicable_if and not RULES[q.applicable_if](row):
                skipped.append(
                    {
                        "text_id": text_id,
                        "question_id": q.id,
                        "status": "not_applicable",
                        "reason": f"{q.applicable_if} is false",
                    }
                )
                continue
            labels = {o.key: o.label for o in q.options}
            keys = list(q.llm_options)
            for shift in range(min(orders, len(keys))):
                order = keys[shift:] + keys[:shift]
                options = [{"label": key, "text": labels.get(key, "")} for key in order]
                prompt = template.render(text=text, question=q.prompt, options=options, labels=order)
                tasks.append(
                    Task(
                        text_id,
                        q.id,
                        prompt,
                        tuple(order),
                        tuple(order),
                        text_id,
                        template.hash,
                        text_hash(prompt, *order),
                        text,
                    )
                )
    return tasks, skipped


@dataclass(frozen=True)
class Family:
    """A per-item family: its template, option keys and the labels the model produces."""

    template: str
    options: tuple[str, ...]
    labels: tuple[str, ...]


FAMILIES = {
    "self_rating": Family("self_rating", tuple("012345"), tuple("012345")),
    "nugget_support": Family(
        "nugget_support", ("support", "partial_support", "not_support"), ("support", "partial_support", "not_support")
    ),
    "answer_quality": Family("answer_quality", tuple("12345"), tuple("12345")),
}


def item_tasks(family: str, texts: pd.DataFrame, bank, template: PromptTemplate | None = None) -> list[Task]:
    """One task per (text, test-bank item of the text's query).

    ``texts`` has ``text_id, query_id, text`` (a passage or an answer) and, where the template
    asks for it, ``query``. ``bank`` is a list of :class:`~llmrubric.extract.testbank.Item`.
    The question id of an item is ``<family>:<item_id>``.
    """
    if family not in FAMILIES:
        raise InputError(f"unknown question family {family!r} (known: likert, {', '.join(FAMILIES)})")
    spec = FAMILIES[family]
    template = template or PromptTemplate(spec.template)
    _check_texts(texts, ("text_id", "query_id", "text"))
    by_query: dict[str, list] = {}
    for item in bank:
        by_query.setdefault(item.query_id, []).append(item)
    tasks = []
    for row in texts.to_dict("records"):
        text_id, text = str(row["text_id"]), str(row["text"])
        for item in by_query.get(str(row["query_id"]), []):
            variables = {"passage": text, "item": item.text, "kind": item.kind, "labels": list(spec.labels)}
            variables.update(
                {
                    k: v
                    for k, v in row.items()
                    if k not in ("text", "text_id") and not (isinstance(v, float) and pd.isna(v))
                }
            )
            variables.update(item.extra)
            prompt = template.render(**variables)
            qid = f"{family}:{item.item_id}"
            tasks.append(
                Task(
                    text_id,
                    qid,
                    prompt,
                    spec.options,
                    spec.labels,
                    text_id,
                    template.hash,
                    text_hash(prompt, *spec.labels),
                    text,
                )
            )
    return tasks
