"""Splits grouped by text: no text appears on both sides of any split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.errors import InputError
from llmrubric.schemas import read_table, write_table


def text_folds(text_ids, k: int, seed: int) -> pd.DataFrame:
    """Assign each text to one of ``k`` folds (sizes differ by at most one), seeded."""
    texts = np.array(sorted(set(text_ids)))
    if k < 2 or k > len(texts):
        raise InputError(f"cannot make {k} folds of {len(texts)} texts")
    order = np.random.default_rng(seed).permutation(len(texts))
    folds = np.empty(len(texts), dtype=int)
    folds[order] = np.arange(len(texts)) % k
    return pd.DataFrame({"text_id": texts, "fold": folds})


def holdout_texts(text_ids, fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(kept, held out) text ids, holding out ``fraction`` of the texts (at least one)."""
    texts = np.array(sorted(set(text_ids)))
    if not 0 < fraction < 1 or len(texts) < 2:
        raise InputError(f"cannot hold out a fraction {fraction} of {len(texts)} texts")
    n_out = max(1, int(round(fraction * len(texts))))
    order = np.random.default_rng(seed).permutation(len(texts))
    return sorted(texts[order[n_out:]]), sorted(texts[order[:n_out]])


def save_folds(folds: pd.DataFrame, path: str | Path) -> Path:
    return write_table(folds, path)


def load_folds(path: str | Path) -> pd.DataFrame:
    folds = read_table(path, "texts")
    if "fold" not in folds.columns:
        raise InputError("folds file has no 'fold' column", file=str(path), column="fold")
    folds["fold"] = folds["fold"].astype(int)
    return folds
