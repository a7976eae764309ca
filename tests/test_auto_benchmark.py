"""benchmarks/auto.py: model=auto measured on the path train.py ships, and the Kendall within held-out groups."""

import json
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf
from support.paths import ROOT

from llmrubric.config import compose
from llmrubric.model.auto import AutoCalibrator

sys.path.insert(0, str(ROOT / "benchmarks"))
import auto as bench  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize(("protocol", "group"), [("systems", "system"), ("system_groups", "system"), ("cv", "text")])
def test_the_shipped_model_is_composed_and_grouped_as_train_py_builds_it(rubric, protocol, group):
    model = bench.shipped_model(rubric, protocol)
    shipped = OmegaConf.to_container(compose("config", ["model=auto"]).model, resolve=True)
    assert isinstance(model, AutoCalibrator) and model.group == group
    assert model.model["auto"] == shipped["auto"] and model.model["ensemble"] == shipped["ensemble"]
    stack = bench.shipped_model(rubric, protocol, ("model.auto.rule=stack",))
    assert stack.settings.rule == "stack" and model.settings.rule == shipped["auto"]["rule"]


def test_the_committed_results_name_the_shipped_path():
    report = json.loads((ROOT / "benchmarks" / "results" / "auto.json").read_text())
    assert report["meta"]["auto_path"] == "shipped"


@pytest.mark.slow
def test_a_small_run_writes_the_grouped_kendall_of_every_method(tmp_path):
    out = tmp_path / "auto.json"
    args = ["--data", str(ROOT / "data" / "simulated"), "--rubric", str(ROOT / "conf" / "rubric" / "llm_rubric.yaml")]
    methods = ["mean_of_sources", "raw_linear_system"]
    assert bench.main([*args, "--methods", *methods, "--grouping-seeds", "2", "--draws", "5", "--workers", "1",
                       "--out", str(out)]) == 0  # fmt: skip
    report = json.loads(out.read_text())
    assert report["meta"]["auto_path"] == "shipped" and report["meta"]["grouping_seeds"] == 2
    groups, systems = report["data"]["system_groups"], report["data"]["systems"]
    for name in methods:
        assert -1 <= groups[name]["system_kendall_groups"] <= 1
        assert systems[name]["system_kendall_groups"] is None  # one system per held-out group
        assert set(groups["choices"]) == {"0/0", "0/1", "0/2", "1/0", "1/1", "1/2"}  # 3 groups × 2 groupings
        assert len(groups[name]["fold_seconds"]) == 3 and sum(groups[name]["fold_seconds"]) == groups[name]["seconds"]
        raters = systems[name]["per_judge"]
        assert len(raters) > 1 and sum(r["pairs"] for r in raters.values()) > 0
        assert all(r["pair_nll"] > 0 and np.isfinite(r["predicted_mean"] - r["observed_mean"]) for r in raters.values())
    with pytest.raises(SystemExit) as bad:
        bench.main([*args, "--methods", "nothing", "--out", str(tmp_path / "bad.json")])
    assert bad.value.code == 2 and not (tmp_path / "bad.json").exists()


def test_the_targets_compare_auto_with_the_bounds_of_the_issue():
    row = lambda nll, pearson, rms, kendall: {
        "pair_nll": nll,
        "pair_pearson": pearson,
        "system_rms": rms,
        "system_kendall_groups": kendall,
    }
    figures = {
        "auto": row(1.00, 0.40, 0.18, 0.5),
        "network": row(1.00, 0.41, 0.30, 0.5),
        "ridge_judge": row(1.10, 0.30, 0.25, 0.5),
        "mean_of_sources": row(1.50, 0.35, 0.40, 0.6),
        "raw_linear_system": row(1.20, 0.20, 0.20, 0.6),
    }
    out = bench.targets(figures, "system_groups")
    assert out["pair_nll_below_every_candidate"] == {"met": False, "auto": 1.0, "bound": 1.0, "against": "network"}
    assert out["pair_pearson_at_least"]["against"] == "network" and not out["pair_pearson_at_least"]["met"]
    assert out["system_rms_at_most_0.9_line"]["met"] and out["system_rms_at_most_0.9_line"]["bound"] == 0.9 * 0.20
    assert out["kendall_groups_at_least_mean"] == {
        "met": False,
        "auto": 0.5,
        "bound": 0.6,
        "against": "mean_of_sources",
    }
    cv = bench.targets(figures, "cv")
    assert cv == {"pair_nll_within_0.005": {"met": True, "auto": 1.0, "bound": 1.005, "against": "network"}}
    assert "kendall_groups_at_least_mean" not in bench.targets(figures, "systems")


