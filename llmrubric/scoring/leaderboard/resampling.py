"""The bootstrap of system means: judges resampled once per replicate for all systems (differences are
paired by judge), each system's texts resampled, answers drawn from the predicted distributions."""

from __future__ import annotations

import math
import warnings

import numpy as np

from llmrubric.io.errors import InputError
from llmrubric.scoring.leaderboard.systems import SystemData

MEMORY_CELLS = 20_000_000  # float64 cells one bootstrap block may hold (about 160 MB)


def _replicate_text_scores(
    data: SystemData, text_idx: np.ndarray, judge_idx: np.ndarray, rng: np.random.Generator, sample: bool
) -> np.ndarray:
    """(B, n) judge-free text scores of replicates: texts ``text_idx`` (B, n), judges ``judge_idx`` (B, m).

    With ``sample`` every (text, judge) expected answer is replaced by a draw from p̂_a.
    """
    p = data.probs[text_idx[:, :, None], judge_idx[:, None, :]]  # (B, n, m, K)
    present = ~np.isnan(p[..., 0])
    p = np.nan_to_num(p)
    if sample:
        cdf = np.cumsum(p, axis=-1)
        u = rng.random(cdf.shape[:-1])[..., None] * cdf[..., -1:]
        y = data.values[np.minimum((u >= cdf).sum(axis=-1), len(data.values) - 1)]
    else:
        y = p @ data.values
    with np.errstate(invalid="ignore"):
        return np.where(present, y, 0).sum(axis=-1) / present.sum(axis=-1)


def bootstrap(
    systems: list[SystemData], n_boot: int = 1000, seed: int = 0, sample_answers: bool = True, keep_text_scores: int = 0
) -> dict:
    """Bootstrap replicates of every system's mean score.

    Returns ``{"means": {system: (n_boot,)}, "text_scores": {system: [(n,) arrays]}}``; the
    judges drawn in a replicate are the same for all systems. ``keep_text_scores`` keeps the
    text scores of the first replicates (for density bands).
    """
    if n_boot < 1:
        raise InputError(f"bootstrap samples must be >= 1, got {n_boot}", column="bootstrap")
    rng = np.random.default_rng(seed)
    m = systems[0].probs.shape[1]
    judge_idx = rng.integers(0, m, (n_boot, m))
    means = {s.system: np.empty(n_boot) for s in systems}
    kept: dict[str, list] = {s.system: [] for s in systems}
    for s in systems:
        n, k = s.probs.shape[0], s.probs.shape[2]
        block = max(1, MEMORY_CELLS // max(1, n * m * k * 3))
        srng = np.random.default_rng([seed, len(s.system), *map(ord, s.system)])
        for lo in range(0, n_boot, block):
            hi = min(n_boot, lo + block)
            text_idx = srng.integers(0, n, (hi - lo, n))
            scores = _replicate_text_scores(s, text_idx, judge_idx[lo:hi], srng, sample_answers)
            with np.errstate(invalid="ignore"):
                means[s.system][lo:hi] = np.nanmean(scores, axis=1)
            for row in scores[: max(0, keep_text_scores - lo)]:
                kept[s.system].append(row[~np.isnan(row)])
    return {"means": means, "text_scores": kept}


def interval(values: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile interval of bootstrap values (NaN replicates ignored)."""
    v = values[~np.isnan(values)]
    if not len(v):
        return math.nan, math.nan
    return float(np.quantile(v, alpha / 2)), float(np.quantile(v, 1 - alpha / 2))


def simultaneous_intervals(
    replicates: np.ndarray, centres: np.ndarray, alpha: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ``centre_k ± c·sd_k`` that hold for all K rows of ``replicates`` (K, B) jointly at 1 − ``alpha``.

    The max-t device: sd_k is row k's standard deviation over the replicates, T_b = max_k |m_kb − centre_k| / sd_k
    and c the (1 − alpha) quantile of T_b. NaN replicates are ignored; a row with sd_k = 0 is its centre."""
    replicates, centres = np.atleast_2d(np.asarray(replicates, float)), np.asarray(centres, float)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows and replicates
        sd = np.nanstd(replicates, axis=1, ddof=1) if replicates.shape[1] > 1 else np.full(len(centres), np.nan)
        scaled = np.abs(replicates - centres[:, None]) / sd[:, None]
        t = np.nanmax(np.where(sd[:, None] > 0, scaled, np.nan), axis=0)
    t = t[np.isfinite(t)]
    c = float(np.quantile(t, 1 - alpha)) if len(t) else 0.0
    half = np.where(sd > 0, c * sd, 0.0)
    return centres - half, centres + half
