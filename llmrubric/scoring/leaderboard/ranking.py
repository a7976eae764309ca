"""The order of the systems and their intervals: the leaderboard table of one question.

The seam for another ranking rule: :func:`leaderboard` takes the systems and the bootstrap replicates and
returns the table (``rank, system, score, low, high, texts``) that the label, shift and writing steps extend."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.scoring.leaderboard.resampling import interval
from llmrubric.scoring.leaderboard.systems import SystemData
from llmrubric.scoring.ranks import by_score


def leaderboard(systems: list[SystemData], boot: dict, alpha: float = 0.05) -> pd.DataFrame:
    """``rank, system, score, low, high, texts`` sorted by score (ties share the average rank: :func:`by_score`)."""
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
    return by_score(pd.DataFrame(rows), "score")
