"""When a sampled block has enough answers (docs/extract.md, "Adaptive stop"): answers in proportion to the
judge's spread on it, n >= spread / tolerance, at least :data:`MIN_SAMPLES` and at most a maximum. The spread is
estimated from the answers so far, shrunk toward a prior spread so that two agreeing answers do not stop a block
(a stop on an estimate of zero reads an undecided judge as sure whenever its first answers happen to agree).

Why spread and not a precision: a rule that stops every block at the same precision (a posterior sd at most a
tolerance) spends n ~ spread² per block, and the sum of the blocks' squared errors it leaves equals fixed k's at
the same mean n: it saves nothing. Neyman's allocation, n ~ spread, is the one that leaves the least summed
squared error for the answers spent; the stop follows it with the spread estimated from the answers so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_SAMPLES = 2  # the fewest answers that estimate a spread
PRIOR_WEIGHT = 1.0  # degrees of freedom of the prior spread


def moments(p: Sequence[float], values: Sequence[float] | None = None) -> tuple[float | None, float]:
    """(expected value, spread) of a distribution ``p`` over the options: the mean and standard deviation of their
    value on a numeric scale (``values``), else no mean and the options' indicators' spread (the square root of
    the summed variances)."""
    p = np.asarray(p, dtype=float)
    if values is None:
        return None, float(np.sqrt(p @ (1.0 - p)))
    v = np.asarray(values, dtype=float)
    mean = float(p @ v)
    return mean, float(np.sqrt(max(float(p @ v**2) - mean**2, 0.0)))


def spread(counts: Sequence[int], values: Sequence[float] | None = None) -> float:
    """The answers' spread (:func:`moments` of their shares), unbiased; 0 for fewer than two answers."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    if n < 2:
        return 0.0
    return moments(counts / n, values)[1] * float(np.sqrt(n / (n - 1.0)))


def prior_spread(values: Sequence[float] | None) -> float:
    """The spread a block is believed to have before its answers: half the median gap between adjacent values
    on a scale, 0.5 for categories."""
    if values is None or len(values) < 2:
        return 0.5
    return float(np.median(np.diff(np.sort(np.asarray(values, dtype=float))))) / 2.0


def shrunk_spread(counts: Sequence[int], values: Sequence[float] | None = None) -> float:
    """The answers' spread (:func:`spread`) shrunk toward :func:`prior_spread` by :data:`PRIOR_WEIGHT` degrees of
    freedom, so that a few agreeing answers do not read as certain."""
    n = float(sum(counts))
    dof = max(n - 1.0, 0.0)
    variance = (dof * spread(counts, values) ** 2 + PRIOR_WEIGHT * prior_spread(values) ** 2) / (dof + PRIOR_WEIGHT)
    return float(np.sqrt(variance))


def needs_more(
    counts: Sequence[int], tolerance: float, max_samples: int, values: Sequence[float] | None = None
) -> bool:
    """Whether a block of these answer counts needs another answer: fewer than :data:`MIN_SAMPLES`, or fewer than
    ``shrunk spread / tolerance`` (:func:`shrunk_spread`), and always fewer than ``max_samples``."""
    n = int(sum(counts))
    if n >= max_samples:
        return False
    return n < MIN_SAMPLES or n * tolerance < shrunk_spread(counts, values)


def option_values(options: Sequence) -> list[float] | None:
    """The options' values when every option is a number (a scale), else None (categories)."""
    try:
        return [float(o) for o in options]
    except (TypeError, ValueError):
        return None
