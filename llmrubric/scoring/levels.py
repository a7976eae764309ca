"""Leaderboards by the system level of a model that has one (:mod:`llmrubric.model.core.system_level`).

``llmrubric score texts`` with such a model writes ``<scores>.levels.csv``: per system the posterior
mean ``level`` of its human mean and its ``level_sd`` (the prior from the system's LLM answers for a
new system; close to its own labels' mean for a training one) and the within-system residual spread
``sigma_within``. ``leaderboard build --levels`` ranks the systems by their level and adds its
interval ``level ± z·sd``. With human labels of k texts of a new system (``--annotations``) the
posterior narrows: the labels estimate the level by ``level + mean over the labelled texts of
(human − predicted score)`` with variance ``sigma_within² / k``, combined with the prior by the
normal–normal update. A training system's level already holds its training labels and is kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError


def read_levels(path: str | Path) -> pd.DataFrame:
    """A levels table of ``score texts`` (``system_id, level, level_sd, known, sigma_within``), indexed by system."""
    from llmrubric.scoring.leaderboard.reading import read_system_values

    table = read_system_values(path, "levels table", lambda columns: ["level", "level_sd", "sigma_within"])
    if (table.level_sd < 0).any() or (table.sigma_within < 0).any():
        raise InputError("level_sd and sigma_within must be >= 0", file=str(path), column="level_sd")
    from llmrubric.io.tables import read_nonempty

    raw = read_nonempty(Path(path), "levels table")
    known = raw["known"] if "known" in raw.columns else pd.Series(False, index=raw.index)
    table["known"] = known.astype(str).str.strip().str.lower().isin(["true", "1"]).to_numpy()
    return table


def with_level_intervals(
    board: pd.DataFrame, levels: pd.DataFrame, systems: list, labels: pd.Series | None, alpha: float = 0.05
) -> pd.DataFrame:
    """``board`` with ``level, level_low, level_high, level_labels`` (module doc), ranked by level."""
    missing = sorted(set(board.system) - set(levels.index))
    if missing:
        raise InputError(f"systems {missing} are not in the levels table", column="system_id")
    z = stats.norm.ppf(1 - alpha / 2)
    rows = []
    for data in systems:
        row = levels.loc[data.system]
        mean, var, k = float(row.level), float(row.level_sd) ** 2, 0
        if labels is not None and not row.known:
            scores = pd.Series(data.text_scores(), index=data.text_ids)
            labelled = labels.reindex(data.text_ids).dropna()
            k = len(labelled)
            if k and row.sigma_within > 0:
                estimate = mean + float((labelled - scores.reindex(labelled.index)).mean())
                precision = 1.0 / max(var, 1e-12) + k / float(row.sigma_within) ** 2
                mean = (mean / max(var, 1e-12) + estimate * k / float(row.sigma_within) ** 2) / precision
                var = 1.0 / precision
        rows.append(
            {
                "system": data.system,
                "level": mean,
                "level_low": mean - z * np.sqrt(var),
                "level_high": mean + z * np.sqrt(var),
                "level_labels": k,
            }
        )
    out = board.drop(columns="rank").merge(pd.DataFrame(rows), on="system", how="left")
    out = out.sort_values(["level", "system"], ascending=[False, True], kind="stable").reset_index(drop=True)
    out.insert(0, "rank", stats.rankdata(-out.level.to_numpy(), method="average"))
    return out
