"""The order of systems by a score, with ties, and the ranks that intervals of the scores allow: shared by the
leaderboard (mean text score) and the system level."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

# Scores equal to this many decimals tie: below it is float noise (with a system level, every text of a new system
# is tilted to the same level, and systems whose levels are equal differ in the 11th decimal)
TIE_DECIMALS = 9


def by_score(board: pd.DataFrame, column: str) -> pd.DataFrame:
    """``board`` sorted by ``column`` (descending, then by system) with ``rank`` first: the average rank, shared by
    scores equal to :data:`TIE_DECIMALS` decimals."""
    key = board[column].round(TIE_DECIMALS)
    order = board.assign(_key=key).sort_values(["_key", "system"], ascending=[False, True], kind="stable")
    out = order.drop(columns="_key").reset_index(drop=True)
    out.insert(0, "rank", stats.rankdata(-order._key.to_numpy(), method="average"))
    return out


def rank_intervals(low, high) -> tuple[np.ndarray, np.ndarray]:
    """The ranks (1 = highest score) each of K systems can hold, given intervals ``[low_k, high_k]`` of their scores.

    System j: ``[1 + #{k: low_k > high_j}, K − #{k: high_k < low_j}]`` (Klein, Wright and Wieczorek 2020): when the
    K intervals hold jointly at 1 − α, so do the K rank intervals. A NaN bound orders nothing (ranks 1 to K)."""
    low, high = np.asarray(low, float), np.asarray(high, float)
    above = (low[None, :] > high[:, None]).sum(axis=1)
    below = (high[None, :] < low[:, None]).sum(axis=1)
    return 1 + above, len(low) - below
