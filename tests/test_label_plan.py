"""The label planner (issue 61): its k against draws of the leaderboard's own estimator on data of its assumptions."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from llmrubric.io.errors import InputError
from llmrubric.scoring import label_plan as plan
from llmrubric.scoring.labels import uniform_interval
from llmrubric.scoring.levels import level_posterior

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("label_plan")

ALPHA = 0.1


def system(rng, n=100, sd_f=0.6):
    f = rng.normal(3.0, sd_f, n)
    return f, plan.SystemPlanInput("S", n, float(f.var()), prior_var=0.2**2)


def shipped_widths(rng, f, k, sigma, prior_var, reps=300, prior_mean=3.0):
    """Widths of the leaderboard's level + PPI++ interval (Student) over draws of k labels of Y = f + 0.3 + e."""
    y = f + 0.3 + rng.normal(0, sigma, len(f))
    out = []
    for _ in range(reps):
        chosen = np.zeros(len(f), bool)
        chosen[rng.choice(len(f), k, replace=False)] = True
        ppi = uniform_interval("ppi_pp", y[chosen], f[chosen], f[~chosen], ALPHA, "student")
        post = level_posterior(prior_mean, prior_var, ppi, k, ALPHA, "student")
        out.append(post["high"] - post["low"])
    return np.array(out)


@pytest.mark.slow
def test_the_planned_k_reaches_the_width_in_the_asked_share_of_draws_and_one_label_less_does_not():
    rng = np.random.default_rng(0)
    f, sys_ = system(rng)
    sigma = 0.7
    k = plan.labels_for_width(0.5, sys_, sigma**2, ALPHA, assurance=0.9)
    assert k is not None and 3 <= k < 90
    hit = (shipped_widths(rng, f, k, sigma, sys_.prior_var) <= 0.5).mean()
    assert hit >= 0.85
    fewer = (shipped_widths(rng, f, k - 2, sigma, sys_.prior_var) <= 0.5).mean()
    assert fewer < hit


@pytest.mark.slow
def test_the_mean_half_width_formula_matches_the_leaderboards_interval():
    rng = np.random.default_rng(1)
    f, sys_ = system(rng)
    for k in (5, 10, 20):
        planned = 2 * plan.posterior_half_width(k, sys_, 0.7**2, ALPHA, "student", quantile=0.5)
        drawn = np.median(shipped_widths(rng, f, k, 0.7, sys_.prior_var, reps=200))
        assert planned == pytest.approx(drawn, rel=0.08)


def test_more_labels_for_a_narrower_width_a_wider_prior_or_a_larger_residual():
    rng = np.random.default_rng(2)
    _, sys_ = system(rng)
    base = plan.labels_for_width(0.5, sys_, 0.49, ALPHA)
    assert plan.labels_for_width(0.4, sys_, 0.49, ALPHA) > base
    assert plan.labels_for_width(0.5, sys_, 0.81, ALPHA) > base
    wide = plan.SystemPlanInput("S", sys_.texts, sys_.var_f, prior_var=math.inf)
    assert plan.labels_for_width(0.5, wide, 0.49, ALPHA) > base
    assert plan.labels_for_width(0.9, sys_, 0.49, ALPHA) == 0  # the prior alone: 2 z 0.2 = 0.66
    assert plan.labels_for_width(0.01, sys_, 0.49, ALPHA) is None


@pytest.mark.slow
def test_the_difference_plan_detects_the_difference_with_the_asked_power():
    rng = np.random.default_rng(3)
    n, sigma, delta = 100, 0.7, 0.5
    fa, fb = rng.normal(3.0, 0.6, n), rng.normal(3.0, 0.6, n)
    a = plan.SystemPlanInput("A", n, float(fa.var()))
    b = plan.SystemPlanInput("B", n, float(fb.var()))
    k = plan.labels_for_difference(delta, a, b, sigma**2, ALPHA, power=0.8)
    assert k is not None and plan.labels_for_difference(0.7 * delta, a, b, sigma**2, ALPHA, power=0.8) > k
    ya, yb = fa + delta + rng.normal(0, sigma, n), fb + rng.normal(0, sigma, n)
    detected = []
    for _ in range(300):
        ia, ib = rng.choice(n, k, replace=False), rng.choice(n, k, replace=False)
        out = []
        for y, f, i in ((ya, fa, ia), (yb, fb, ib)):
            rest = np.setdiff1d(np.arange(n), i)
            out.append(uniform_interval("ppi_pp", y[i], f[i], f[rest], ALPHA, "student"))
        se = [(o["high"] - o["low"]) / (2 * 1.6448536) for o in out]
        detected.append(out[0]["estimate"] - out[1]["estimate"] > 1.6448536 * math.hypot(*se))
    assert np.mean(detected) >= 0.72


def test_residual_variance_removes_each_systems_offset():
    rng = np.random.default_rng(4)
    f = rng.normal(3, 1, 400)
    systems = np.repeat(["a", "b"], 200)
    y = f + np.where(systems == "a", 1.0, -1.0) + rng.normal(0, 0.5, 400)
    sigma2, n = plan.residual_variance(y, f, systems)
    assert n == 400 and sigma2 == pytest.approx(0.25, rel=0.15)


def test_bad_targets_are_one_line_errors_naming_the_setting():
    with pytest.raises(InputError, match="positive"):
        plan.labels_for_width(-1, plan.SystemPlanInput("S", 50, 0.3), 0.5)
    with pytest.raises(InputError, match="power"):
        plan.labels_for_difference(
            0.3, plan.SystemPlanInput("A", 50, 0.3), plan.SystemPlanInput("B", 50, 0.3), 0.5, power=1.5
        )


