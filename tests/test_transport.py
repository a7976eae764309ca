"""The transport check (issue 61): TOST verdicts of a new system's labels against its level, and what the
leaderboard does with them."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from llmrubric.cli import main
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.scoring import leaderboard as lb
from llmrubric.scoring.labels import uniform_interval
from llmrubric.scoring.levels import read_levels
from llmrubric.scoring.transport import TransportSettings, mean_residual_interval, transport_check

RUBRIC = Rubric.from_dict({"name": "t", "questions": [{"id": "Q", "main": True, "options": [1, 2, 3, 4, 5]}]})


def test_the_mean_residual_interval_is_students_and_clusters_by_query():
    rng = np.random.default_rng(0)
    r = rng.normal(0.1, 0.5, 12)
    out = mean_residual_interval(r, None, 0.8)
    half = stats.t.ppf(0.9, 11) * r.std(ddof=1) / math.sqrt(12)
    assert out["low"] == pytest.approx(r.mean() - half) and out["df"] == 11
    # the same six residuals twice, each pair in one query: six clusters, not twelve independent texts
    six = rng.normal(0, 0.5, 6)
    clustered = mean_residual_interval(np.repeat(six, 2), np.repeat(np.arange(6), 2), 0.8)
    naive = mean_residual_interval(np.repeat(six, 2), None, 0.8)
    assert clustered["clusters"] == 6 and clustered["df"] == 5
    assert clustered["high"] - clustered["low"] > naive["high"] - naive["low"]


def test_verdicts_pass_fail_inconclusive_and_too_few():
    rng = np.random.default_rng(1)
    c = rng.normal(3, 0.5, 40)
    noise = rng.normal(0, 0.3, 40)
    assert transport_check(c + noise, c, 0.3, 0.05)["verdict"] == "PASS"
    far = transport_check(c + 1.0 + noise, c, 0.3, 0.05)
    assert far["verdict"] == "FAIL" and far["low"] > 0.3 and far["residual"] == pytest.approx(1.0, abs=0.15)
    assert transport_check(c[:10] + 0.3 + noise[:10], c[:10], 0.3, 0.05)["verdict"] == "INCONCLUSIVE"
    few = transport_check(c[:5] + noise[:5], c[:5], 0.3, 0.05, min_labels=10)
    assert few["verdict"] == "too few labels" and few["labels"] == 5 and math.isnan(few["low"])
    with pytest.raises(InputError, match="margin"):
        transport_check(c, c, -1.0)
    assert TransportSettings(None, 0.05).margin_of(0.5) == pytest.approx(1.959964 * 0.5, rel=1e-6)


def board_inputs(rng, n=40):
    """Predictions of two new systems (A: its prior 1.2 too high; B: its prior right) and labels of 20 texts each."""
    rows, labels = [], {}
    for system in ("A", "B"):
        for i in range(n):
            text = f"{system}{i}"
            p = rng.dirichlet(np.full(5, 2.0))
            for judge in ("j1", "j2"):
                rows.append({"text_id": text, "judge_id": judge, "system_id": system, "question_id": "Q"})
                rows[-1].update({f"p_{k + 1}": p[k] for k in range(5)})
            if i < 20:
                labels[text] = float(p @ np.arange(1, 6) + rng.normal(0, 0.3))
    pred = pd.DataFrame(rows)
    p = pred[[f"p_{k}" for k in range(1, 6)]].to_numpy()
    pred["mean"] = p @ np.arange(1, 6)
    pred["var"] = p @ np.arange(1, 6) ** 2 - pred["mean"] ** 2
    truth = {s: np.mean([v for t, v in labels.items() if t.startswith(s)]) for s in "AB"}
    f_mean = {
        s: float((pred[pred.system_id == s][[f"p_{k}" for k in range(1, 6)]].to_numpy() @ np.arange(1, 6)).mean())
        for s in "AB"
    }
    levels = pd.DataFrame(
        {
            "system_id": ["A", "B"],
            "level": [f_mean["A"] + 1.2, f_mean["B"]],
            "level_sd": [0.4, 0.4],
            "known": [False, False],
            "sigma_within": [0.5, 0.5],
        }
    )
    return pred, pd.Series(labels), levels, truth


@pytest.mark.slow
def test_a_failed_system_falls_back_to_the_ppi_pp_interval_of_its_labels_and_the_board_says_so(tmp_path):
    pred, labels, levels, _ = board_inputs(np.random.default_rng(2))
    levels.to_csv(tmp_path / "levels.csv", index=False)
    res = lb.build(
        pred,
        RUBRIC.main,
        n_boot=20,
        alpha=0.1,
        labels=labels,
        levels=read_levels(tmp_path / "levels.csv"),
        transport=TransportSettings(0.3, 0.1, 10),
    )
    board = res.board.set_index("system")
    assert board.at["A", "transport"] == "FAIL" and board.at["B", "transport"] == "PASS"
    a = pred[pred.system_id == "A"]
    f = (
        pd.Series((a[[f"p_{k}" for k in range(1, 6)]].to_numpy() @ np.arange(1, 6)), index=a.text_id)
        .groupby(level=0)
        .mean()
    )
    mine = labels[labels.index.str.startswith("A")]
    ppi = uniform_interval("ppi_pp", mine, f[mine.index], f.drop(mine.index), 0.1, "student")
    assert board.at["A", "level_low"] == pytest.approx(ppi["low"]) and board.at["A", "level_high"] == pytest.approx(
        ppi["high"]
    )
    assert "PPI++ of its labels alone (transport FAIL" in board.at["A", "level_interval"]
    assert board.at["B", "level_interval"] == "the level updated by PPI++ of its labels"
    assert res.settings["transport_check"]["verdicts"] == {"A": "FAIL", "B": "PASS"}
    text = lb.markdown(res.board, "t", res.settings)
    assert "| transport |" in text and "FAIL → PPI++: residual" in text and "transport: TOST at alpha 0.1" in text
    unchecked = lb.build(
        pred, RUBRIC.main, n_boot=20, alpha=0.1, labels=labels, levels=read_levels(tmp_path / "levels.csv")
    )
    assert "transport" not in unchecked.board.columns  # the Python API checks only when asked
    posterior = unchecked.board.set_index("system").loc["A"]  # without the check: the prior pulls A's level up
    assert posterior.level > board.at["A", "level"] and posterior.level_low != pytest.approx(ppi["low"])


@pytest.mark.slow
def test_leaderboard_build_checks_transport_by_default_and_refuses_a_bad_margin(tmp_path, capsys):
    pred, labels, levels, _ = board_inputs(np.random.default_rng(3))
    pred.to_csv(tmp_path / "pred.csv", index=False)
    levels.to_csv(tmp_path / "levels.csv", index=False)
    ann = pd.DataFrame(
        {
            "text_id": labels.index,
            "judge_id": "h",
            "system_id": labels.index.str[0],
            "question_id": "Q",
            "answer": labels.round().clip(1, 5).astype(int),
        }
    )
    ann.to_csv(tmp_path / "ann.csv", index=False)
    rubric = tmp_path / "rubric.yaml"
    rubric.write_text("name: t\nquestions:\n  - id: Q\n    main: true\n    options: [1, 2, 3, 4, 5]\n")
    args = [
        "leaderboard",
        "build",
        str(tmp_path / "pred.csv"),
        "--rubric",
        str(rubric),
        "--levels",
        str(tmp_path / "levels.csv"),
    ]
    args += ["--annotations", str(tmp_path / "ann.csv"), "--bootstrap", "20"]
    assert main([*args, "--out-dir", str(tmp_path / "board")]) == 0
    written = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    verdicts = written["settings"]["transport_check"]["verdicts"]
    assert (
        verdicts["A"] in ("FAIL", "INCONCLUSIVE")
        and "prior half-width" in written["settings"]["transport_check"]["rule"]
    )
    assert (tmp_path / "board" / "density.png").is_file()
    capsys.readouterr()
    assert main([*args, "--out-dir", str(tmp_path / "bad"), "--transport-margin", "-0.2"]) == 2
    assert "--transport-margin" in capsys.readouterr().err and not (tmp_path / "bad" / "leaderboard.csv").exists()
