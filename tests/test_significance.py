"""Paired permutation tests, bootstrap intervals, alignment by key and Table 1-style marks."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from llmrubric.evaluation import significance
from llmrubric.evaluation.significance import (
    SwapStatistics,
    align_methods,
    bootstrap_intervals,
    compare_methods,
    paired_permutation_test,
    superscripts,
)
from llmrubric.io.errors import InputError


def data(n=200, seed=0, noise_a=0.8, noise_b=1.2):
    rng = np.random.default_rng(seed)
    y = rng.integers(1, 5, n).astype(float)
    a = y + rng.normal(0, noise_a, n)
    b = np.clip(np.round(y + rng.normal(0, noise_b, n)), 1, 4)
    return y, a, b


@pytest.mark.parametrize("pairwise_max", [10_000, 10])
def test_swap_statistics_equal_scipy_on_every_permutation(monkeypatch, pairwise_max):
    monkeypatch.setattr(significance, "PAIRWISE_MAX", pairwise_max)
    y, a, b = data(150)
    stat = SwapStatistics(y, a, b, significance.POINT_METRICS)
    assert stat.pairwise == (pairwise_max > 150)
    s = (np.random.default_rng(1).random((6, len(y))) < 0.5).astype(np.float32)
    first, second = stat(s)
    for r in range(len(s)):
        for out, x in ((first, np.where(s[r] > 0, b, a)), (second, np.where(s[r] > 0, a, b))):
            assert out["rmse"][r] == pytest.approx(np.sqrt(np.mean((x - y) ** 2)), abs=1e-12)
            assert out["pearson"][r] == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
            assert out["spearman"][r] == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
            assert out["kendall"][r] == pytest.approx(stats.kendalltau(x, y)[0], abs=1e-12)


def test_p_values_agree_with_scipy_permutation_test():
    y, a, b = data(120, seed=0, noise_a=0.8, noise_b=0.9)
    ours = paired_permutation_test(y, a, b, ("pearson", "rmse"), n_permutations=4000, seed=0)

    def diff(metric):
        def f(x1, x2, axis=-1):
            if metric == "pearson":
                return significance.pearson_rows(x1, y) - significance.pearson_rows(x2, y)
            return np.sqrt(np.mean((x2 - y) ** 2, axis=axis)) - np.sqrt(np.mean((x1 - y) ** 2, axis=axis))

        return f

    for metric in ("pearson", "rmse"):
        ref = stats.permutation_test(
            (a, b),
            diff(metric),
            permutation_type="samples",
            vectorized=True,
            n_resamples=4000,
            alternative="greater",
            rng=1,
        )
        assert ours[metric]["improvement"] == pytest.approx(ref.statistic, abs=1e-12)
        assert 0.005 < ref.pvalue < 0.9
        assert ours[metric]["p_value"] == pytest.approx(ref.pvalue, abs=0.03)


@pytest.mark.slow
def test_clear_improvement_is_significant_and_exchangeable_methods_are_not():
    y, a, b = data(300, noise_a=0.5, noise_b=1.5)
    result = paired_permutation_test(y, a, b, n_permutations=2000, seed=0)
    for metric, r in result.items():
        assert r["improvement"] > 0, metric
        assert r["p_value"] < 0.01 and r["p_value_reverse"] > 0.9, metric
    null_p = []
    for seed in range(30):
        rng = np.random.default_rng(100 + seed)
        y = rng.integers(1, 5, 80).astype(float)
        null_p.append(
            paired_permutation_test(y, y + rng.normal(0, 1, 80), y + rng.normal(0, 1, 80), ("pearson",), 300, seed)[
                "pearson"
            ]["p_value"]
        )
    assert np.mean(np.array(null_p) < 0.05) <= 0.2
    assert 0.3 < np.median(null_p) < 0.7


def test_permutation_test_is_seeded_and_rejects_bad_input():
    y, a, b = data(60)
    first = paired_permutation_test(y, a, b, ("kendall",), 500, seed=4)
    assert first == paired_permutation_test(y, a, b, ("kendall",), 500, seed=4)
    with pytest.raises(InputError, match="equal lengths"):
        paired_permutation_test(y, a[:-1], b)
    with pytest.raises(InputError, match="unknown metric"):
        paired_permutation_test(y, a, b, ("accuracy",))


def test_constant_prediction_has_no_correlation_p_value():
    y, a, _ = data(50)
    result = paired_permutation_test(y, a, np.full(50, 2.5), ("rmse", "pearson"), 200)
    assert np.isnan(result["pearson"]["p_value"]) and np.isfinite(result["rmse"]["p_value"])


@pytest.mark.slow
def test_bootstrap_intervals_bracket_the_estimate_and_shrink_with_data():
    widths = []
    for n in (80, 800):
        y, a, _ = data(n)
        probs = np.full((n, 4), 0.25)
        ci = bootstrap_intervals(y, a, probs, (y - 1).astype(int), n_resamples=300, seed=0)
        point = significance.point_metrics(y, a)
        for metric in ("rmse", "pearson", "spearman", "kendall"):
            assert ci[metric][0] <= point[metric] <= ci[metric][1], (n, metric)
        assert ci["nll"] == pytest.approx((np.log(4), np.log(4)))
        widths.append(ci["pearson"][1] - ci["pearson"][0])
    assert widths[1] < widths[0] / 2
    y, a, _ = data(200)
    rare = np.full(200, 4.0)
    rare[:3] = 3.0
    ci = bootstrap_intervals(y, rare, None, None, n_resamples=300, seed=0)
    assert (
        np.isfinite(ci["pearson"]).all()
        and ci["pearson"][0] <= significance.point_metrics(y, rare)["pearson"] <= ci["pearson"][1]
    )
    once = np.full(200, 4.0)
    once[0] = 3.0
    assert np.isnan(bootstrap_intervals(y, once, None, None, n_resamples=300, seed=0)["pearson"]).all()


def predictions(pairs, means, keys=("1", "2", "3", "4")):
    frame = pairs.assign(question_id="Q0")
    for k in keys:
        frame[f"p_{k}"] = 0.25
    return frame.assign(mean=means, var=1.25)


@pytest.fixture()
def annotated(rubric):
    rng = np.random.default_rng(0)
    pairs = pd.DataFrame({"text_id": [f"t{i}" for i in range(30)], "judge_id": ["J1", "J2", "J3"] * 10, "round": "1"})
    ann = pairs.assign(question_id="Q0", answer=[str(v) for v in rng.integers(1, 5, 30)])
    return pairs, ann


def test_alignment_is_by_key_not_row_order(rubric, annotated):
    pairs, ann = annotated
    means = np.linspace(1, 4, 30)
    ordered = predictions(pairs, means)
    shuffled = ordered.sample(frac=1.0, random_state=1)
    extra = pd.concat(
        [shuffled, predictions(pd.DataFrame({"text_id": ["x"], "judge_id": ["J9"], "round": ["1"]}), [2.0])]
    )
    aligned = align_methods({"a": ordered, "b": extra}, ann, rubric.main)
    assert np.array_equal(aligned.means["a"], aligned.means["b"])
    assert list(aligned.pairs.text_id) == sorted(pairs.text_id)


def test_alignment_errors_name_the_method_and_the_pairs(rubric, annotated):
    pairs, ann = annotated
    good = predictions(pairs, np.linspace(1, 4, 30))
    with pytest.raises(InputError, match=r"method 'short' has no prediction for 2 of 30 .*\(t3, J1, 1\)"):
        align_methods({"good": good, "short": good[~good.text_id.isin(["t3", "t7"])]}, ann, rubric.main)
    bad = good.copy()
    bad.loc[4, "mean"] = np.inf
    with pytest.raises(InputError, match=r"method 'broken' has non-finite predictions .*\(t4, J2, 1\)"):
        align_methods({"broken": bad}, ann, rubric.main)
    with pytest.raises(InputError, match="more than once"):
        align_methods({"twice": pd.concat([good, good.head(1)])}, ann, rubric.main)
    with pytest.raises(InputError, match="lack column"):
        align_methods({"nomean": good.drop(columns="mean")}, ann, rubric.main)


def test_compare_methods_and_superscripts(rubric, annotated):
    y, a, b = data(200, noise_a=0.3, noise_b=1.5)
    pairs = pd.DataFrame({"text_id": [f"t{i:03d}" for i in range(200)], "judge_id": "J1", "round": "1"})
    ann = pairs.assign(question_id="Q0", answer=[str(int(v)) for v in y])
    rng = np.random.default_rng(5)
    c = a + rng.normal(0, 0.01, 200)
    aligned = align_methods(
        {n: predictions(pairs, m) for n, m in (("good", a), ("bad", b), ("twin", c))}, ann, rubric.main
    )
    tests = compare_methods(
        aligned, [("good", "bad"), ("good", "twin"), ("twin", "bad")], ("rmse", "pearson"), 1000, progress=False
    )
    assert len(tests) == 6 and set(tests.metric) == {"rmse", "pearson"}
    marks = superscripts(tests, {"bad": "1", "good": "2", "twin": "3"}, "pearson")
    assert marks == {"bad": "", "good": "1", "twin": "1"}
    star = superscripts(tests, {"bad": "1", "twin": "2", "good": "a"}, "pearson", star_group=["bad"])
    assert star == {"bad": "", "twin": "*", "good": "*"}
    flat = pd.DataFrame(
        [{"method_a": "good", "method_b": "flat", "metric": "pearson", "p_value": np.nan, "p_value_reverse": np.nan}]
    )
    star = superscripts(
        pd.concat([tests, flat]), {"bad": "1", "flat": "2", "good": "a"}, "pearson", star_group=["bad", "flat"]
    )
    assert star["good"] == "*"
