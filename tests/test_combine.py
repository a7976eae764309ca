"""model=auto's combination rules (llmrubric.model.core.combine): Bayesian-bootstrap stacking agrees with the
stack where the inner folds agree, hedges where they disagree, and records how stable the weights are."""

from __future__ import annotations

import numpy as np
import pytest

from llmrubric.model.core.combine import bootstrap_weights, combine, mixture_weights, weights

FOLDS = np.repeat(np.arange(4), 100)


def nll(likelihood: np.ndarray, w: np.ndarray) -> float:
    return float(-np.log(likelihood @ w).mean())


def test_where_one_candidate_wins_every_fold_all_rules_give_it_the_weight():
    rng = np.random.default_rng(0)
    good, bad = rng.uniform(0.4, 0.9, 400), rng.uniform(0.05, 0.3, 400)
    likelihood = np.stack([bad, good], axis=1)
    for rule in ("select", "stack", "bb_stack", "bb_select"):
        assert weights(likelihood, rule, FOLDS, 50, 0)[1] > 0.95, rule


def test_where_the_folds_disagree_the_bootstrap_keeps_weight_on_the_candidate_that_wins_some_of_them():
    rng = np.random.default_rng(1)
    a = np.where(FOLDS == 0, rng.uniform(0.5, 0.9, 400), rng.uniform(0.25, 0.4, 400))  # wins one fold by far
    b = np.where(FOLDS == 0, rng.uniform(0.01, 0.05, 400), rng.uniform(0.3, 0.45, 400))  # wins the others a little
    likelihood = np.stack([a, b], axis=1)
    stacked, hedged = weights(likelihood, "stack"), weights(likelihood, "bb_stack", FOLDS, 200, 0)
    assert stacked[1] < 1e-3  # the pooled optimum bets on a: its one fold outweighs b's three
    assert 0.02 < hedged[1] < 0.2  # the draws that weigh b's folds more keep some of it
    assert bootstrap_weights(likelihood, FOLDS, 200, 0).std(axis=0).min() > 0.05  # and say that the folds disagree
    assert nll(likelihood[FOLDS > 0], hedged) < nll(likelihood[FOLDS > 0], stacked)


def test_the_bootstrap_is_reproducible_and_its_draws_are_weightings_of_the_folds():
    rng = np.random.default_rng(2)
    likelihood = rng.uniform(0.05, 0.9, (400, 3))
    first, again = bootstrap_weights(likelihood, FOLDS, 20, 7), bootstrap_weights(likelihood, FOLDS, 20, 7)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(first.sum(axis=1), 1.0, atol=1e-9)
    g = np.random.default_rng(7).dirichlet(np.ones(4), size=20)[0]  # the first draw's fold weights
    direct = mixture_weights(likelihood, (g / 100)[FOLDS], start=mixture_weights(likelihood))
    np.testing.assert_allclose(first[0], direct, atol=1e-12)


def test_the_stability_record_has_each_folds_weights_and_the_draws_spread():
    rng = np.random.default_rng(3)
    likelihood = rng.uniform(0.05, 0.9, (400, 2))
    fitted, record = combine(likelihood, "bb_stack", FOLDS, ["x", "y"], 30, 0)
    np.testing.assert_array_equal(fitted, weights(likelihood, "bb_stack", FOLDS, 30, 0))  # one bootstrap for both
    assert set(record["by_fold"]) == {0, 1, 2, 3} and record["draws"] == 30
    own = mixture_weights(likelihood[FOLDS == 2])
    assert record["by_fold"][2] == {"x": round(float(own[0]), 4), "y": round(float(own[1]), 4)}
    assert sum(record["bootstrap_mean"].values()) == pytest.approx(1.0, abs=1e-3)
    assert all(v >= 0 for v in record["bootstrap_sd"].values())


def test_bootstrap_selection_spreads_over_the_folds_winners_only():
    rng = np.random.default_rng(4)
    a = np.where(FOLDS < 2, rng.uniform(0.5, 0.6, 400), rng.uniform(0.3, 0.4, 400))  # wins folds 0, 1
    b = np.where(FOLDS < 2, rng.uniform(0.3, 0.4, 400), rng.uniform(0.5, 0.6, 400))  # wins folds 2, 3
    c = np.full(400, 0.42)  # never the best of a fold, but a stack's complement of both
    likelihood = np.stack([a, b, c], axis=1)
    chosen = weights(likelihood, "bb_select", FOLDS, 400, 0)
    assert chosen[2] == 0 and 0.3 < chosen[0] < 0.7 and chosen.sum() == pytest.approx(1.0)
    fitted, record = combine(likelihood, "bb_select", FOLDS, ["a", "b", "c"], 400, 0)
    np.testing.assert_array_equal(fitted, chosen)
    assert record["draws"] == 400
