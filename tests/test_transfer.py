"""System means under shift: the jackknife-over-systems interval, PPI with k labels, and their errors."""

import argparse
import itertools
import math
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from support.paths import ROOT

from llmrubric.data.simulate import write_simulated
from llmrubric.evaluation.transfer import (
    coverage,
    grouped_kendall,
    pair_scores,
    ppi_intervals,
    shift_intervals,
    system_means,
    system_metrics,
)
from llmrubric.io.errors import InputError
from llmrubric.io.files import write_table

sys.path.insert(0, str(ROOT / "benchmarks"))
import transfer as bench  # noqa: E402


def test_shift_interval_is_the_t_interval_of_the_other_systems_errors():
    means = pd.DataFrame({"human": [1.0, 2.0, 3.0, 4.0], "predicted": [1.5, 2.0, 2.8, 3.0]}, index=["a", "b", "c", "d"])
    out = shift_intervals(means)
    others = np.array([0.0, -0.2, -1.0])  # the residuals of b, c, d
    half = stats.t.ppf(0.975, df=3) * math.sqrt(np.mean(others**2))
    assert out.loc["a", "low"] == pytest.approx(1.5 - half) and out.loc["a", "high"] == pytest.approx(1.5 + half)
    assert (
        out.loc["d", "high"] - out.loc["d", "low"] < out.loc["a", "high"] - out.loc["a", "low"]
    )  # d's own big miss does not widen d
    assert coverage(out) == (
        pytest.approx(np.mean([(r.low <= r.human <= r.high) for r in out.itertuples()])),
        pytest.approx((out.high - out.low).mean()),
    )
    with pytest.raises(InputError, match="at least 2 systems"):
        shift_intervals(means.iloc[:1])


def test_ppi_corrects_a_biased_prediction_and_refuses_more_labels_than_pairs():
    rng = np.random.default_rng(0)
    y = rng.normal(3.0, 0.5, 200)
    pairs = pd.DataFrame(
        {"system_id": "s", "text_id": [f"t{i}" for i in range(200)], "y": y, "yhat": y - 0.8 + rng.normal(0, 0.1, 200)}
    )
    draws = ppi_intervals(pairs, 20, draws=40, seed=1)
    assert len(draws) == 40 and abs(draws.estimate.mean() - y.mean()) < 0.05  # the bias of 0.8 is removed
    assert coverage(draws)[0] >= 0.85
    assert system_means(pairs).loc["s", "predicted"] == pytest.approx(y.mean() - 0.8, abs=0.05)
    with pytest.raises(InputError, match="k=201.*only 200"):
        ppi_intervals(pairs, 201)


def test_pair_scores_need_a_system_for_every_text(simulated, rubric):
    pred = bench.ExpectedLLM(rubric).predict(simulated)
    systems = simulated.texts.set_index("text_id").system_id
    pairs = pair_scores(pred, simulated.annotations, rubric.main, systems)
    assert len(pairs) == 900 and set(pairs.system_id) == set(systems)
    with pytest.raises(InputError, match="system_id"):
        pair_scores(pred, simulated.annotations, rubric.main, systems.iloc[1:])


@pytest.mark.slow
def test_benchmark_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    """``benchmarks/transfer.py``'s ``main`` (its ``__main__`` exits with what it returns), in this process."""
    data = write_simulated(tmp_path / "sim", n_texts=40, n_judges=4)
    texts = pd.read_csv(data / "texts.csv").drop(columns="system_id")
    write_table(texts, data / "texts.csv")
    write_table(pd.read_csv(data / "annotations.csv", dtype=str).drop(columns="system_id"), data / "annotations.csv")
    (data / "truth.json").unlink()

    def run(*args):
        capsys.readouterr()
        code = bench.main(["--sets", "--out", str(tmp_path / "t.json"), *args])
        return SimpleNamespace(returncode=code, stderr=capsys.readouterr().err)

    done = run("--data", str(data))
    assert (
        done.returncode == 2
        and "system_id" in done.stderr
        and "Traceback" not in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
    )
    one = write_simulated(tmp_path / "few", n_texts=8, n_judges=4)
    done = run("--data", str(one))
    assert done.returncode == 2 and "k=20" in done.stderr and "Traceback" not in done.stderr
    two = write_simulated(tmp_path / "two", n_texts=120, n_judges=4)
    for name in ("texts.csv", "annotations.csv"):
        table = pd.read_csv(two / name, dtype=str)
        write_table(
            table.assign(system_id=table.system_id.isin(table.system_id.unique()[::2]).map({True: "A", False: "B"})),
            two / name,
        )
    done = run("--data", str(two), "--two-out")
    assert done.returncode == 2 and "--two-out" in done.stderr and "has 2" in done.stderr
    assert not (tmp_path / "t.json").exists()


