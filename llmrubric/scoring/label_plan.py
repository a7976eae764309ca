"""How many human labels a new system needs: for a target interval width of its mean, and for telling two
systems apart, under the estimator ``leaderboard build --levels --annotations`` ships (the system level's prior
updated by the PPI++ estimate of k labels, :func:`llmrubric.scoring.levels.level_posterior`; PPI++ alone for a
model without a level).

Assumptions (each one printed by ``llmrubric label plan``):

- the k labelled texts are drawn uniformly at random from the system's N texts;
- a label Y and the calibrated score f of a text differ by a system offset plus a residual of variance σ²,
  uncorrelated with f (so Cov(Y, f) = Var f): σ² comes from labels of other texts (``residual_source``);
- PPI++ with ppi_py's power tuning λ = Cov(Y, f) / ((1 + k/(N − k)) Var f) = 1 / (1 + k/(N − k)), its variance
  λ² Var f / (N − k) + Var(Y − λf) / k with Var(Y − λf) = σ² + (1 − λ)² Var f (Angelopoulos et al. 2024);
- Student's small-sample widening, as the leaderboard applies it: the PPI++ half-width times t_{k−1}/z, and the
  posterior's half-width (prior precision plus the labels' precision) times t_{k−1}/z again;
- the width target is met with probability ``assurance``: the sample variance of Y − λf over k labels is taken at
  its ``assurance`` quantile σ_r² χ²_{assurance, k−1} / (k − 1) (normal residuals), not at its mean; with several
  residual variances (one per training system: a new system's is one of them, each as likely), at the
  ``assurance`` quantile of their mixture;
- from the transport check's floor of labels on (``checked_from``) the plan is for PPI++ alone, the interval the
  leaderboard falls back to when the check fails (never narrower than the posterior), and a system with a level
  gets at least that floor (fewer labels, or none, would trust the level's prior without checking it);
- a difference ``delta`` between two systems is detected by the two-sided test at ``alpha`` of their estimates'
  difference (independent labels, variances added) with probability ``power``:
  ``(t_{k−1, 1−alpha/2} + t_{k−1, power}) · sqrt(se_a² + se_b²) <= delta``, each se at the residual variance's mean.

The system's f (its N scores and their variance) and its prior's variance come from the checkpoint's
predictions of its texts; nothing here reads the system's labels unless given as pilot labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError

MIN_K = 2  # the PPI++ interval needs two labels
MIN_UNLABELLED = 2  # and two unlabelled texts (fewer: the classical mean)


@dataclass(frozen=True)
class SystemPlanInput:
    """What the plan knows of one new system before its labels: ``texts`` (N), ``var_f`` (ddof 0 variance of its
    N calibrated scores) and ``prior_var`` (the variance of its level's prior; ``math.inf``: no level)."""

    system: str
    texts: int
    var_f: float
    prior_var: float = math.inf


def lam(k: int, n: int) -> float:
    """ppi_py's power-tuned λ at its population value under the module's assumptions (Cov(Y, f) = Var f)."""
    return 1.0 / (1.0 + k / (n - k))


def student_factor(k: int, alpha: float, small_sample: str = "student") -> float:
    """t_{k−1, 1−alpha/2} / z_{1−alpha/2} (1 for ``normal``)."""
    if small_sample == "normal":
        return 1.0
    return float(stats.t.ppf(1 - alpha / 2, k - 1) / stats.norm.ppf(1 - alpha / 2))


def sample_variance_quantile(variances: np.ndarray, k: int, quantile: float) -> float:
    """The ``quantile`` of the sample variance of k normal residuals whose variance is one of ``variances``, each as
    likely: q with mean_s P(σ_s² χ²_{k−1} / (k − 1) <= q) = quantile."""
    v = np.asarray(variances, float)
    if len(v) == 1 or np.ptp(v) == 0:
        return float(v[0] * stats.chi2.ppf(quantile, k - 1) / (k - 1))

    def short(q: float) -> float:
        return float(np.mean(stats.chi2.cdf((k - 1) * q / v, k - 1)) - quantile)

    from scipy.optimize import brentq

    return float(brentq(short, 1e-12, v.max() * stats.chi2.ppf(quantile, k - 1) / (k - 1) * 2 + 1e-9))


def label_variance(
    k: int, system: SystemPlanInput, sigma2, alpha: float, small_sample: str, quantile: float | None
) -> float:
    """The variance the leaderboard reads off the PPI++ interval of k labels (Student-widened); the residual
    variance at its ``quantile`` over draws of the k labels (None: its mean). ``sigma2``: one residual variance,
    or several (module doc)."""
    n = system.texts
    lm = lam(k, n)
    residuals = np.atleast_1d(np.asarray(sigma2, float)) + (1 - lm) ** 2 * system.var_f
    if quantile is None:
        residual = float(residuals.mean())
    else:
        residual = sample_variance_quantile(residuals, k, quantile)
    bessel = k / (k - 1) if small_sample == "student" else 1.0  # the leaderboard's sqrt(k/(k-1)) on ddof-0 spreads
    variance = bessel * lm**2 * system.var_f / (n - k) + residual / k
    return variance * student_factor(k, alpha, small_sample) ** 2


def posterior_half_width(
    k: int,
    system: SystemPlanInput,
    sigma2: float | np.ndarray,
    alpha: float = 0.05,
    small_sample: str = "student",
    quantile: float | None = None,
) -> float:
    """Half-width of the shipped interval with k labels (module doc): the prior and the labels' precision,
    widened by t_{k−1}/z; PPI++ alone when the system has no prior (``prior_var`` infinite)."""
    z = stats.norm.ppf(1 - alpha / 2)
    label_var = label_variance(k, system, sigma2, alpha, small_sample, quantile)
    if not math.isfinite(system.prior_var):
        return float(z * math.sqrt(label_var))
    precision = 1 / max(system.prior_var, 1e-12) + 1 / label_var
    return float(z / math.sqrt(precision) * student_factor(k, alpha, small_sample))


def planned_width(
    k: int | None,
    system: SystemPlanInput,
    sigma2: float | np.ndarray,
    alpha: float,
    small_sample: str,
    assurance: float | None,
    checked_from: int | None = None,
) -> float:
    """The width k labels reach with probability ``assurance`` (None: at the residual variance's mean): the prior's
    own at k = 0, NaN for None; PPI++ alone from ``checked_from`` labels on (:func:`labels_for_width`)."""
    if k is None:
        return math.nan
    if k == 0:
        return float(2 * stats.norm.ppf(1 - alpha / 2) * math.sqrt(system.prior_var))
    if checked_from is not None and k >= checked_from:
        system = SystemPlanInput(system.system, system.texts, system.var_f, math.inf)
    return 2 * posterior_half_width(k, system, sigma2, alpha, small_sample, assurance)


def candidate_ks(system: SystemPlanInput, at_least: int | None = None) -> range:
    return range(max(MIN_K, at_least or 0), system.texts - MIN_UNLABELLED + 1)


def labels_for_width(
    width: float,
    system: SystemPlanInput,
    sigma2: float | np.ndarray,
    alpha: float = 0.05,
    small_sample: str = "student",
    assurance: float = 0.9,
    checked_from: int | None = None,
) -> int | None:
    """The fewest labels k whose interval is at most ``width`` wide with probability ``assurance``; 0 when the
    prior's interval alone is (``z·sd`` at most ``width``); None when no k up to N − 2 reaches it.
    ``checked_from``: from this many labels on the leaderboard's transport check may replace the posterior by
    PPI++ alone (:mod:`llmrubric.scoring.transport`), so from there k is planned for PPI++ alone (never narrower);
    and a system with a level gets at least that many: fewer would trust its prior unchecked (k = 0 included)."""
    check_plan(width, sigma2, alpha, assurance)
    if checked_from is None and math.isfinite(system.prior_var):
        if 2 * stats.norm.ppf(1 - alpha / 2) * math.sqrt(system.prior_var) <= width:
            return 0
    for k in candidate_ks(system, checked_from if math.isfinite(system.prior_var) else None):
        if planned_width(k, system, sigma2, alpha, small_sample, assurance, checked_from) <= width:
            return k
    return None


def labels_for_difference(
    delta: float,
    a: SystemPlanInput,
    b: SystemPlanInput,
    sigma2: float | np.ndarray,
    alpha: float = 0.05,
    power: float = 0.8,
    small_sample: str = "student",
    sigma2_b: float | np.ndarray | None = None,
    checked_from: int | None = None,
) -> int | None:
    """The fewest labels k per system (the same k for both) at which the difference ``delta`` of their means is
    detected at ``alpha`` with probability ``power`` (module doc); None when no k reaches it. ``sigma2_b``: b's
    residual variance when it differs from a's; ``checked_from``: as :func:`labels_for_width`."""
    check_plan(delta, sigma2, alpha, power)
    z = stats.norm.ppf(1 - alpha / 2)
    variances = (sigma2, sigma2 if sigma2_b is None else sigma2_b)
    for k in range(MIN_K, min(a.texts, b.texts) - MIN_UNLABELLED + 1):
        widths = [planned_width(k, s, v, alpha, small_sample, None, checked_from) for s, v in zip((a, b), variances)]
        crit = stats.t.ppf(1 - alpha / 2, k - 1) + stats.t.ppf(power, k - 1)
        if crit * math.hypot(*(w / (2 * z) for w in widths)) <= delta:
            return k
    return None


def residual_variance(labels: np.ndarray, scores: np.ndarray, systems: np.ndarray) -> tuple[float, int]:
    """σ² of labels around calibrated scores: the variance of Y − f about each system's own mean (pooled over
    systems, each system's mean removed, ``n − systems`` degrees of freedom), and the number of labels.
    :func:`system_residual_variances` keeps one per system."""
    y, f, s = np.asarray(labels, float), np.asarray(scores, float), np.asarray(systems)
    residual = y - f
    centred = np.concatenate([residual[s == g] - residual[s == g].mean() for g in np.unique(s)])
    dof = len(centred) - len(np.unique(s))
    if dof < 1:
        raise InputError("pilot labels need at least two labelled texts of one system", column="text_id")
    return float(np.sum(centred**2) / dof), len(centred)


def system_residual_variances(labels, scores, systems, min_labels: int = 5) -> np.ndarray:
    """One residual variance (ddof 1) of Y − f per system with at least ``min_labels`` labels."""
    frame = pd.DataFrame({"r": np.asarray(labels, float) - np.asarray(scores, float), "s": np.asarray(systems)})
    sizes = frame.groupby("s").r.size()
    return frame[frame.s.isin(sizes.index[sizes >= min_labels])].groupby("s").r.var(ddof=1).to_numpy(float)


def scaled_variances(variances, predicted: np.ndarray, new_predicted: float) -> np.ndarray:
    """A new system's residual variances from the training (or pilot) systems': each system's ratio of its residual
    variance to its mean predicted variance (the calibrator's own, of the trusted judges' answers), times the new
    system's mean predicted variance (a system whose answers the model is less sure of gets a larger residual)."""
    v, p = np.asarray(variances, float), np.asarray(predicted, float)
    return v / np.maximum(p, 1e-12) * float(new_predicted)


def check_plan(target: float, sigma2, alpha: float, probability: float) -> None:
    if not (math.isfinite(target) and target > 0):
        raise InputError(f"the target must be a positive number, not {target!r}", setting="--width/--difference")
    v = np.atleast_1d(np.asarray(sigma2, float))
    if not (len(v) and np.isfinite(v).all() and (v >= 0).all()):
        raise InputError(f"the residual variance must be >= 0, not {sigma2!r}", setting="--residual-sd")
    if not 0 < alpha < 1:
        raise InputError(f"alpha must be in (0, 1), not {alpha!r}", setting="--alpha")
    if not 0 < probability < 1:
        raise InputError(f"assurance and power must be in (0, 1), not {probability!r}", setting="--assurance/--power")
