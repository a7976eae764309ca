"""Does the calibration hold for this system? An equivalence test of a new system's calibrated scores against
its own human labels (the transport check of ``leaderboard build --levels --annotations``).

The calibrated score of a labelled text is the one the system's level implies, ``c_i = f_i − mean(f) + level``
(the level's prior mean before any label, ``f`` the judge-free scores of all the system's texts), and its residual
``r_i = y_i − c_i``; the mean residual estimates how far the level is from the system's human mean. Its interval
is Student's: the standard error from the residuals (clustered by query where texts have ``query_id``: the
residuals summed per query, G clusters, the CR1 factor G/(G − 1)), t with G − 1 degrees of freedom. With a
``margin`` m, two one-sided tests at ``alpha`` (TOST, Schuirmann 1987) read the 1 − 2·alpha interval:

- ``PASS``: inside (−m, m): the level agrees with the labels within the margin;
- ``FAIL``: disjoint from [−m, m]: the level is off by more than the margin;
- ``INCONCLUSIVE``: it overlaps an end of the margin: agreement is not shown;
- ``too few labels``: fewer than ``min_labels`` labels (or 2 clusters): not checked.

What the leaderboard does with a verdict (:mod:`llmrubric.scoring.levels`): PASS keeps the level's posterior;
FAIL and INCONCLUSIVE replace it by the PPI++ interval of the system's labels alone (its level's prior left out,
since the labels do not show it holds for this system); too few labels keeps the posterior, marked unchecked.
CJE's ``transport_audit`` (Landesberg et al.) grades the same three outcomes from its own interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError

PASS, FAIL, INCONCLUSIVE, TOO_FEW = "PASS", "FAIL", "INCONCLUSIVE", "too few labels"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, TOO_FEW)
FALLS_BACK = (FAIL, INCONCLUSIVE)


@dataclass(frozen=True)
class TransportSettings:
    """The check's ``margin`` (label scale; None: each system's own prior half-width z_{1−alpha/2}·level_sd, i.e.
    PASS when the labels put the level's error inside the level's own interval), its ``alpha`` (TOST at alpha: the
    1 − 2·alpha interval) and ``min_labels`` (fewer: too few labels)."""

    margin: float | None = None
    alpha: float = 0.05
    min_labels: int = 10

    def margin_of(self, prior_sd: float) -> float:
        return float(self.margin if self.margin is not None else stats.norm.ppf(1 - self.alpha / 2) * prior_sd)

    def describe(self) -> str:
        margin = f"{self.margin:g}" if self.margin is not None else "each system's prior half-width z*level_sd"
        return (
            f"TOST at alpha {self.alpha:g} of the mean residual (label - the level's calibrated score) of each new "
            f"system's labels: Student's t interval at {1 - 2 * self.alpha:g} (clustered by query_id where texts "
            f"have one), margin {margin}; PASS: inside the margin (level + PPI++ kept); FAIL: outside it, "
            f"INCONCLUSIVE: across its end (both: the PPI++ interval of the labels alone); fewer than "
            f"{self.min_labels} labels: not checked (level + PPI++ kept)"
        )


def mean_residual_interval(residuals: np.ndarray, clusters: np.ndarray | None, coverage: float) -> dict:
    """``estimate, low, high, clusters, df`` of the mean residual: Student's interval at ``coverage``, clustered."""
    r = np.asarray(residuals, float)
    n = len(r)
    groups = np.arange(n) if clusters is None else pd.factorize(np.asarray(clusters))[0]
    sums = np.bincount(groups, weights=r - r.mean())
    g = len(sums)
    if g < 2:
        return {"estimate": float(r.mean()), "low": math.nan, "high": math.nan, "clusters": g, "df": 0}
    se = math.sqrt(g / (g - 1) * np.sum(sums**2)) / n
    half = stats.t.ppf(0.5 + coverage / 2, g - 1) * se
    return {
        "estimate": float(r.mean()),
        "low": float(r.mean() - half),
        "high": float(r.mean() + half),
        "clusters": g,
        "df": g - 1,
    }


def transport_check(
    labels: np.ndarray,
    calibrated: np.ndarray,
    margin: float,
    alpha: float = 0.05,
    min_labels: int = 10,
    clusters: np.ndarray | None = None,
) -> dict:
    """The verdict (module doc) of labels against calibrated scores of the same texts: ``verdict, residual, low,
    high`` (the 1 − 2·alpha interval of the mean residual), ``labels``, ``clusters``, ``margin``."""
    check_transport_settings(margin, alpha, min_labels)
    y, c = np.asarray(labels, float), np.asarray(calibrated, float)
    out = mean_residual_interval(y - c, clusters, 1 - 2 * alpha) if len(y) else {"estimate": math.nan, "clusters": 0}
    base = {"labels": len(y), "clusters": out["clusters"], "margin": float(margin), "residual": out["estimate"]}
    if len(y) < min_labels or out["clusters"] < 2:
        return {**base, "verdict": TOO_FEW, "low": math.nan, "high": math.nan}
    low, high = out["low"], out["high"]
    if -margin < low and high < margin:
        verdict = PASS
    elif high < -margin or low > margin:
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    return {**base, "verdict": verdict, "low": low, "high": high}


def check_transport_settings(margin: float, alpha: float, min_labels: int) -> None:
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise InputError(f"the transport margin must be a positive number, not {margin!r}", setting="transport_margin")
    if not 0 < alpha < 0.5:
        raise InputError(f"the transport check's alpha must be in (0, 0.5), not {alpha!r}", setting="alpha")
    if not (isinstance(min_labels, int) and min_labels >= 2):
        raise InputError(
            f"transport_min_labels must be an integer >= 2, not {min_labels!r}", setting="transport_min_labels"
        )
