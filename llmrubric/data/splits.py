"""Splits grouped by text (or by system): no text appears on both sides of any split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.files import write_table
from llmrubric.io.tables import read_table, source_of


def text_folds(text_ids, k: int, seed: int) -> pd.DataFrame:
    """Assign each text to one of ``k`` folds (sizes differ by at most one), seeded."""
    texts = np.array(sorted(set(text_ids)))
    if k < 2 or k > len(texts):
        raise InputError(f"cannot make {k} folds of {len(texts)} texts")
    order = np.random.default_rng(seed).permutation(len(texts))
    folds = np.empty(len(texts), dtype=int)
    folds[order] = np.arange(len(texts)) % k
    return pd.DataFrame({"text_id": texts, "fold": folds})


def _system_source(tables) -> pd.DataFrame:
    """The table that gives texts their system: the texts table when it has ``system_id``, else the annotations."""
    return tables.texts if tables.texts is not None and "system_id" in tables.texts else tables.annotations


def text_systems(tables) -> pd.Series:
    """text id → system id of every annotated text (:func:`_system_source`)."""
    source = _system_source(tables)
    if "system_id" not in source or source.system_id.isna().all():
        raise InputError(
            "holding out systems needs a system_id for every text", file=source_of(source), column="system_id"
        )
    systems = source.drop_duplicates("text_id").set_index("text_id").system_id.reindex(tables.text_ids)
    if systems.isna().any():
        missing = systems.index[systems.isna()]
        raise InputError(
            f"{len(missing)} text(s) have no system_id (first: {missing[0]!r})",
            file=source_of(source),
            column="system_id",
        )
    return systems


def system_folds(tables) -> pd.DataFrame:
    """Leave-one-system-out folds: each system's texts form one fold (systems in sorted order)."""
    systems = text_systems(tables)
    source = _system_source(tables)
    names = sorted(systems.unique())
    unannotated = sorted(set(source.system_id.dropna()) - set(names))
    if unannotated:
        raise InputError(
            f"{len(unannotated)} system(s) have no annotated text to test on (first: {unannotated[0]!r})",
            file=source_of(source),
            column="system_id",
        )
    if len(names) < 2:
        raise InputError(
            f"holding out systems needs at least 2 systems, found {names}", file=source_of(source), column="system_id"
        )
    return pd.DataFrame(
        {
            "text_id": systems.index,
            "fold": systems.map({n: k for k, n in enumerate(names)}).to_numpy(),
            "system_id": systems.to_numpy(),
        }
    )


def system_group_folds(tables, k: int, seed: int) -> pd.DataFrame:
    """``k`` folds of whole systems: the systems, sorted then shuffled with ``seed``, dealt in turn into
    ``k`` groups (sizes differ by at most one), every text in its system's group."""
    folds = system_folds(tables)
    names = sorted(folds.system_id.unique())
    if not 2 <= k <= len(names):
        raise InputError(f"{k} groups of {len(names)} systems (use 2 to {len(names)})", setting="system_groups")
    order = np.random.default_rng(seed).permutation(len(names))
    group = dict(zip(np.array(names)[order], np.arange(len(names)) % k))
    return folds.assign(fold=folds.system_id.map(group).astype(int))


def system_groupings(tables, k: int, seed: int, seeds: int) -> pd.DataFrame:
    """``seeds`` groupings of :func:`system_group_folds` (seeds ``seed``, ``seed + 1``, …), each text once
    per grouping, with the grouping's index (0 is ``seed``'s) in column ``grouping``."""
    if seeds < 1:
        raise InputError(f"{seeds} groupings of the systems (use 1 or more)", setting="grouping_seeds")
    return pd.concat(
        [system_group_folds(tables, k, seed + g).assign(grouping=g) for g in range(seeds)], ignore_index=True
    )


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
    for column in ("fold", "grouping"):
        if column in folds:
            folds[column] = folds[column].astype(int)
    return folds
