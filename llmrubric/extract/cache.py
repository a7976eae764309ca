"""On-disk result store (SQLite): one row per result, committed as it arrives.

Keyed by (model id, template hash, prompt hash, question id). Results with status ``ok`` or
``incomplete`` are final; ``failed`` ones are kept for the report and retried on the next run. A result's
``detail`` (the record of a sampled, verbalized or reasoned block: counts, statuses, raw answers) is a JSON
row of the table ``details`` under the same key.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from llmrubric.extract.tasks import Result, Task

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    model_id TEXT NOT NULL, template_hash TEXT NOT NULL, key TEXT NOT NULL, question_id TEXT NOT NULL,
    text_id TEXT NOT NULL, status TEXT NOT NULL, probs TEXT, reason TEXT, warning TEXT,
    prompt_tokens INTEGER, computed_tokens INTEGER, created REAL,
    PRIMARY KEY (model_id, template_hash, key, question_id)
)
"""
DETAILS = """
CREATE TABLE IF NOT EXISTS details (
    model_id TEXT NOT NULL, template_hash TEXT NOT NULL, key TEXT NOT NULL, question_id TEXT NOT NULL,
    detail TEXT NOT NULL, PRIMARY KEY (model_id, template_hash, key, question_id)
)
"""
FINAL = ("ok", "incomplete")


class ResultCache:
    """``get(model_id, task)`` → stored Result or None; ``put(model_id, result)`` commits one row."""

    def __init__(self, path: str | Path | None):
        self.path = str(path) if path else ":memory:"
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(SCHEMA)
        self.db.execute(DETAILS)
        self.db.commit()

    def get(self, model_id: str, task: Task) -> Result | None:
        row = self.db.execute(
            "SELECT status, probs, reason, warning, prompt_tokens, computed_tokens, detail FROM results "
            "LEFT JOIN details USING (model_id, template_hash, key, question_id) "
            "WHERE model_id=? AND template_hash=? AND key=? AND question_id=?",
            (model_id, task.template_hash, task.key, task.question_id),
        ).fetchone()
        if row is None:
            return None
        status, probs, reason, warning, prompt_tokens, computed_tokens, detail = row
        return Result(
            task,
            json.loads(probs) if probs else None,
            status,
            reason or "",
            prompt_tokens or 0,
            computed_tokens or 0,
            warning or "",
            json.loads(detail) if detail else {},
        )

    def put(self, model_id: str, result: Result) -> None:
        t = result.task
        self.db.execute(
            "INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                model_id,
                t.template_hash,
                t.key,
                t.question_id,
                t.text_id,
                result.status,
                json.dumps(result.probs) if result.probs is not None else None,
                result.reason,
                result.warning,
                result.prompt_tokens,
                result.computed_tokens,
                time.time(),
            ),
        )
        where = (model_id, t.template_hash, t.key, t.question_id)
        if result.detail:
            self.db.execute("INSERT OR REPLACE INTO details VALUES (?,?,?,?,?)", (*where, json.dumps(result.detail)))
        else:
            self.db.execute(
                "DELETE FROM details WHERE model_id=? AND template_hash=? AND key=? AND question_id=?", where
            )
        self.db.commit()

    def merge(self, path: str | Path, keep: Callable[[str], bool] | None = None) -> int:
        """Add the results of the store at ``path`` (only those of texts where ``keep(text_id)``):
        each replaces the one here unless that one is final. Returns the rows added or replaced."""
        self.db.create_function("keep_text", 1, keep or (lambda text_id: True), deterministic=True)
        self.db.execute("ATTACH DATABASE ? AS other", (str(path),))
        try:
            if self.db.execute("SELECT 1 FROM other.sqlite_master WHERE name='details'").fetchone():
                self.db.execute(  # before the results: the main store's statuses say which rows are replaced
                    "INSERT OR REPLACE INTO details SELECT d.* FROM other.details d JOIN other.results o "
                    "USING (model_id, template_hash, key, question_id) LEFT JOIN main.results m "
                    "ON m.model_id = d.model_id AND m.template_hash = d.template_hash AND m.key = d.key "
                    f"AND m.question_id = d.question_id WHERE keep_text(o.text_id) AND (m.status IS NULL OR m.status NOT IN {FINAL!r})"
                )
            added = self.db.execute(
                "INSERT OR REPLACE INTO results SELECT o.* FROM other.results o LEFT JOIN main.results m "
                "ON m.model_id = o.model_id AND m.template_hash = o.template_hash AND m.key = o.key "
                "AND m.question_id = o.question_id "
                f"WHERE keep_text(o.text_id) AND (m.status IS NULL OR m.status NOT IN {FINAL!r})"
            ).rowcount
            self.db.commit()
        finally:
            self.db.execute("DETACH DATABASE other")
        return added

    def count(self, status: str | None = None) -> int:
        if status is None:
            return self.db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self.db.execute("SELECT COUNT(*) FROM results WHERE status=?", (status,)).fetchone()[0]

    def close(self) -> None:
        self.db.close()
