"""No silent wrong results: validation rules (rounding, all-zero blocks, NA answers), a run
directory that changes as a whole, non-finite predictions, JSON without NaN, the umask,
Ctrl-C and the table contracts."""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch
from support.paths import DIALSUMM
from support.scripts import run_script, snapshot
from support.settings import FAST, FAST_OVERRIDES

from llmrubric.apps import score as score_cli
from llmrubric.cli import main as cli_main
from llmrubric.io.contracts import SPECS
from llmrubric.io.errors import InputError
from llmrubric.io.files import write_json, write_table
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables, read_table, validate_annotations, validate_features
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core.encoding import FeatureLayout
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.scoring import leaderboard as lb


def block(probs, text="t1", question="Q0"):
    return pd.DataFrame(
        {
            "text_id": text,
            "source": "llm",
            "question_id": question,
            "option": [str(i + 1) for i in range(len(probs))],
            "prob": probs,
        }
    )


def test_probabilities_rounded_to_6_decimals_are_kept_as_written(rubric):
    ok = validate_features(block([0.250001, 0.250001, 0.250001, 0.250000]), rubric)  # sums to 1.000003
    assert ok.prob.sum() == pytest.approx(1.000003, abs=1e-12) and ok.attrs["renormalised_blocks"] == 0


def test_api_rounded_blocks_are_renormalised_and_counted_and_beyond_the_tolerance_is_an_error(rubric, caplog):
    api = pd.concat(  # t1 as GPT-4o-mini's log-probabilities sum (1.00004), t2 within 6-decimal rounding
        [block([0.400016, 0.300012, 0.200008, 0.100004], "t1"), block([0.25, 0.25, 0.25, 0.249999], "t2")],
        ignore_index=True,
    )
    with caplog.at_level(logging.WARNING, "llmrubric"):
        checked = validate_features(api, rubric)
    assert checked.attrs["renormalised_blocks"] == 1
    assert "1 blocks sum to more than 1 by API rounding (at most 1.000040" in caplog.text
    sums = checked.groupby("text_id").prob.sum()
    assert sums["t1"] == pytest.approx(1.0, abs=1e-12) and sums["t2"] == pytest.approx(0.999999, abs=1e-12)
    assert checked.prob.iloc[0] == pytest.approx(0.4, abs=1e-9)
    with pytest.raises(InputError, match=r"row 0, column 'prob'.*sum to 1\.001005 > 1 \+ 0\.001"):
        validate_features(block([0.251002, 0.250001, 0.250001, 0.250001]), rubric)


def test_an_all_zero_block_is_missing_not_an_expected_answer_of_0(simulated, rubric, caplog):
    feats = simulated.features.copy()
    zero = (feats.text_id == "t0001") & (feats.question_id == "Q0")
    with caplog.at_level(logging.WARNING, "llmrubric"):
        checked = validate_features(feats.assign(prob=np.where(zero, 0.0, feats.prob)), rubric)
    assert (
        checked.attrs["zero_blocks"] == 1 and "1 blocks of all-zero probabilities are treated as missing" in caplog.text
    )
    absent = validate_features(feats[~zero], rubric)
    layout = FeatureLayout.from_features(simulated.features, rubric)
    x_zero, x_absent = layout.matrix(checked, ["t0001", "t0002"]), layout.matrix(absent, ["t0001", "t0002"])
    assert np.array_equal(x_zero, x_absent)
    assert x_zero[0, layout.dim - len(layout.blocks)] == 0.0  # the Q0 presence flag is off


def test_a_one_option_block_of_0_is_a_value_not_missing():
    coverage = pd.DataFrame(
        {
            "text_id": ["t1", "t2"],
            "source": "llm",
            "question_id": "self_rating.cov_ge4",
            "option": "covered",
            "prob": [0.0, 0.5],
        }
    )
    checked = validate_features(coverage)
    assert list(checked.prob) == [0.0, 0.5] and checked.attrs["zero_blocks"] == 0


def test_na_answers_are_absent_rows_and_counted(rubric, tmp_path, caplog):
    (tmp_path / "ann.csv").write_text(
        "text_id,judge_id,question_id,answer\nt1,J1,Q0,3\nt1,J2,Q0,NA\nt2,J1,Q0,\nt2,J2,Q0,4\n"
    )
    with caplog.at_level(logging.WARNING, "llmrubric"):
        ann = validate_annotations(read_table(tmp_path / "ann.csv", "annotations"), rubric)
    assert list(ann.index) == [1, 4] and list(ann.answer) == ["3", "4"]  # rows keep their file numbers
    assert ann.attrs["absent_rows"] == 2 and "2 rows with an NA answer are absent rows" in caplog.text


