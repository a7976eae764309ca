"""The adaptive stop of sampled blocks: answers in proportion to their (shrunk) spread, at least two, at most a
maximum."""

import numpy as np
import pytest

from llmrubric.extract.adaptive_stop import MIN_SAMPLES, needs_more, option_values, prior_spread, shrunk_spread, spread


def test_spread_is_the_unbiased_sd_of_the_answers_values_or_of_the_option_indicators():
    answers = np.array([1.0, 1.0, 3.0, 4.0])
    assert spread([2, 0, 1, 1], [1, 2, 3, 4]) == pytest.approx(answers.std(ddof=1))
    p = np.array([2, 1, 1]) / 4
    assert spread([2, 1, 1]) == pytest.approx(np.sqrt(p @ (1 - p) * 4 / 3))
    assert spread([1, 0, 0], [1, 2, 3]) == 0.0


def test_shrunk_spread_pulls_few_answers_toward_half_the_gap():
    assert prior_spread([1, 2, 3, 4, 5]) == 0.5 and prior_spread([0, 10, 20]) == 5.0 and prior_spread(None) == 0.5
    assert shrunk_spread([2, 0, 0], [1, 2, 3]) == pytest.approx(np.sqrt(0.25 / 2))  # one dof of prior, one of data
    many = [50, 50]
    assert shrunk_spread(many, [0, 1]) == pytest.approx(spread(many, [0, 1]), rel=0.01)  # the data outweigh it


def test_a_confident_judge_stops_after_a_few_answers_and_an_undecided_one_samples_more():
    values = [1, 2, 3, 4, 5]
    confident = [0] * 5
    while needs_more(confident, 0.1, 100, values):
        confident[0] += 1
    assert MIN_SAMPLES <= sum(confident) <= 4  # sqrt(0.25 / n) <= 0.1 n from n = 3
    rng = np.random.default_rng(0)
    undecided = [0] * 5
    while needs_more(undecided, 0.1, 100, values):
        undecided[rng.integers(5)] += 1
    assert sum(undecided) >= shrunk_spread(undecided, values) / 0.1 > 10


def test_the_maximum_stops_any_block():
    assert needs_more([1, 1], 1e-6, 3)
    assert not needs_more([2, 1], 1e-6, 3)


def test_options_are_a_scale_when_every_one_is_a_number():
    assert option_values(["1", "2", "5"]) == [1.0, 2.0, 5.0]
    assert option_values(["yes", "no"]) is None
