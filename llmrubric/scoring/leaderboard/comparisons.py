"""Every pair of systems: the difference of their scores, its bootstrap interval and a test (paired by query
where texts share queries, else unpaired), Holm-adjusted over the pairs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.scoring.leaderboard.resampling import interval
from llmrubric.scoring.leaderboard.systems import SystemData


def compare_systems(systems: list[SystemData], boot: dict, alpha: float = 0.05) -> pd.DataFrame:
    """Every pair of systems: score difference, its bootstrap interval and p-value, and a test.

    Texts of two systems that share ``query_id`` values are paired by query (mean text score
    per query): paired t-test and Wilcoxon signed-rank test on the common queries. Otherwise
    the test is Welch's t-test and the Mann-Whitney U test on text scores. ``p_holm`` is the
    Holm-adjusted t-test p-value over all pairs.
    """
    rows = []
    scores = {s.system: s.text_scores() for s in systems}
    for i, a in enumerate(systems):
        for b in systems[i + 1 :]:
            diff = boot["means"][a.system] - boot["means"][b.system]
            low, high = interval(diff, alpha)
            d = diff[~np.isnan(diff)]
            p_boot = float(min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean()))) if len(d) else math.nan
            row = {
                "system_a": a.system,
                "system_b": b.system,
                "diff": float(np.nanmean(scores[a.system]) - np.nanmean(scores[b.system])),
                "low": low,
                "high": high,
                "p_bootstrap": p_boot,
            }
            row.update(_test(a, b, scores[a.system], scores[b.system]))
            rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        out["p_holm"] = holm(out["p_t"].to_numpy())
    return out


def _test(a: SystemData, b: SystemData, sa: np.ndarray, sb: np.ndarray) -> dict:
    if a.query_ids is not None and b.query_ids is not None:
        qa = pd.Series(sa, index=a.query_ids).groupby(level=0).mean()
        qb = pd.Series(sb, index=b.query_ids).groupby(level=0).mean()
        common = qa.index.intersection(qb.index)
        if len(common) >= 2:
            x, y = qa[common].to_numpy(), qb[common].to_numpy()
            t = stats.ttest_rel(x, y)
            w = stats.wilcoxon(x, y) if np.any(x != y) else None
            return {
                "test": "paired",
                "n": int(len(common)),
                "p_t": float(t.pvalue) if np.isfinite(t.pvalue) else 1.0,
                "p_rank": float(w.pvalue) if w is not None else 1.0,
            }
    x, y = sa[~np.isnan(sa)], sb[~np.isnan(sb)]
    t = stats.ttest_ind(x, y, equal_var=False)
    u = stats.mannwhitneyu(x, y, alternative="two-sided")
    return {
        "test": "unpaired",
        "n": int(min(len(x), len(y))),
        "p_t": float(t.pvalue) if np.isfinite(t.pvalue) else 1.0,
        "p_rank": float(u.pvalue),
    }


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted
