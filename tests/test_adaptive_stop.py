"""The adaptive stop of sampled blocks: a Dirichlet posterior's spread against a tolerance, bounded by a maximum."""

import numpy as np
import pytest

from llmrubric.extract.adaptive_stop import needs_more, posterior_sd


def test_posterior_sd_is_the_dirichlet_formula():
    sd = posterior_sd([3, 0, 1])
    alpha = np.array([4.0, 1.0, 2.0])
    total = alpha.sum()
    assert sd == pytest.approx(np.sqrt(alpha * (total - alpha) / (total**2 * (total + 1))))


def test_a_confident_judge_stops_before_an_undecided_one():
    confident = [0] * 5
    undecided = [0] * 5
    while needs_more(confident, 0.1, 100):
        confident[0] += 1
    rng = np.random.default_rng(0)
    while needs_more(undecided, 0.1, 100):
        undecided[rng.integers(5)] += 1
    assert sum(confident) < sum(undecided) <= 100


def test_the_maximum_stops_any_block():
    assert needs_more([1, 1], 1e-6, 3)
    assert not needs_more([2, 1], 1e-6, 3)
