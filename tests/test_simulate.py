"""The simulator: deterministic, valid tables, the designed structure, reproducible embedded data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmrubric.cli import main
from llmrubric.data.simulate import CITATION, DEFAULT_RUBRIC, FILES, simulate, simulate_shift, write_simulated
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables

EMBEDDED = Path(__file__).parents[1] / "data" / "simulated"


@pytest.fixture(scope="module")
def rubric() -> Rubric:
    return Rubric.load(DEFAULT_RUBRIC)


@pytest.fixture(scope="module")
def default(rubric):
    return simulate(0, rubric=rubric)


def test_same_seed_same_tables_other_seed_differs(rubric):
    (a, truth_a), (b, truth_b) = (simulate(7, n_texts=40, rubric=rubric) for _ in range(2))
    pd.testing.assert_frame_equal(a.annotations, b.annotations)
    pd.testing.assert_frame_equal(a.features, b.features)
    pd.testing.assert_frame_equal(a.texts, b.texts)
    assert truth_a == truth_b
    c, _ = simulate(8, n_texts=40, rubric=rubric)
    assert not a.annotations.reset_index(drop=True).equals(c.annotations.reset_index(drop=True))
    assert not np.allclose(a.features.prob.to_numpy(), c.features.prob.to_numpy())


def test_written_tables_validate(tmp_path, rubric):
    write_simulated(tmp_path / "sim", seed=3, n_texts=30, n_judges=5)
    assert sorted(p.name for p in (tmp_path / "sim").iterdir()) == sorted(FILES)
    tables = load_tables(
        tmp_path / "sim" / "annotations.csv", tmp_path / "sim" / "features.csv", rubric, tmp_path / "sim" / "texts.csv"
    )
    assert tables.annotations.text_id.nunique() == 30
    assert set(tables.annotations.judge_id) <= {f"J{j:02d}" for j in range(1, 6)}
    assert set(tables.features.question_id) == set(rubric.ids)
    assert sorted(tables.features[tables.features.question_id == "Q8"].option.unique()) == ["1", "2", "3", "4"]
    assert set(tables.annotations[tables.annotations.question_id == "Q8"].answer) <= {"1", "2", "3"}


def test_sizes_and_judges_per_text(default):
    tables, truth = default
    q0 = tables.annotations[tables.annotations.question_id == "Q0"]
    assert len(q0) == 900 and q0.text_id.nunique() == 300 and q0.judge_id.nunique() == 12
    assert (q0.groupby("text_id").judge_id.nunique() == 3).all()
    assert truth["sizes"] == {"texts": 300, "judges": 12, "judges_per_text": 3, "annotations": 900}
    assert set(tables.texts.system_id) == {"S1", "S2", "S3", "S4"}


def test_embedded_data_is_the_default_regeneration(tmp_path):
    fresh = write_simulated(tmp_path / "sim")
    for name in ("annotations.csv", "texts.csv"):
        assert (EMBEDDED / name).read_text() == (fresh / name).read_text(), (
            f"data/simulated/{name} is stale: run `llmrubric data simulate data/simulated`"
        )
    old, new = (pd.read_csv(d / "features.csv", dtype={"option": str}) for d in (EMBEDDED, fresh))
    pd.testing.assert_frame_equal(old, new, check_exact=False, atol=2e-6)
    assert _close(json.loads((EMBEDDED / "truth.json").read_text()), json.loads((fresh / "truth.json").read_text()))


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float) and not isinstance(b, bool):
        return abs(a - b) <= 2e-4
    return a == b


def test_idiosyncratic_judge_is_recorded_and_visible(default):
    tables, truth = default
    odd = truth["idiosyncratic_judge"]["judge_id"]
    assert odd in truth["judges"] and truth["idiosyncratic_judge"]["dimension"] == "concision"
    assert truth["judges"][odd]["q0_weights"][2] > 0.9
    wide = (
        tables.annotations.assign(v=tables.annotations.answer.astype(int))
        .pivot_table(index=["text_id", "judge_id"], columns="question_id", values="v")
        .reset_index()
    )
    mine, rest = wide[wide.judge_id == odd], wide[wide.judge_id != odd]
    assert len(mine) > 40
    assert mine.Q0.mean() < rest.Q0.mean() - 0.4  # harsh
    assert mine.Q0.corr(mine.Q7) > rest.Q0.corr(rest.Q7) + 0.25  # Q0 follows conciseness
    assert mine.Q0.corr(mine.Q1) < rest.Q0.corr(rest.Q1) - 0.15  # and ignores naturalness


def test_texts_without_references_have_no_citation_answers(default):
    tables, truth = default
    ann, texts = tables.annotations, tables.texts
    no_refs = set(texts.text_id[~texts.has_references])
    assert 0 < len(no_refs) < len(texts)
    assert not ann[ann.text_id.isin(no_refs) & ann.question_id.isin(CITATION)].size
    cited = ann[~ann.text_id.isin(no_refs)].groupby(["text_id", "judge_id"]).question_id.nunique()
    assert (cited == 9).all()
    assert all(truth["texts"][t]["has_references"] is False for t in no_refs)
    per_text = tables.features.groupby("text_id").question_id.nunique()
    assert (per_text == 9).all()  # the LLM answers Q2..Q5 on every text


def test_llm_mass_is_unnormalised(default):
    tables, _ = default
    mass = tables.features.groupby(["text_id", "question_id"]).prob.sum()
    assert (mass <= 1).all() and (mass >= 0.96).all()
    assert (mass < 0.99).mean() > 0.2


def test_write_refuses_foreign_folder_and_replaces_own(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="notes.txt"):
        write_simulated(foreign, n_texts=10)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    dest = write_simulated(tmp_path / "sim", seed=1, n_texts=10)
    first = (dest / "annotations.csv").read_text()
    write_simulated(dest, seed=2, n_texts=10)
    assert (dest / "annotations.csv").read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "sim"]


def test_written_folder_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        dest = write_simulated(tmp_path / "sim", n_texts=10)
    finally:
        os.umask(old)
    assert dest.stat().st_mode & 0o777 == 0o750
    assert {p.name: p.stat().st_mode & 0o777 for p in dest.iterdir()} == dict.fromkeys(FILES, 0o640)


def test_cli_simulate(tmp_path, capsys):
    assert main(["data", "simulate", str(tmp_path / "sim"), "--seed", "5", "--texts", "12", "--judges", "4"]) == 0
    truth = json.loads((tmp_path / "sim" / "truth.json").read_text())
    assert truth["seed"] == 5 and truth["sizes"]["texts"] == 12
    assert main(["data", "simulate", str(tmp_path / "bad"), "--judges", "2", "--judges-per-text", "3"]) == 2
    assert "judges_per_text" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_shift_set_has_systems_beyond_the_others_and_several_sources(rubric):
    tables, truth = simulate_shift(0, n_texts=480, rubric=rubric)
    q0 = tables.annotations[tables.annotations.question_id == "Q0"]
    human = q0.answer.astype(float).groupby(q0.system_id).mean()
    assert len(human) == 12 and set(truth["systems"]) == set(human.index)
    rest = human.drop(["S01", "S02"])
    assert human["S01"] > rest.max() + 0.2 and human["S02"] < rest.min() - 0.2  # best and worst beyond the rest
    sources = [s["source"] for s in truth["llm_sources"]]
    assert sorted(tables.features.source.unique()) == sorted(sources) and len(sources) == 3
    assert len({s["temperature"] for s in truth["llm_sources"]}) == 3
    assert len(set(truth["judge_spreads"].values())) == 12  # each judge its own cut spread
    assert (tables.features.groupby(["text_id", "source"]).question_id.nunique() == 9).all()
    again, _ = simulate_shift(0, n_texts=480, rubric=rubric)
    pd.testing.assert_frame_equal(tables.features, again.features)
    with pytest.raises(InputError, match="at least 4 systems"):
        simulate_shift(0, n_systems=3, rubric=rubric)


def test_cli_simulate_shift(tmp_path):
    assert main(["data", "simulate", str(tmp_path / "shift"), "--texts", "60", "--shift-systems", "6"]) == 0
    texts = pd.read_csv(tmp_path / "shift" / "texts.csv")
    assert texts.system_id.nunique() == 6