def test_a_candidate_with_the_level_puts_a_new_systems_mean_at_the_levels_prior(rubric):
    from llmrubric.config import group, model_file
    from llmrubric.data.splits import text_systems
    from llmrubric.io.tables import load_tables
    from llmrubric.model.core.encoding import question_targets
    from llmrubric.model.core.registry import fit_questions
    from llmrubric.model.core.system_level import SystemLevel

    folder = ROOT / "data" / "simulated"
    tables = load_tables(*(folder / f"{n}.csv" for n in ("annotations", "features")), rubric, folder / "texts.csv")
    systems = text_systems(tables)
    new = sorted(systems.unique())[0]
    train, test = tables.subset(systems.index[systems != new]), tables.subset(systems.index[systems == new])
    model = fit_questions(bench.candidate("ridge_judge", rubric, model_file("auto"), group("trainer", "default"), 0),
                          train, [rubric.main.id])  # fmt: skip
    predictions = bench._main(model.predict(test), rubric)
    levelled, table = bench.with_system_level(model, "ridge_judge", predictions, rubric, train, test)
    probs = levelled[[f"p_{k}" for k in rubric.main.keys]].to_numpy()
    assert probs.min() >= 0 and abs(probs.sum(axis=1) - 1).max() < 1e-9
    values = rubric.main.values
    pairs, _ = question_targets(train, rubric.main)
    index = rubric.ids.index(rubric.main.id)
    level = SystemLevel(rubric).fit(train, model.predict_proba(train, pairs)[:, index, : len(values)] @ values)
    prior = level.levels(test, predictions, predictions["mean"].to_numpy())["mean"].iloc[0]
    moved = abs(predictions["mean"].mean() - prior)
    assert moved > 0.02  # the text model alone puts this system elsewhere (a thousand times the tolerance below)
    assert levelled["mean"].mean() == pytest.approx(prior, abs=1e-6)  # the level's nodes keep its mean on the scale
    assert table.level.iloc[0] == pytest.approx(prior) and table.level_sd.iloc[0] > 0


def test_merging_one_protocol_keeps_the_sets_other_protocols_and_names_each_run(tmp_path):
    path = tmp_path / "auto.json"
    whole = {"commit": "aaa", "auto_path": "shipped"}
    path.write_text(
        json.dumps(
            {
                "meta": {**whole, "runs": {"s": whole, "s/cv": {"commit": "old"}, "t": whole}},
                "s": {"systems": {"auto": 1}},
                "t": {"systems": {"auto": 2}},
            }
        )
    )
    new = {"commit": "bbb", "auto_path": "shipped"}
    out = bench.merged({"meta": new, "s": {"cv": {"auto": 3}}}, path, ["s"])
    assert out["s"] == {"systems": {"auto": 1}, "cv": {"auto": 3}} and out["t"] == {"systems": {"auto": 2}}
    assert out["meta"]["runs"]["s"]["commit"] == "aaa" and out["meta"]["runs"]["s/cv"]["commit"] == "bbb"
    again = bench.merged({"meta": new, "s": {"systems": {"auto": 4}}}, path, ["s"])
    assert again["s"] == {"systems": {"auto": 4}} and "s/cv" not in again["meta"]["runs"]  # the stale cv run goes
    assert again["meta"]["runs"]["s"]["commit"] == "bbb"
