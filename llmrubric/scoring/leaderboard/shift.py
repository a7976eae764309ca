"""Shift intervals: each score widened by the errors a leave-one-system-out run measured on held-out
systems (:mod:`llmrubric.evaluation.transfer`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.scoring.ranks import rank_intervals


def rms(errors) -> float:
    """Root mean square of shift errors: sqrt(mean e²)."""
    return math.sqrt(float(np.mean(np.square(np.asarray(errors, float)))))


def shift_half_width(errors, alpha: float = 0.05) -> float:
    """Half-width of the interval for a new system's human mean from the shift ``errors`` of K
    other systems (each measured with that system held out): ``t_{K, 1-α/2} · sqrt(mean e²)``,
    a prediction interval for one more system's error (errors exchangeable, roughly normal)."""
    return float(stats.t.ppf(1 - alpha / 2, df=len(errors)) * rms(errors))


def with_shift_interval(board: pd.DataFrame, errors: pd.Series, alpha: float = 0.05) -> pd.DataFrame:
    """``board`` with ``shift_low``/``shift_high``: each score ± :func:`shift_half_width` of ``errors``; and
    ``shift_rank_low``/``shift_rank_high``: the ranks of the K systems' human means, jointly at 1 − alpha, from the
    Bonferroni intervals score ± :func:`shift_half_width` at alpha / K (:func:`rank_intervals`)."""
    half, joint = shift_half_width(errors, alpha), shift_half_width(errors, alpha / max(1, len(board)))
    rank_low, rank_high = rank_intervals(board.score - joint, board.score + joint)
    return board.assign(
        shift_low=board.score - half,
        shift_high=board.score + half,
        shift_rank_low=rank_low,
        shift_rank_high=rank_high,
    )
