"""Leaderboards: hand-computed scores, bootstrap, paired tests, PPI, rank correlation, files."""

import json
import logging
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from llmrubric.cli import main
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.scoring import leaderboard as lb

RUBRIC = Rubric.from_dict({"name": "t", "questions": [{"id": "Q", "main": True, "options": [1, 2, 3, 4]}]})
Q = RUBRIC.main


def predictions(rows):
    """rows: (text, judge, system, query, p1..p4)."""
    df = pd.DataFrame(rows, columns=["text_id", "judge_id", "system_id", "query_id", "p_1", "p_2", "p_3", "p_4"])
    df.insert(2, "question_id", "Q")
    p = df[["p_1", "p_2", "p_3", "p_4"]].to_numpy()
    df["mean"] = p @ [1, 2, 3, 4]
    df["var"] = p @ [1, 4, 9, 16] - df["mean"] ** 2
    return df


ONE_HOT = {1: (1, 0, 0, 0), 2: (0, 1, 0, 0), 3: (0, 0, 1, 0), 4: (0, 0, 0, 1)}


@pytest.fixture
def small():
    # system A: texts a1 (judges answer 4, 2) and a2 (3, 3); system B: b1 (1, 2), b2 (2, 2)
    rows = []
    for text, system, query, answers in (
        ("a1", "A", "q1", (4, 2)),
        ("a2", "A", "q2", (3, 3)),
        ("b1", "B", "q1", (1, 2)),
        ("b2", "B", "q2", (2, 2)),
    ):
        for judge, y in zip(("j1", "j2"), answers):
            rows.append((text, judge, system, query, *ONE_HOT[y]))
    return predictions(rows)


def test_scores_are_means_over_texts_of_judge_means(small):
    systems, judges = lb.system_data(small, Q)
    assert judges == ["j1", "j2"] and [s.system for s in systems] == ["A", "B"]
    assert np.allclose(systems[0].text_scores(), [3.0, 3.0]) and np.allclose(systems[1].text_scores(), [1.5, 2.0])
    res = lb.build(small, Q, n_boot=300, seed=1)
    board = res.board.set_index("system")
    assert board.at["A", "score"] == 3.0 and board.at["B", "score"] == 1.75
    assert board.at["A", "rank"] == 1 and board.at["B", "texts"] == 2
    assert board.at["B", "low"] <= 1.75 <= board.at["B", "high"] and board.at["B", "low"] >= 1.0
    only_j2 = lb.build(small, Q, judges=["j2"], n_boot=50).board.set_index("system")
    assert only_j2.at["A", "score"] == 2.5 and only_j2.at["B", "score"] == 2.0


def test_bootstrap_samples_answers_from_the_predicted_distributions():
    rows = [("t1", "j1", "S", "q", 0.0, 0.2, 0.0, 0.8)]
    systems, _ = lb.system_data(predictions(rows), Q)
    sampled = lb.bootstrap(systems, n_boot=4000, seed=0)["means"]["S"]
    assert set(np.unique(sampled)) == {2.0, 4.0} and abs(sampled.mean() - 3.6) < 0.05
    expected = lb.bootstrap(systems, n_boot=50, seed=0, sample_answers=False)["means"]["S"]
    assert np.allclose(expected, 3.6)
    again = lb.bootstrap(systems, n_boot=4000, seed=0)["means"]["S"]
    assert np.array_equal(sampled, again)


def test_paired_comparison_by_query_and_holm(small):
    res = lb.build(small, Q, n_boot=200, seed=0)
    row = res.comparisons.iloc[0]
    assert (row.system_a, row.system_b, row.test, row.n) == ("A", "B", "paired", 2)
    assert row["diff"] == pytest.approx(1.25)
    assert row.p_t == pytest.approx(stats.ttest_rel([3.0, 3.0], [1.5, 2.0]).pvalue)
    assert row.low <= 1.25 <= row.high and 0 <= row.p_bootstrap < 0.5
    unpaired = lb.build(small.drop(columns="query_id"), Q, n_boot=50).comparisons.iloc[0]
    assert unpaired.test == "unpaired" and unpaired.p_t == pytest.approx(
        stats.ttest_ind([3.0, 3.0], [1.5, 2.0], equal_var=False).pvalue
    )
    assert np.allclose(lb.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])