@pytest.fixture(scope="module")
def levelled_run(rubric, tmp_path_factory):
    """A levelled ridge_judge checkpoint trained on 4 of 6 simulated systems (100 texts each), and all six's tables."""
    from support.settings import FAST, MAIN_INTERVALS

    import llmrubric.model  # noqa: F401  (registers every class)
    from llmrubric import make_model
    from llmrubric.data.simulate import SHIFT_SOURCES, shift_systems, simulate
    from llmrubric.model.core.checkpoints import save_model

    tables = simulate(0, 600, 4, 2, rubric, systems=shift_systems(6, 0), sources=SHIFT_SOURCES)[0]
    systems = tables.texts.set_index("text_id").system_id
    new = sorted(systems.unique())[2:4]
    settings = {"ensemble": 1, "auto": {"candidates": ["ridge_judge"], "folds": 2, **MAIN_INTERVALS}}
    model = make_model("levelled", rubric, settings, FAST, params={"base": "ridge_judge"})
    model.fit(tables.subset(systems.index[~systems.isin(new)]))
    path = tmp_path_factory.mktemp("plan")
    save_model(model, path / "levelled.safetensors")
    tables.features.to_csv(path / "features.csv", index=False)
    tables.texts.to_csv(path / "texts.csv", index=False)
    tables.annotations.to_csv(path / "annotations.csv", index=False)
    return path, new


def plan_cli(path, *extra):
    from llmrubric.cli import main

    args = ["label", "plan", str(path / "levelled.safetensors"), str(path / "features.csv")]
    return main([*args, "--texts", str(path / "texts.csv"), *extra])


@pytest.mark.slow
def test_label_plan_plans_the_new_system_from_the_checkpoints_level(levelled_run, capsys):
    path, new = levelled_run
    assert plan_cli(path, "--width", "0.5", "--difference", "0.6", "--out", str(path / "plan.csv")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["residual_source"].startswith("the checkpoint's system level") and out["residual_sd"] > 0
    assert any("PPI++" in a for a in out["assumptions"]) and any("90%" in a for a in out["assumptions"])
    table = pd.read_csv(path / "plan.csv").set_index("system")
    assert table.known.sum() == 4 and not table.known[new].any()
    k = table.k_width[new[0]]
    assert 2 <= k < table.texts[new[0]] and table.planned_width[new[0]] <= 0.5
    assert out["difference"]["pair"] == new and out["difference"]["k_every_pair"] >= 2
    # a wider target needs fewer labels; pilot labels give the residual SD instead of the checkpoint
    assert plan_cli(path, "--width", "0.7", "--annotations", str(path / "annotations.csv")) == 0
    wider = json.loads(capsys.readouterr().out)
    assert wider["residual_source"].startswith("pilot labels")
    assert {s["system"]: s["k_width"] for s in wider["systems"]}[new[0]] <= k or wider["residual_sd"] > out[
        "residual_sd"
    ]


@pytest.mark.slow
def test_label_plan_without_a_target_or_with_a_bad_one_is_a_one_line_error(levelled_run, capsys):
    path, _ = levelled_run
    assert plan_cli(path) == 2
    assert "--width" in capsys.readouterr().err
    assert plan_cli(path, "--width", "-1") == 2
    assert "--width" in capsys.readouterr().err


def test_a_mixture_of_residual_variances_plans_for_the_larger_ones_and_scales_by_predicted_variance():
    one = plan.sample_variance_quantile(np.array([0.25]), 10, 0.9)
    assert one == pytest.approx(0.25 * stats.chi2.ppf(0.9, 9) / 9)
    mixed = plan.sample_variance_quantile(np.array([0.16, 0.25, 0.64]), 10, 0.9)
    assert one < mixed < 0.64 * stats.chi2.ppf(0.9, 9) / 9
    # the new system's model is twice as unsure as the training systems' on average: twice their residual variance
    scaled = plan.scaled_variances([0.2, 0.3], [0.5, 0.5], 1.0)
    np.testing.assert_allclose(scaled, [0.4, 0.6])
    rng = np.random.default_rng(5)
    _, sys_ = system(rng)
    assert plan.labels_for_width(0.5, sys_, [0.3, 0.7], ALPHA) > plan.labels_for_width(0.5, sys_, 0.3, ALPHA)


def test_from_the_transport_floor_on_the_plan_is_for_ppi_pp_alone():
    rng = np.random.default_rng(6)
    _, sys_ = system(rng)
    alone = plan.SystemPlanInput("S", sys_.texts, sys_.var_f, math.inf)
    # a prior that alone is narrow enough is not trusted unchecked: the transport floor at least
    assert plan.labels_for_width(0.9, sys_, 0.49, ALPHA) == 0
    assert plan.labels_for_width(0.9, sys_, 0.49, ALPHA, checked_from=10) >= 10
    wide = plan.SystemPlanInput("S", sys_.texts, sys_.var_f, math.inf)
    assert plan.labels_for_width(2.0, wide, 0.49, ALPHA, checked_from=10) < 10  # no level: nothing to check
    for k in (12, 30):
        checked = plan.planned_width(k, sys_, 0.49, ALPHA, "student", 0.9, checked_from=10)
        assert checked == pytest.approx(plan.planned_width(k, alone, 0.49, ALPHA, "student", 0.9))
        assert checked > plan.planned_width(k, sys_, 0.49, ALPHA, "student", 0.9)
