"""Adapters from external text formats to the texts table (``text_id, text, …``)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd

from llmrubric.io.errors import InputError


def render_dialogue(messages: list[dict], references: str = "") -> str:
    """``role: content`` lines, then the sources shown to the judges (if any)."""
    lines = [f"{m['role']}: {str(m['content']).strip()}" for m in messages]
    text = "\n".join(lines)
    return f"{text}\n\n{references.strip()}" if references and references.strip() else text


def llm_rubric_real_texts(path: str | Path, append_to_last_turn: str = "") -> pd.DataFrame:
    """LLM-Rubric ``real_data.json`` → texts: ``text_id, query_id, text, has_references``.

    ``messages`` is a list of ``{role, content}`` or its Python-literal string; ``ref``
    (the sources shown) is appended to the dialogue; ``topic`` becomes ``query_id``.
    ``append_to_last_turn`` is added (after a space) to the last message's content, e.g. an
    injected instruction for a robustness test.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("dialogue file not found", file=str(path))
    try:
        records = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg})", file=str(path), row=e.lineno) from e
    if not isinstance(records, list):
        raise InputError("expected a JSON list of dialogues", file=str(path))
    rows = []
    for n, record in enumerate(records, start=1):
        for key in ("_id", "messages"):
            if key not in record:
                raise InputError(f"dialogue has no {key!r}", file=str(path), row=n, column=key)
        messages = record["messages"]
        if isinstance(messages, str):
            try:
                messages = ast.literal_eval(messages)
            except (ValueError, SyntaxError) as e:
                raise InputError(
                    f"messages is not a Python-literal list ({e})", file=str(path), row=n, column="messages"
                ) from e
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages
        ):
            raise InputError("messages must be a list of {role, content}", file=str(path), row=n, column="messages")
        if append_to_last_turn and messages:
            last = messages[-1]
            messages = [*messages[:-1], {**last, "content": f"{str(last['content']).rstrip()} {append_to_last_turn}"}]
        ref = record.get("ref") or ""
        rows.append(
            {
                "text_id": str(record["_id"]),
                "query_id": str(record.get("topic", "")),
                "text": render_dialogue(messages, ref),
                "has_references": bool(ref.strip()),
            }
        )
    texts = pd.DataFrame(rows)
    texts.index = pd.RangeIndex(1, len(texts) + 1)
    texts.attrs["source"] = str(path)
    return texts
