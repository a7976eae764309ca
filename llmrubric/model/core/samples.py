"""Counted blocks: a sampled source's answer counts over ``k`` (the features' ``samples`` column) smoothed by a
Dirichlet prior toward the uniform distribution before any family reads them, ``(counts + a / options) / (k + a)``
with ``a`` = ``model.sample_prior`` (docs/multi_source.md, sampled sources). Blocks without ``samples`` (logprobs,
verbalized distributions) and one-option blocks are left as they are."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.io.guards import check_range
from llmrubric.io.tables import Tables

BLOCK = ["text_id", "source", "question_id"]


def counted(features: pd.DataFrame) -> bool:
    """Whether ``features`` hold a block counted from sampled answers (a ``samples`` value)."""
    return "samples" in features.columns and bool(features["samples"].notna().any())


def check_sample_prior(value) -> float:
    """``model.sample_prior`` as a float >= 0, else an error naming the setting."""
    return float(check_range("model.sample_prior", value, 0))


def smoothed(features: pd.DataFrame, strength: float) -> pd.DataFrame:
    """``features`` with each counted block of 2+ options smoothed by ``strength`` pseudo-answers spread evenly
    over its options and the ``samples`` column consumed (dropped, so a second call changes nothing); the same
    frame when no block is counted."""
    if not counted(features):
        return features
    k = features["samples"].to_numpy(dtype=float, na_value=np.nan)
    options = features.groupby(BLOCK, sort=False)["option"].transform("size").to_numpy()
    rows = ~np.isnan(k) & (options >= 2)
    prob = features["prob"].to_numpy(dtype=float).copy()
    prob[rows] = (prob[rows] * k[rows] + strength / options[rows]) / (k[rows] + strength)
    out = features.drop(columns="samples").assign(prob=prob)
    out.attrs = dict(features.attrs)
    return out


def smoothed_tables(tables: Tables, strength: float) -> Tables:
    """``tables`` with their features :func:`smoothed`; the same object when no block is counted."""
    if not counted(tables.features):
        return tables
    return Tables(tables.annotations, smoothed(tables.features, strength), tables.texts)
