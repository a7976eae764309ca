"""Rows named in errors: a frame's index label as the row number, and the check that a key
names at most one row."""

from __future__ import annotations

from string import Formatter

import numpy as np

from llmrubric.io.errors import InputError


def row_number(label) -> int | None:
    """The row number an error names: an integer index label (1-based data rows as read), else None."""
    return int(label) if isinstance(label, (int, np.integer)) else None


def check_unique(df, key: str | list[str], message: str, *, file: str | None, column: str) -> None:
    """An error naming the first row whose ``key`` repeats an earlier row's.

    ``message`` is a format string over that row's cells, e.g. ``"answer {text_id!r} is listed twice"``.
    """
    dup = df.duplicated(key)
    if not dup.any():
        return
    row = df.index[dup.argmax()]
    fields = {name for _, name, _, _ in Formatter().parse(message) if name}
    cells = {name: df.at[row, name] for name in fields}
    raise InputError(message.format(**cells), file=file, row=row_number(row), column=column)
