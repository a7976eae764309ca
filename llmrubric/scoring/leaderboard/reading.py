"""The files a leaderboard reads: predictions, a reference leaderboard, shift errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.system_values import read_system_values


def read_predictions(path: str | Path) -> pd.DataFrame:
    """A predictions table file; ``p_<option>``, ``mean`` and ``var`` become numbers (bad cells are errors)."""
    from llmrubric.io.tables import read_table

    pred = read_table(path, "predictions")
    for column in [c for c in pred.columns if c.startswith("p_")] + ["mean", "var"]:
        values = pd.to_numeric(pred[column], errors="coerce")
        bad = values.isna() & pred[column].notna() & (pred[column].astype(str).str.strip() != "")
        if bad.any():
            row = pred.index[bad.to_numpy().argmax()]
            raise InputError(f"{pred.at[row, column]!r} is not a number", file=str(path), row=int(row), column=column)
        pred[column] = values.astype(float)
    return pred


def read_leaderboard(path: str | Path) -> pd.Series:
    """A reference leaderboard file (CSV, TSV, JSONL, Parquet) with ``system`` (or ``system_id``) and ``score``."""
    return read_system_values(path, "leaderboard", lambda columns: ["score"]).score


def read_shift_errors(path: str | Path) -> pd.Series:
    """system → shift error (predicted − human system mean, the system held out) from a
    leave-one-system-out run's ``system_errors.csv``: an ``error`` column, or ``predicted`` and ``human``."""
    table = read_system_values(
        path, "shift errors table", lambda columns: ["error"] if "error" in columns else ["predicted", "human"]
    )
    errors = table.error if "error" in table else table.predicted - table.human
    if len(errors) < 2:
        raise InputError(f"shift intervals need the errors of at least 2 systems, got {len(errors)}", file=str(path))
    return errors.rename("error")
