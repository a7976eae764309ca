"""When a sampled block has enough answers: a Dirichlet(1 + counts) posterior over the option probabilities, known to a
tolerance once every option's posterior standard deviation is at most it (docs/extract.md, adaptive stop)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def posterior_sd(counts: Sequence[int]) -> np.ndarray:
    """Each option's posterior standard deviation under a uniform Dirichlet prior and these answer counts."""
    alpha = 1.0 + np.asarray(counts, dtype=float)
    total = alpha.sum()
    return np.sqrt(alpha * (total - alpha) / (total**2 * (total + 1.0)))


def needs_more(counts: Sequence[int], tolerance: float, max_samples: int) -> bool:
    """Whether a block of these answer counts needs another answer: some option's posterior sd exceeds ``tolerance``
    and fewer than ``max_samples`` answers were parsed."""
    if sum(counts) >= max_samples:
        return False
    return bool(posterior_sd(counts).max() > tolerance)