def test_label_columns_in_the_leaderboard(small):
    labels = pd.Series({"a1": 4.0, "b1": 1.0, "b2": 1.0})
    res = lb.build(small, Q, n_boot=20, labels=labels)
    board = res.board.set_index("system")
    assert math.isnan(board.at["A", "ppi"]) and board.at["A", "labelled"] == 1  # one label: no interval, no estimate
    assert board.at["B", "ppi_pp"] == pytest.approx(1.0) and board.at["B", "unlabelled"] == 0  # all labelled: classical
    assert res.settings["label_intervals"]["k"] == {"A": 1, "B": 2}
    assert "uniform" in res.settings["label_intervals"]["sampling"]
    text = lb.markdown(res.board, "t", res.settings)
    assert "| k | classical [interval] | PPI [interval] | PPI++ [interval] |" in text and "- PPI++: power-tuned" in text


def test_rank_correlation_with_ties_and_missing_systems():
    a = pd.Series({"A": 1.0, "B": 2.0, "C": 2.0, "D": 3.0})
    b = pd.Series({"A": 1.0, "B": 2.0, "C": 3.0, "D": 4.0})
    r = lb.rank_correlation(a, b)
    assert r["spearman"] == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert r["kendall"] == pytest.approx(5 / math.sqrt(30))
    with pytest.raises(InputError, match="only in b: \\['E'\\]"):
        lb.rank_correlation(a, pd.concat([b, pd.Series({"E": 5.0})]))
    dropped = lb.rank_correlation(a, pd.concat([b, pd.Series({"E": 5.0})]), missing="drop")
    assert dropped["left_out"] == ["E"] and dropped["systems"] == 4


def test_reference_file_errors(tmp_path):
    (tmp_path / "ok.csv").write_text("system,score\nA,1\nB,2\n")
    assert lb.read_leaderboard(tmp_path / "ok.csv").to_dict() == {"A": 1.0, "B": 2.0}
    (tmp_path / "dup.csv").write_text("system,score\nA,1\nB,2\nA,3\n")
    with pytest.raises(InputError) as info:
        lb.read_leaderboard(tmp_path / "dup.csv")
    assert (info.value.row, info.value.column) == (3, "system")
    (tmp_path / "nan.csv").write_text("system,score\nA,1\nB,high\n")
    with pytest.raises(InputError) as info:
        lb.read_leaderboard(tmp_path / "nan.csv")
    assert (info.value.row, info.value.column) == (2, "score")


def test_shift_errors_are_read_in_either_form_and_widen_each_score_by_the_t_half_width(tmp_path):
    (tmp_path / "errors.csv").write_text(
        "system_id,human,predicted,error,pairs\nS1,3.0,3.2,0.2,10\nS2,2.0,1.7,-0.3,12\n"
    )
    (tmp_path / "means.tsv").write_text("system\thuman\tpredicted\nS1\t3.0\t3.2\nS2\t2.0\t1.7\n")
    errors = lb.read_shift_errors(tmp_path / "errors.csv")
    assert np.allclose(errors.to_numpy(), [0.2, -0.3])
    assert np.allclose(lb.read_shift_errors(tmp_path / "means.tsv").to_numpy(), [0.2, -0.3])
    board = lb.with_shift_interval(pd.DataFrame({"system": ["A", "B"], "score": [3.0, 2.5]}), errors)
    half = stats.t.ppf(0.975, df=2) * math.sqrt((0.2**2 + 0.3**2) / 2)
    assert np.allclose(board.shift_high, [3.0 + half, 2.5 + half]) and np.allclose(
        board.shift_low, [3.0 - half, 2.5 - half]
    )
    for text, row, column, message in [
        ("system,error\nS1,0.2\nS2,inf\n", 2, "error", "not a finite number"),
        ("system,human\nS1,3\nS2,2\n", None, "predicted", "needs columns 'system', 'predicted', 'human'"),
        ("system,error\nS1,0.2\n", None, None, "at least 2 systems"),
        ("system,error\nS1,0.2\nS1,0.1\n", 2, "system", "listed twice"),
    ]:
        (tmp_path / "bad.csv").write_text(text)
        with pytest.raises(InputError, match=message) as info:
            lb.read_shift_errors(tmp_path / "bad.csv")
        assert (info.value.row, info.value.column) == (row, column)


def test_texts_without_system_are_an_error(small):
    texts = pd.DataFrame({"text_id": ["a1", "a2", "b1"], "system_id": ["A", "A", "B"]})
    with pytest.raises(InputError, match="'b2' has no system_id"):
        lb.system_data(small.drop(columns="system_id"), Q, texts)