@pytest.mark.slow
def test_nested_intervals_use_only_models_that_never_saw_the_system(tmp_path):
    data = write_simulated(tmp_path / "sim", n_texts=120, n_judges=4)
    args = argparse.Namespace(data=str(data), rubric=str(ROOT / "conf" / "rubric" / "llm_rubric.yaml"), draws=5)
    plain = {m: bench.run_one("data", m, 0, args) for m in ("mean_of_sources", "ridge_judge")}
    systems = sorted(plain["ridge_judge"]["systems"])
    nested = {m: {s: bench.nested_errors("data", m, 0, s, args) for s in systems} for m in plain}
    for m in plain:
        assert all(set(nested[m][s]["errors"]) == set(systems) - {s} for s in systems)
    # without training the errors cannot depend on which system was left out: nested = plain
    same = bench.with_nested(plain["mean_of_sources"], nested["mean_of_sources"])
    assert same["width_nested"] == pytest.approx(plain["mean_of_sources"]["width"])
    # a fitted model's errors on the others change once it no longer trains on the held-out system
    s0, s1 = systems[:2]
    leaked = plain["ridge_judge"]["systems"][s1]
    assert nested["ridge_judge"][s0]["errors"][s1] != pytest.approx(leaked["predicted"] - leaked["human"], abs=1e-6)
    out = bench.with_nested(plain["ridge_judge"], nested["ridge_judge"])
    half = stats.t.ppf(0.975, df=len(systems) - 1) * math.sqrt(
        np.mean(np.square(list(nested["ridge_judge"][s0]["errors"].values())))
    )
    assert out["systems"][s0]["high_nested"] == pytest.approx(out["systems"][s0]["predicted"] + half)
    assert 0 <= out["coverage_nested"] <= 1 and out["width_nested"] > 0


@pytest.mark.slow
def test_system_kendall_bootstrap_pairs_the_draws_of_two_methods():
    rng = np.random.default_rng(0)
    quality = {"A": 1.0, "B": 2.0, "C": 3.0, "D": 4.0}
    pairs = pd.DataFrame(
        [
            {"system_id": s, "text_id": f"{s}{t}", "y": q + rng.normal(0, 0.3), "yhat": 0.0}
            for s, q in quality.items()
            for t in range(8)
            for _ in range(2)  # two judges: a text's pairs are resampled together
        ]
    )
    right = pairs.assign(yhat=pairs.system_id.map(quality) + rng.normal(0, 0.01, len(pairs)))
    wrong = right.assign(yhat=-right.yhat)
    draws = {name: bench.kendall_draws(p, 200, seed=3) for name, p in (("right", right), ("wrong", wrong))}
    assert draws["right"] == bench.kendall_draws(right.sample(frac=1, random_state=1), 200, seed=3)
    assert min(draws["right"]) == pytest.approx(1.0) and max(draws["wrong"]) == pytest.approx(-1.0)
    report = {
        "set": {"mean_of_sources": {"kendall_draws": draws["wrong"]}, "default": {"kendall_draws": draws["right"]}}
    }
    bench.kendall_comparison(report)
    default = report["set"]["default"]
    assert "kendall_draws" not in default and default["system_kendall_ci"] == pytest.approx([1.0, 1.0])
    assert default["system_kendall_minus_mean_of_sources"]["mean"] == pytest.approx(2.0)
    assert default["system_kendall_minus_mean_of_sources"]["share_at_least"] == 1.0


@pytest.mark.slow
def test_two_out_scores_each_pair_of_systems_with_one_model_trained_without_both(tmp_path):
    data = write_simulated(tmp_path / "sim", n_texts=120, n_judges=4)
    args = argparse.Namespace(data=str(data), rubric=str(ROOT / "conf" / "rubric" / "llm_rubric.yaml"), draws=5)
    plain = bench.run_one("data", "mean_of_sources", 0, args)
    systems = sorted(plain["systems"])
    untrained = bench.two_out_means("data", "mean_of_sources", 0, args)
    assert [p[:2] for p in untrained["pairs"]] == [list(p) for p in itertools.combinations(systems, 2)]
    # a method without training predicts each system alike whichever others are held out
    for s, t, ps, pt in untrained["pairs"]:
        assert (ps, pt) == pytest.approx((plain["systems"][s]["predicted"], plain["systems"][t]["predicted"]))
    same = bench.with_two_out(plain, untrained)
    assert same["system_kendall_two_out"] == pytest.approx(plain["system_kendall"])
    fitted = bench.two_out_means("data", "ridge_judge", 0, args)
    loso = bench.run_one("data", "ridge_judge", 0, args)["systems"]
    s, t, ps, _ = fitted["pairs"][0]
    assert ps != pytest.approx(loso[s]["predicted"], abs=1e-9)  # trained without t as well
    backwards = {"systems": {"a": {"human": 1.0}, "b": {"human": 2.0}, "c": {"human": 3.0}}}
    pairs = {"pairs": [["a", "b", 2.0, 1.0], ["a", "c", 0.0, 1.0], ["b", "c", 5.0, 4.0]], "seconds": 0.0}
    assert bench.with_two_out(backwards, pairs)["system_kendall_two_out"] == pytest.approx(-1 / 3)


