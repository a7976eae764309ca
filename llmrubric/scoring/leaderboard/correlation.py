"""Rank correlation between two leaderboards."""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError

log = logging.getLogger(__package__)  # llmrubric.scoring.leaderboard, as before the split


def rank_correlation(a: pd.Series, b: pd.Series, missing: str = "error", name_a: str = "a", name_b: str = "b") -> dict:
    """Spearman ρ and Kendall τ-b (ties get average ranks) between two system → score maps.

    Systems in only one of them: an :class:`InputError` (``missing="error"``), or left out
    and counted (``missing="drop"``, with a logged warning).
    """
    only_a, only_b = sorted(set(a.index) - set(b.index)), sorted(set(b.index) - set(a.index))
    if only_a or only_b:
        message = f"systems only in {name_a}: {only_a}; only in {name_b}: {only_b}"
        if missing == "error":
            raise InputError(message, file=name_b if only_a else name_a, column="system")
        log.warning("%s (left out of the rank correlation)", message)
    common = sorted(set(a.index) & set(b.index))
    x, y = a.reindex(common).to_numpy(float), b.reindex(common).to_numpy(float)
    out = {"systems": len(common), "left_out": only_a + only_b}
    if len(common) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        reason = (
            f"undefined: {len(common)} common system(s)"
            if len(common) < 2
            else f"undefined: constant scores in {name_a if np.ptp(x) == 0 else name_b}"
        )
        return {
            **out,
            "spearman": math.nan,
            "spearman_p": math.nan,
            "kendall": math.nan,
            "kendall_p": math.nan,
            "reason": reason,
        }
    rho, tau = stats.spearmanr(x, y), stats.kendalltau(x, y)
    return {
        **out,
        "spearman": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
        "kendall": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
    }
