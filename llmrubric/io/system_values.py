"""A table of values per system (a reference leaderboard, shift errors, system levels), read and checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.rows import check_unique
from llmrubric.io.tables import read_nonempty


def read_system_values(path: str | Path, what: str, columns_of) -> pd.DataFrame:
    """A table with one row per ``system`` (or ``system_id``) and the numeric columns that
    ``columns_of(its columns)`` names, indexed by system; each problem an error naming file, row and column."""
    path = Path(path)
    df = read_nonempty(path, what, empty=f"the {what} is empty")
    system = "system" if "system" in df.columns else "system_id" if "system_id" in df.columns else None
    wanted = columns_of(list(df.columns))
    absent = [c for c in wanted if c not in df.columns]
    if system is None or absent:
        raise InputError(
            f"a {what} needs columns {', '.join(repr(c) for c in ['system', *wanted])} (has {list(df.columns)})",
            file=str(path),
            column="system" if system is None else absent[0],
        )
    values = {}
    for column in wanted:
        value = pd.to_numeric(df[column], errors="coerce")
        bad = ~np.isfinite(value.to_numpy(float))
        if bad.any():
            row = df.index[bad.argmax()]
            raise InputError(
                f"{column} {df.at[row, column]!r} is not a finite number", file=str(path), row=int(row), column=column
            )
        values[column] = value.to_numpy(float)
    names = df[system].astype(str).str.strip()
    check_unique(names.to_frame("name"), "name", "system {name!r} is listed twice", file=str(path), column=system)
    return pd.DataFrame(values, index=pd.Index(names.to_numpy(), name="system"))
