"""Contextual inputs (Mundlak's device): each text's system means of its input columns.

A text-level model that also sees the mean of its system's inputs learns the between-system slope
apart from the within-system one (the "within-between" random-effects model). The means use the
features of the texts at hand only (a new system's own texts, never labels), grouped by
``system_id`` of the texts table; a column a text lacks is left out of its system's mean. The
contextual columns are those means less their training centre, so a text without a system id (or
a system without any value of a column) gets 0 there: no contextual effect.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from llmrubric.io.tables import Tables


def text_systems(tables: Tables) -> pd.Series:
    """text id → system id of the texts that have one (empty when the data have none)."""
    for source in (tables.texts, tables.annotations):
        if source is not None and "system_id" in source and source.system_id.notna().any():
            known = source.dropna(subset=["system_id"]).drop_duplicates("text_id")
            return pd.Series(known.system_id.astype(str).to_numpy(), index=known.text_id.astype(str))
    return pd.Series(dtype=object)


def system_means(columns: np.ndarray, texts: list[str], systems: pd.Series) -> np.ndarray:
    """(texts, columns): each text's system mean of every column over ``texts`` (NaN values left
    out); NaN for a text without a system and where its system has no value."""
    system = pd.Series(texts).map(systems).to_numpy()
    out = np.full(columns.shape, np.nan)
    frame = pd.DataFrame(columns).assign(system=system).dropna(subset=["system"])
    if frame.empty:
        return out
    means = frame.groupby("system").mean()
    rows = np.flatnonzero(pd.notna(system))
    out[rows] = means.loc[system[rows]].to_numpy()
    return out


def contextual_columns(means: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """The system means less ``centre``; 0 where a mean is missing (no contextual effect)."""
    return np.nan_to_num(means - centre, nan=0.0)


def centre_of(means: np.ndarray, texts: list[str], systems: pd.Series) -> np.ndarray:
    """The mean over the training systems of their means (one row per system), 0 where none."""
    system = pd.Series(texts).map(systems)
    first = ~system.duplicated() & system.notna()
    rows = means[first.to_numpy()]
    if not len(rows):
        return np.zeros(means.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column no system has: centre 0
        return np.nan_to_num(np.nanmean(rows, axis=0), nan=0.0)
