"""smECE with intervals (relplot), per-group calibration with skipped small groups, and the figures."""

import numpy as np
import pytest

from llmrubric.evaluation.calibration import calibration_groups, reliability_diagram, smece, smece_interval
from llmrubric.io.errors import InputError
from llmrubric.report.plots import judge_distribution_figure, learning_curve_figure, png_bytes, reliability_figure

PNG = b"\x89PNG\r\n\x1a\n"


def forecasts(n, seed=0, power=1.0):
    rng = np.random.default_rng(seed)
    f = rng.uniform(0, 1, n)
    y = (rng.uniform(0, 1, n) < f**power).astype(float)
    return f, y


@pytest.mark.slow
def test_smece_separates_calibrated_from_miscalibrated_forecasts():
    f, y = forecasts(2000)
    good, low, high = smece_interval(f, y, n_resamples=40, seed=0)
    assert good < 0.03 and low <= good <= high < 0.06
    bad = smece(*forecasts(2000, power=3.0))
    assert bad > 0.1


@pytest.mark.slow
def test_smece_interval_is_seeded_and_shrinks_with_data():
    f, y = forecasts(200, seed=2)
    small = smece_interval(f, y, 40, seed=1)
    assert small == smece_interval(f, y, 40, seed=1)
    large = smece_interval(*forecasts(3000, seed=2), 40, seed=1)
    assert large[2] - large[1] < small[2] - small[1]


def test_smece_rejects_non_probabilities():
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        smece(np.array([0.2, 1.5]), np.array([0, 1]))
    with pytest.raises(InputError, match="at least one"):
        smece(np.array([]), np.array([]))


@pytest.mark.slow
def test_groups_below_the_minimum_are_skipped_with_a_note():
    rng = np.random.default_rng(0)
    n = 200
    probs = rng.dirichlet(np.ones(4), n)
    answers = np.array([rng.choice(4, p=p) for p in probs])
    judges = np.array(["A"] * 150 + ["B"] * 45 + ["C"] * 5)
    results, notes = calibration_groups(
        probs, answers, ("1", "2", "3", "4"), {"judge": judges, "system": [None] * n}, 40, 10, 0
    )
    assert [(r.kind, r.group, r.n) for r in results] == [("all", "all", 200), ("judge", "A", 150), ("judge", "B", 45)]
    assert any("C (5)" in note and "fewer than 40" in note for note in notes)
    assert any("no system ids" in note for note in notes)
    pooled = results[0].rows
    assert [r["answer"] for r in pooled] == ["1", "2", "3", "4"]
    assert sum(r["positives"] for r in pooled) == n
    assert all(r["low"] <= r["smece"] <= r["high"] for r in pooled)


@pytest.mark.slow
def test_reliability_and_judge_figures_render_as_png():
    f, y = forecasts(400)
    value, low, high = smece_interval(f, y, 30)
    diagram = reliability_diagram(f, y, value, low, high, num_bootstrap=10, seed=0)
    assert diagram["ce"] == value and diagram["ce_ci_width"] == pytest.approx(max(value - low, high - value))
    assert np.all(diagram["lower"] <= diagram["upper"] + 1e-12)
    again = reliability_diagram(f, y, value, low, high, num_bootstrap=10, seed=0)
    assert np.array_equal(diagram["upper"], again["upper"])
    fig = reliability_figure([("1", diagram), ("2", diagram)], "test")
    assert len(fig.axes) == 2 and "smECE" in fig.axes[0].texts[0].get_text()
    assert png_bytes(fig).startswith(PNG)
    observed = {"J1": np.array([0.1, 0.2, 0.3, 0.4]), "J2": np.array([0.4, 0.3, 0.2, 0.1])}
    fig = judge_distribution_figure(
        observed, observed, {"J1": 30, "J2": 31}, np.full(4, 0.25), ["1", "2", "3", "4"], "judges"
    )
    assert sum(ax.get_visible() for ax in fig.axes) == 3
    assert png_bytes(fig).startswith(PNG)


@pytest.mark.slow
def test_learning_curve_figure_draws_each_metric():
    import pandas as pd

    summary = pd.DataFrame(
        {
            "fraction": [0.5, 1.0],
            "rmse_mean": [0.8, 0.7],
            "rmse_sd": [0.05, 0.01],
            "pearson_mean": [0.3, 0.4],
            "pearson_sd": [0.1, np.nan],
        }
    )
    fig = learning_curve_figure(summary, ["rmse", "pearson"], "lc")
    assert [ax.get_title() for ax in fig.axes] == ["rmse", "pearson"]
    assert list(fig.axes[1].lines[0].get_ydata()) == [0.3, 0.4]
    assert png_bytes(fig).startswith(PNG)
