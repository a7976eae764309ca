"""Calibration of predicted answer distributions: smoothed ECE (relplot) and reliability diagrams.

For each answer value ``v`` of a question, the binary problem is "did the judge answer
``v``?" with forecast ``p(v)``; smECE (Błasiok and Nakkiran, 2023) is the kernel-smoothed
mean |E[y | f] - f| at relplot's automatically chosen bandwidth. Its 95 % interval is a
seeded basic bootstrap over pairs (scipy.stats.bootstrap, as relplot does). The same is computed per
judge and per system where a group has enough examples; smaller groups are skipped with
a note, never an error.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import relplot
from scipy import stats

from llmrubric.io.errors import InputError

MIN_GROUP_EXAMPLES = 30


def smece(f: np.ndarray, y: np.ndarray) -> float:
    """Smoothed ECE of forecasts f (n,) in [0, 1] for binary outcomes y (n,)."""
    f, y = np.asarray(f, float), np.asarray(y, float)
    if len(f) == 0:
        raise InputError("smECE needs at least one example")
    if not np.isfinite(f).all() or (f < -1e-9).any() or (f > 1 + 1e-9).any():
        raise InputError("smECE forecasts must be finite probabilities in [0, 1]")
    return float(relplot.smECE(np.clip(f, 0.0, 1.0), y))


def smece_interval(
    f: np.ndarray, y: np.ndarray, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(smECE, low, high): the value ± the half-width of a basic bootstrap interval, clipped at 0.

    As relplot reports it (``smECE ± w``): resampled smECE is biased upwards, so the
    reverse-percentile ("basic") interval can lie entirely below the estimate; its largest
    distance from the estimate is used on both sides.
    """
    f, y = np.clip(np.asarray(f, float), 0.0, 1.0), np.asarray(y, float)
    value = smece(f, y)
    if n_resamples < 2 or len(f) < 2:
        return value, math.nan, math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        res = stats.bootstrap(
            (f, y),
            lambda a, b: relplot.smECE(a, b),
            paired=True,
            vectorized=False,
            n_resamples=n_resamples,
            method="basic",
            confidence_level=confidence,
            rng=np.random.default_rng(seed),
        )
    width = max(abs(value - float(res.confidence_interval.low)), abs(float(res.confidence_interval.high) - value))
    return value, max(0.0, value - width), value + width


@dataclass
class GroupResult:
    """smECE of each answer value for one group of pairs (all, one judge, one system)."""

    kind: str
    group: str
    n: int
    rows: list[dict]


def calibration_by_answer(
    probs: np.ndarray,
    answer_index: np.ndarray,
    keys: tuple[str, ...],
    n_resamples: int,
    seed: int,
    kind: str = "all",
    group: str = "all",
) -> GroupResult:
    """smECE with interval for each answer value: probs (n, options), answer_index (n,)."""
    rows = []
    for j, key in enumerate(keys):
        y = (answer_index == j).astype(float)
        value, low, high = smece_interval(probs[:, j], y, n_resamples, seed + j)
        rows.append(
            {
                "kind": kind,
                "group": group,
                "answer": key,
                "n": int(len(y)),
                "positives": int(y.sum()),
                "mean_forecast": float(probs[:, j].mean()),
                "frequency": float(y.mean()),
                "smece": value,
                "low": low,
                "high": high,
            }
        )
    return GroupResult(kind, group, len(answer_index), rows)


def calibration_groups(
    probs: np.ndarray,
    answer_index: np.ndarray,
    keys: tuple[str, ...],
    groups: dict[str, pd.Series],
    min_examples: int = MIN_GROUP_EXAMPLES,
    n_resamples: int = 1000,
    seed: int = 0,
) -> tuple[list[GroupResult], list[str]]:
    """Pooled smECE, then per group (``{"judge": judge ids, "system": system ids}``, aligned with rows).

    Groups with fewer than ``min_examples`` pairs are skipped; the returned notes say which.
    """
    results = [calibration_by_answer(probs, answer_index, keys, n_resamples, seed)]
    notes = []
    for kind, ids in groups.items():
        ids = pd.Series(np.asarray(ids, dtype=object)).reset_index(drop=True)
        if ids.isna().all():
            notes.append(f"no {kind} ids in the data: per-{kind} calibration skipped")
            continue
        skipped = []
        for group, rows in sorted(ids.groupby(ids, sort=False).indices.items(), key=lambda kv: str(kv[0])):
            if len(rows) < min_examples:
                skipped.append(f"{group} ({len(rows)})")
                continue
            results.append(
                calibration_by_answer(probs[rows], answer_index[rows], keys, n_resamples, seed, kind, str(group))
            )
        if skipped:
            notes.append(
                f"per-{kind} calibration skipped for {len(skipped)} {kind}(s) with fewer than {min_examples} pairs: {', '.join(skipped)}"
            )
    return results, notes


@contextlib.contextmanager
def _seeded_global_rng(seed: int):
    """relplot's bootstrap band uses scikit-learn bagging on NumPy's global RNG: seed it, then restore it."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def reliability_diagram(
    f: np.ndarray, y: np.ndarray, value: float, low: float, high: float, num_bootstrap: int = 100, seed: int = 0
) -> dict:
    """relplot's reliability-diagram data (curve, 95 % band, densities) with our seeded smECE interval."""
    f, y = np.clip(np.asarray(f, float), 0.0, 1.0), np.asarray(y, float)
    with _seeded_global_rng(seed), np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*from_records.*")
        diagram = relplot.prepare_rel_diagram(
            f, y, plot_confidence_band=num_bootstrap > 1, num_bootstrap=max(num_bootstrap, 2), report_CE_std=False
        )
    diagram["ce"] = value
    if np.isfinite(low) and np.isfinite(high):
        diagram["ce_ci_width"] = max(value - low, high - value)
    return diagram