@pytest.mark.slow
def test_leaderboard_command_writes_tables_and_plot(small, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="llmrubric.scoring.leaderboard.writing")
    small.to_csv(tmp_path / "pred.csv", index=False)
    (tmp_path / "rubric.yaml").write_text("name: t\nquestions:\n  - {id: Q, main: true, options: [1, 2, 3, 4]}\n")
    ann = pd.DataFrame(
        {
            "text_id": ["a1", "a2", "b1", "b2"],
            "judge_id": "h",
            "question_id": "Q",
            "answer": [4, 3, 2, 1],
            "system_id": ["A", "A", "B", "B"],
        }
    )
    ann.to_csv(tmp_path / "ann.csv", index=False)
    pd.DataFrame({"system": ["A", "B"], "score": [0.2, 0.9]}).to_csv(tmp_path / "ref.csv", index=False)
    out = tmp_path / "board"
    code = main(
        [
            "leaderboard",
            "build",
            str(tmp_path / "pred.csv"),
            "--rubric",
            str(tmp_path / "rubric.yaml"),
            "--annotations",
            str(tmp_path / "ann.csv"),
            "--reference",
            str(tmp_path / "ref.csv"),
            "--bootstrap",
            "100",
            "--out-dir",
            str(out),
        ]
    )
    assert code == 0
    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.system) == ["A", "B"] and list(board.human) == [3.5, 1.5]
    report = json.loads((out / "leaderboard.json").read_text())
    assert report["vs_human"]["kendall"] == 1.0 and report["vs_reference"]["kendall"] == -1.0
    assert (out / "density.png").read_bytes()[:4] == b"\x89PNG" and "| 1 | A | 3.000" in (
        out / "leaderboard.md"
    ).read_text()
    said = [r.getMessage() for r in caplog.records if "density.png" in r.getMessage()]
    assert said == ["drawing density.png: 2 systems, bands over 100 bootstrap replicates (--no-plot skips it)"]
    pd.DataFrame({"system": ["A", "C"], "score": [1, 2]}).to_csv(tmp_path / "other.csv", index=False)
    assert (
        main(
            [
                "leaderboard",
                "build",
                str(tmp_path / "pred.csv"),
                "--rubric",
                str(tmp_path / "rubric.yaml"),
                "--reference",
                str(tmp_path / "other.csv"),
                "--bootstrap",
                "10",
                "--no-plot",
                "--out-dir",
                str(tmp_path / "none"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "none").exists()


def test_the_density_bands_are_scipy_gaussian_kde_of_each_sample_computed_at_once(monkeypatch):
    """Means of drawn answers (a few distinct values, as the bootstrap's), continuous values, and samples with no
    KDE (one value, or one distinct value), in several blocks."""
    from llmrubric.scoring.leaderboard import plots

    rng = np.random.default_rng(0)
    samples = [rng.integers(1, 6, (n, 3)).mean(axis=1) for n in (50, 49, 2)] + [rng.normal(3, 1, 40)]
    samples += [np.array([2.0]), np.full(7, 3.0), np.array([1.0, 1.0, 5.0])]
    grid = np.linspace(0.5, 5.5, 200)
    monkeypatch.setattr(plots, "KDE_CELLS", 2 * 50 * len(grid))  # blocks of 2 samples at most
    curves = plots.kde_curves(samples, grid)
    for sample, curve in zip(samples, curves):
        if len(np.unique(sample)) < 2:
            assert curve is None
        else:
            assert np.allclose(curve, stats.gaussian_kde(sample)(grid), rtol=1e-10, atol=1e-12)


def test_human_leaderboard_of_the_real_release_matches_paper_table_5(llm_rubric_data, rubric):
    _, real = llm_rubric_data
    human = lb.human_leaderboard(real.annotations, rubric.main, real.texts)
    assert human["DS2"] == pytest.approx(2.915, abs=5e-4) and human["DS3"] == pytest.approx(2.697, abs=5e-4)
    assert human.idxmax() == "DS2"


def test_a_new_system_beyond_the_training_range_is_marked_on_the_level_board(small, tmp_path):
    from llmrubric.scoring.levels import read_levels

    path = tmp_path / "levels.csv"
    rows = "system_id,level,level_sd,known,sigma_within,beyond\nA,3.0,0.2,False,0.5,True\nB,1.5,0.2,True,0.5,False\n"
    path.write_text(rows)
    levels = read_levels(path)
    assert list(levels.beyond) == [True, False]
    res = lb.build(small, Q, n_boot=20, levels=levels)
    board = res.board.set_index("system")
    assert board.at["A", "beyond"] and not board.at["B", "beyond"]
    text = lb.markdown(res.board, "t", res.settings)
    assert "| A † |" in text and "| B |" in text and "†: the LLMs' answers put this new system beyond" in text
    path.write_text(rows.replace(",beyond", "").replace(",True\n", "\n").replace(",False\n", "\n"))
    assert "†" not in lb.markdown(lb.build(small, Q, n_boot=20, levels=read_levels(path)).board)
