"""The order of the systems and their intervals: the leaderboard table of one question.

The seam for another ranking rule: :func:`leaderboard` takes the systems and the bootstrap replicates and
returns the table (``rank, system, score, low, high, rank_low, rank_high, texts``) that the label, shift and
writing steps extend."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.scoring.leaderboard.resampling import interval, simultaneous_intervals
from llmrubric.scoring.leaderboard.systems import SystemData
from llmrubric.scoring.ranks import by_score, rank_intervals

RANK_METHOD = "max-t over the bootstrap replicates"


def leaderboard(systems: list[SystemData], boot: dict, alpha: float = 0.05) -> pd.DataFrame:
    """``rank, system, score, low, high, rank_low, rank_high, texts`` sorted by score (ties share the average rank:
    :func:`by_score`).

    ``low, high``: each system's percentile interval at 1 − alpha. ``rank_low, rank_high``: the ranks each system
    can hold, for all systems jointly at 1 − alpha: :func:`rank_intervals` of the max-t simultaneous intervals of
    the scores from the same replicates (:func:`simultaneous_intervals`)."""
    rows = []
    for s in systems:
        low, high = interval(boot["means"][s.system], alpha)
        rows.append(
            {
                "system": s.system,
                "score": float(np.nanmean(s.text_scores())),
                "low": low,
                "high": high,
                "texts": len(s.text_ids),
            }
        )
    board = pd.DataFrame(rows)
    joint = simultaneous_intervals(np.stack([boot["means"][s.system] for s in systems]), board.score, alpha)
    rank_low, rank_high = rank_intervals(*joint)
    board.insert(board.columns.get_loc("texts"), "rank_low", rank_low)
    board.insert(board.columns.get_loc("texts"), "rank_high", rank_high)
    return by_score(board, "score")
