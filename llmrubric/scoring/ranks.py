"""The order of systems by a score, with ties: shared by the leaderboard (mean text score) and the system level."""

from __future__ import annotations

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