def test_system_metrics_of_a_hand_made_run(rubric):
    # system: (answers of judges j1, j2), (predicted expected answers of j1, j2)
    pairs = {
        "A": ((1, 1), (1.0, 1.5)),  # human 1.0, predicted 1.25, error +0.25
        "B": ((2, 2), (1.75, 1.75)),  # 2.0, 1.75, -0.25
        "C": ((3, 4), (3.5, 4.0)),  # 3.5, 3.75, +0.25
        "D": ((1, 2), (1.0, 1.5)),  # 1.5, 1.25, -0.25
        "E": ((4, 4), (1.0, 1.0)),  # 4.0, 1.0, -3.0
    }
    rows = [(f"t{s}", j, a, y) for s, (answers, yhat) in pairs.items() for j, a, y in zip(("j1", "j2"), answers, yhat)]
    annotations = pd.DataFrame(
        {"text_id": [r[0] for r in rows], "judge_id": [r[1] for r in rows], "question_id": "Q0"}
    ).assign(answer=[str(r[2]) for r in rows])
    predictions = annotations.drop(columns="answer").assign(
        **{f"p_{k}": 0.25 for k in rubric.main.keys}, mean=[r[3] for r in rows], var=1.0
    )
    systems = pd.Series({f"t{s}": s for s in pairs})
    groups = pd.Series({"A": "g0", "B": "g0", "C": "g0", "D": "g1", "E": "g1"})
    out = system_metrics(predictions, annotations, rubric.main, systems, groups)
    assert out["systems"] == 5 and out["groups"] == 2 and out["groups_ranked"] == 2
    assert out["rms_error"] == pytest.approx(math.sqrt((4 * 0.25**2 + 3.0**2) / 5))
    # over all systems (by human mean A D B C E): 5 concordant, 4 discordant pairs, A-D tied in prediction
    assert out["kendall"] == pytest.approx((5 - 4) / math.sqrt(10 * 9))
    # g0 predicted in the human order (tau 1), g1 backwards (tau -1)
    assert out["kendall_within_groups"] == pytest.approx(0.0)
    # E's interval uses the others' errors (all ±0.25) and misses its -3.0; A..D's include E's -3.0 and cover
    t = stats.t.ppf(0.975, df=4)
    assert out["coverage"] == pytest.approx(0.8)
    assert out["width"] == pytest.approx((4 * 2 * t * math.sqrt((3 * 0.25**2 + 9) / 4) + 2 * t * 0.25) / 5)
    assert "kendall_reason" not in out and "kendall_within_groups_reason" not in out

    alone = system_metrics(predictions, annotations, rubric.main, systems, pd.Series({s: s for s in pairs}))
    assert math.isnan(alone["kendall_within_groups"]) and alone["groups_ranked"] == 0
    assert "2 or more systems" in alone["kendall_within_groups_reason"]
    assert alone["kendall"] == pytest.approx(out["kendall"]) and alone["coverage"] == pytest.approx(out["coverage"])
    with pytest.raises(InputError, match="'E' has no held-out group"):
        system_metrics(predictions, annotations, rubric.main, systems, groups.drop("E"))


def test_the_kendall_within_groups_is_averaged_over_every_group_of_every_grouping():
    # humans order A < B < C < D; the prediction swaps C and D
    means = pd.DataFrame({"human": [1.0, 2.0, 3.0, 4.0], "predicted": [1.0, 2.0, 4.0, 3.0]}, index=list("ABCD"))
    first = pd.Series({"A": 0, "B": 0, "C": 1, "D": 1})  # {A, B}: tau +1, {C, D}: tau -1
    second = pd.Series({"A": 0, "C": 0, "B": 1, "D": 1})  # {A, C}: +1, {B, D}: +1
    assert grouped_kendall([means], [first])["kendall_groups"] == pytest.approx(0.0)
    out = grouped_kendall([means, means], [first, second])
    assert out == {"kendall_groups": pytest.approx(0.5), "groupings": 2, "groups_ranked": 4}
    three = pd.Series({"A": 0, "B": 1, "C": 1, "D": 1})  # A alone; {B, C, D}: 2 concordant pairs, 1 discordant
    assert grouped_kendall([means], [three])["kendall_groups"] == pytest.approx(1 / 3)
    tied = means.assign(predicted=2.0)
    none = grouped_kendall([tied], [first])
    assert math.isnan(none["kendall_groups"]) and none["groups_ranked"] == 0
    assert "tied" in none["kendall_groups_reason"]
    with pytest.raises(InputError, match="grouping_seeds"):
        grouped_kendall([means], [first, second])