@pytest.mark.slow
def test_an_interrupted_training_leaves_the_run_directory_as_it_was(tmp_path, monkeypatch):
    args = [
        "experiment=demo",
        f"run_dir={tmp_path}",
        "protocol=cv",
        "folds=2",
        "logger=none",
        "model.ensemble=1",
        "model.auto.candidates=[network]",  # model=auto (its save is interrupted) with one candidate to train
        *FAST_OVERRIDES,
    ]
    assert run_script("train.py", args) == 0
    before = snapshot(tmp_path)
    assert set(before) >= {"folds.csv", "fold0.safetensors", "fold1.safetensors"}
    saved = []
    original = AutoCalibrator.save

    def save_then_interrupt(self, path):
        saved.append(path)
        if len(saved) == 2:
            raise KeyboardInterrupt
        return original(self, path)

    monkeypatch.setattr(AutoCalibrator, "save", save_then_interrupt)
    assert run_script("train.py", [*args, "seed=7"]) == 130  # other folds, killed after the first model
    assert snapshot(tmp_path) == before, "old folds and checkpoints must stay together"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".train-")]


@pytest.mark.slow
def test_non_finite_predictions_are_an_error_not_a_score(simulated, rubric):
    model = NetworkCalibrator(rubric, {"ensemble": 1}, FAST, 0).fit(simulated.subset(simulated.text_ids[:30]))
    with torch.no_grad():
        next(p for p in model.nets_[0].parameters() if p.numel()).view(-1)[0] = float("nan")
    with pytest.raises(InputError, match="non-finite predictions"):
        model.predict(simulated.subset(simulated.text_ids[30:40]))


def test_json_outputs_hold_null_never_a_bare_nan(tmp_path):
    write_json({"a": float("nan"), "b": [np.float32("inf"), 1.5], "c": {"d": np.float64("nan")}}, tmp_path / "x.json")
    data = json.loads((tmp_path / "x.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert data == {"a": None, "b": [None, 1.5], "c": {"d": None}}
    corr = lb.rank_correlation(pd.Series({"A": 1.0, "B": 1.0}), pd.Series({"A": 2.0, "B": 3.0}), name_a="mine")
    assert math.isnan(corr["spearman"]) and corr["reason"] == "undefined: constant scores in mine"
    one = lb.rank_correlation(pd.Series({"A": 1.0}), pd.Series({"A": 2.0}))
    assert one["reason"] == "undefined: 1 common system(s)"


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_outputs_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.csv")
        write_json({"a": 1}, tmp_path / "t.json")
    finally:
        os.umask(old)
    assert (tmp_path / "t.csv").stat().st_mode & 0o777 == mode and (tmp_path / "t.json").stat().st_mode & 0o777 == mode


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(score_cli, "run_rank_correlation", interrupted)
    assert cli_main(["leaderboard", "correlate", "a.csv", "b.csv"]) == 130
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_hydra_full_error_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(InputError, match="trainer.lr"):
        run_script("train.py", ["experiment=demo", f"run_dir={tmp_path}", "logger=none", "trainer.lr=abc"])
    with pytest.raises(InputError, match="not found"):
        cli_main(["leaderboard", "correlate", str(tmp_path / "a.csv"), str(tmp_path / "b.csv")])


def test_schema_command_prints_the_validators_specs(capsys):
    assert cli_main(["schema", "show"]) == 0
    out = capsys.readouterr().out
    for kind, spec in SPECS.items():
        assert f"## {kind}" in out
        described = [name for name, _ in spec.columns]
        assert set(spec.required) | set(spec.optional) <= set(described)
        for name in spec.required:
            assert f"| {name} | yes |" in out
    assert "| answer | yes | an option value or label of the question; empty or NA: the row is absent" in out
    assert "1 + options × 1e-06" in out


@pytest.mark.slow
@pytest.mark.skipif(not DIALSUMM.is_dir(), reason=f"the shared DialSumm set is not at {DIALSUMM}")
def test_the_shared_dialsumm_features_load_with_their_api_rounded_blocks_renormalised():
    """GPT-4o-mini's 1,664 blocks that sum to up to 1.00004 (../shared/data/dialsumm/README.md) load, renormalised."""
    rubric = Rubric.load(DIALSUMM / "rubric.yaml")
    tables = load_tables(DIALSUMM / "annotations.csv", DIALSUMM / "features.csv", rubric, texts=DIALSUMM / "texts.csv")
    feats = tables.features
    assert feats.attrs["renormalised_blocks"] == 1664
    sums = feats.groupby(["text_id", "source", "question_id"]).prob.sum()
    assert sums.max() <= 1 + 5 * 1e-6 + 1e-12  # 5 options: what 6-decimal rounding allows, kept as written
