"""benchmarks/robustness.py: the grid's cells, a reduced DialSumm cell and the default-against-baselines record."""

import sys

import pandas as pd
import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import robustness as bench  # noqa: E402


def test_the_grid_has_full_reduced_and_generated_cells_once_each():
    cells = bench.cells()
    assert len(cells) == len(set(cells)) and cells[0] == "dialsumm_full"
    assert "dialsumm_s14_t100_d0" not in cells  # the full set, listed once
    assert {"dialsumm_s6_t20_d2", "dialsumm_s14_t40_d0", "multisystem_references_s1"} <= set(cells)


@pytest.mark.skipif(not bench.DIALSUMM.is_dir(), reason="the shared DialSumm set is not here")
def test_a_reduced_cell_keeps_the_same_dialogues_of_its_drawn_systems(tmp_path):
    out = bench.reduced(bench.DIALSUMM, 6, 20, 1, tmp_path / "cell")
    texts = pd.read_csv(out / "texts.csv")
    assert texts.system_id.nunique() == 6 and len(texts) == 6 * 20
    assert texts.groupby("system_id").query_id.apply(frozenset).nunique() == 1  # the same 20 dialogues each
    for name in ("annotations", "features"):
        assert set(pd.read_csv(out / f"{name}.csv").text_id) == set(texts.text_id)
    again = bench.reduced(bench.DIALSUMM, 6, 20, 1, tmp_path / "again")
    assert pd.read_csv(again / "texts.csv").text_id.tolist() == texts.text_id.tolist()
    other = pd.read_csv(bench.reduced(bench.DIALSUMM, 6, 20, 2, tmp_path / "other") / "texts.csv")
    assert set(other.text_id) != set(texts.text_id)


def test_the_record_says_whether_the_default_beats_the_better_baseline():
    rows = {
        "auto": {"pair_nll": 1.00, "system_rms": 0.2},
        "ridge_judge": {"pair_nll": 1.05},
        "raw_linear_system": {"pair_nll": 0.98},
        "choices": {"0/0": {"auto": {"weights": {"network": 1.0}}}},
    }
    record = bench.summary(rows, ["auto", "ridge_judge", "raw_linear_system"], commit="abc")
    assert record["target"] == {"default_no_worse_than_baselines": False, "margin": pytest.approx(-0.02)}
    assert record["choices"] == {"auto": {"0/0": {"network": 1.0}}} and record["auto"]["commit"] == "abc"
    more = {"auto_stack": {"pair_nll": 0.97}, "choices": {"0/0": {"auto_stack": {"weights": {"ridge_judge": 1.0}}}}}
    merged = bench.summary(more, ["auto_stack"], record, "def")
    assert merged["auto"] == record["auto"] and merged["auto_stack"]["pair_nll"] == 0.97
    assert set(merged["choices"]) == {"auto", "auto_stack"} and merged["target"] == record["target"]
    assert merged["targets"]["auto_stack"] == {"no_worse_than_baselines": True, "margin": pytest.approx(0.01)}
    assert bench.exit_code(bench.main, ["--cells", "nowhere", "--out", "/dev/null"]) == 2  # one line, exit code 2


def test_other_runs_combine_into_the_record_cell_by_cell(tmp_path):
    import json

    base = {"c": {"auto": {"pair_nll": 1.0, "commit": "a"}, "ridge_judge": {"pair_nll": 1.1}}, "meta": {"commit": "a"}}
    run = {
        "c": {"auto_x": {"pair_nll": 1.2, "commit": "b"}, "choices": {"auto_x": {}}},
        "d": {},
        "meta": {"commit": "b", "dirty": False},
    }
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert bench.main(["--combine", str(tmp_path / "run.json"), "--out", str(tmp_path / "base.json")]) == 0
    out = json.loads((tmp_path / "base.json").read_text())
    assert out["c"]["auto"]["commit"] == "a" and out["c"]["auto_x"]["commit"] == "b" and "d" in out
    assert out["c"]["targets"]["auto_x"] == {"no_worse_than_baselines": False, "margin": pytest.approx(-0.1)}
    assert out["c"]["target"]["margin"] == pytest.approx(0.1) and out["meta"]["combined"][0]["commit"] == "b"
    before = (tmp_path / "base.json").read_text()
    (tmp_path / "other.json").write_text(json.dumps({"c": {}}))
    for wrong in ("nowhere.json", "other.json"):
        args = ["--combine", str(tmp_path / "run.json"), str(tmp_path / wrong), "--out", str(tmp_path / "base.json")]
        assert bench.exit_code(bench.main, args) == 2
    assert (tmp_path / "base.json").read_text() == before  # nothing written
