"""IR evaluations: RUBRIC qrels and measures, Rubric-Cover, verification, nuggets, calibrated grades."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT
from support.settings import FAST

from llmrubric.cli import main
from llmrubric.data.splits import holdout_texts
from llmrubric.extract.testbank import Item, read_bank, write_bank
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.ir import autograder as ag
from llmrubric.ir import nuggets as ng
from llmrubric.ir.calibrated import calibrated_labels, ir_tables
from llmrubric.model.core.label_rule import LabelRule
from llmrubric.model.families.network.calibrator import NetworkCalibrator

GRADES = pd.DataFrame(
    [
        ("q1", "d1", "i1", 4),
        ("q1", "d1", "i2", 2),
        ("q1", "d2", "i1", 1),
        ("q1", "d2", "i2", 0),
        ("q1", "d3", "i1", 5),
        ("q1", "d3", "i2", 5),
        ("q1", "d4", "i1", 2),
        ("q1", "d4", "i2", 3),
        ("q2", "e1", "k1", 4),
        ("q2", "e2", "k1", 0),
    ],
    columns=["query_id", "doc_id", "item_id", "grade"],
)


def self_rating_features(rows):
    """rows: (text, item, distribution over grades 0..5)."""
    out = [(t, "llm", f"self_rating:{i}", str(g), p) for t, i, dist in rows for g, p in enumerate(dist)]
    return pd.DataFrame(out, columns=["text_id", "source", "question_id", "option", "prob"])


def test_grades_from_distributions_argmax_and_expected():
    feats = self_rating_features([("p1", "i1", [0.1, 0, 0, 0.2, 0.6, 0.1]), ("p1", "i2", [0.5, 0.5, 0, 0, 0, 0])])
    texts = pd.DataFrame({"text_id": ["p1"], "query_id": ["q9"], "doc_id": ["D1"]})
    argmax = ag.grades_from_features(feats, texts, mode="argmax").set_index("item_id")
    expected = ag.grades_from_features(feats, texts, mode="expected").set_index("item_id")
    assert argmax.at["i1", "grade"] == 4 and argmax.at["i2", "grade"] == 0
    assert expected.at["i1", "grade"] == pytest.approx(0.6 + 2.4 + 0.5) and expected.at["i2", "grade"] == pytest.approx(
        0.5
    )
    assert set(argmax.doc_id) == {"D1"} and set(argmax.query_id) == {"q9"}
    with pytest.raises(InputError, match="not in the texts table"):
        ag.grades_from_features(feats, texts.assign(text_id="other"))


def test_passage_labels_max_and_at_least_m():
    best = ag.passage_labels(GRADES).set_index("doc_id").relevance.to_dict()
    assert best == {"d1": 4, "d2": 1, "d3": 5, "d4": 3, "e1": 4, "e2": 0}
    second = ag.passage_labels(GRADES, "at_least_m", m=2).set_index("doc_id").relevance.to_dict()
    assert second == {"d1": 2, "d2": 0, "d3": 5, "d4": 2, "e1": 0, "e2": 0}
    halves = ag.passage_labels(GRADES.assign(grade=GRADES.grade - 0.5)).set_index("doc_id").relevance
    assert halves["d1"] == 4 and halves["d2"] == 1  # 3.5 → 4, 0.5 → 1 (half up)


def test_qrels_and_trec_measures_against_hand_computed_values(tmp_path):
    labels = ag.passage_labels(GRADES)
    ag.write_qrels(labels, tmp_path / "qrels.txt")
    assert (tmp_path / "qrels.txt").read_text().splitlines()[0] == "q1 0 d1 4"
    qrels = ag.read_qrels(tmp_path / "qrels.txt")
    (tmp_path / "run.txt").write_text("q1 Q0 d2 1 4.0 r\nq1 Q0 d1 2 3.0 r\nq1 Q0 d4 3 2.0 r\nq1 Q0 d3 4 1.0 r\n")
    run = ag.read_run(tmp_path / "run.txt", set(qrels.query_id))
    board, per_query = ag.evaluate_runs(
        qrels[qrels.query_id == "q1"], {"r": run}, ["AP", "RR", "P@2", "nDCG@3"], threshold=4
    )
    row = board.iloc[0]
    assert row["AP(rel=4)"] == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert row["RR(rel=4)"] == pytest.approx(0.5) and row["P(rel=4)@2"] == pytest.approx(0.5)
    ndcg = [c for c in board.columns if c.startswith("nDCG")][0]
    assert row[ndcg] == pytest.approx((4 / math.log2(3)) / (5 + 4 / math.log2(3)))
    assert set(per_query.query_id) == {"q1"}
    both, per_query = ag.evaluate_runs(qrels, {"r": run}, ["AP"], threshold=4)  # q2 unanswered: scores 0 (trec_eval -c)
    assert both.iloc[0]["AP(rel=4)"] == pytest.approx(0.25) and both.iloc[0].missing_queries == 1


def test_run_and_qrels_bad_input(tmp_path):
    (tmp_path / "dup.txt").write_text("q1 Q0 d1 1 2.0 r\nq1 Q0 d1 2 1.0 r\n")
    with pytest.raises(InputError) as info:
        ag.read_run(tmp_path / "dup.txt")
    assert (info.value.row, info.value.column) == (2, "doc_id")
    (tmp_path / "unknown.txt").write_text("q1 Q0 d1 1 2.0 r\n\nq7 Q0 d1 1 1.0 r\n")
    with pytest.raises(InputError, match="unknown query 'q7'") as info:
        ag.read_run(tmp_path / "unknown.txt", {"q1"})
    assert info.value.row == 3 and info.value.file.endswith("unknown.txt")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\nq1 0 d2 0\nq1 0 d1 2\n")
    with pytest.raises(InputError, match="judged twice") as info:
        ag.read_qrels(tmp_path / "qrels.txt")
    assert info.value.row == 3
    with pytest.raises(InputError, match="graded twice"):
        ag.check_grades(pd.concat([GRADES, GRADES.iloc[:1]], ignore_index=True))


def test_rubric_cover_at_k():
    run = pd.DataFrame(
        {
            "query_id": ["q1"] * 4,
            "doc_id": ["d2", "d1", "d4", "d3"],
            "rank": [1, 2, 3, 4],
            "score": [4.0, 3.0, 2.0, 1.0],
        }
    )
    cover = ag.rubric_cover(GRADES, run, k=2, threshold=4).set_index("query_id")
    assert cover.at["q1", "covered"] == 1 and cover.at["q1", "cover"] == 0.5  # d1 covers i1 only
    assert ag.rubric_cover(GRADES, run, k=4, threshold=4).cover.iloc[0] == 1.0
    with_bank = ag.rubric_cover(
        GRADES, run.assign(doc_id=["dX", "d1", "d4", "d3"]), k=2, threshold=4, items={"q1": {"i1", "i2", "i3"}}
    )
    assert with_bank.cover.iloc[0] == pytest.approx(1 / 3) and with_bank.unjudged.iloc[0] == 1


def test_verification_analyses():
    judgments = pd.DataFrame(
        {"query_id": ["q1", "q1", "q1", "q1"], "doc_id": ["d1", "d2", "d3", "d4"], "relevance": [0, 2, 0, 1]}
    )
    spurious = ag.spurious_items(GRADES, judgments, threshold=4)
    top = spurious.iloc[0]
    assert (top.item_id, top.nonrelevant_covered, top.nonrelevant_judged) == (
        "i1",
        2,
        2,
    )  # d1 (4) and d3 (5) are non-relevant
    uncovered = ag.uncovered_relevant(GRADES, judgments, threshold=4)
    assert list(uncovered.doc_id) == ["d2", "d4"]
    agree = ag.agreement(ag.passage_labels(GRADES), judgments, threshold=4)
    assert agree["passages"] == 4 and agree["accuracy"] == 0.0


BANK = [
    Item("q1", "n1", "nugget", "a", "vital"),
    Item("q1", "n2", "nugget", "b", "vital"),
    Item("q1", "n3", "nugget", "c", "okay"),
    Item("q1", "n4", "nugget", "d", "okay"),
    Item("q2", "m1", "nugget", "e", "okay"),
]


def test_nugget_scores_by_hand():
    answers = pd.DataFrame({"text_id": ["x", "y", "z"], "query_id": ["q1", "q2", "q1"], "run_id": ["r1", "r1", "r2"]})
    labels = pd.DataFrame(
        {
            "text_id": ["x"] * 4 + ["y"] + ["z"] * 3,
            "item_id": ["n1", "n2", "n3", "n4", "m1", "n1", "n2", "n3"],
            "label": [
                "support",
                "partial_support",
                "not_support",
                "support",
                "support",
                "support",
                "support",
                "support",
            ],
        }
    )
    scores = ng.answer_scores(ng.support_from_labels(labels), answers, BANK).set_index("text_id")
    x = scores.loc["x"]
    assert (x.A_strict, x.V_strict, x.A_partial, x.V_partial) == (0.5, 0.5, 0.625, 0.75)
    assert scores.at["y", "A_strict"] == 1.0 and math.isnan(scores.at["y", "V_strict"])
    assert scores.at["z", "status"].startswith("incomplete") and math.isnan(scores.at["z", "A_strict"])
    runs = ng.run_scores(scores.reset_index()).set_index("run_id")
    assert runs.at["r1", "A_strict"] == 0.75 and runs.at["r1", "V_strict"] == 0.5 and runs.at["r1", "no_vital"] == 1
    assert runs.at["r2", "left_out"] == 1 and math.isnan(runs.at["r2", "A_strict"])


def test_nugget_scores_from_distributions_are_expectations():
    rows = []
    for item, dist in zip(
        ["n1", "n2", "n3", "n4"], [(0.8, 0.2, 0.0), (0.0, 1.0, 0.0), (0.1, 0.1, 0.8), (0.5, 0.0, 0.5)]
    ):
        rows += [("x", "llm", f"nugget_support:{item}", label, p) for label, p in zip(ng.LABELS, dist)]
    support = ng.support_from_features(
        pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"])
    )
    x = ng.answer_scores(support, pd.DataFrame({"text_id": ["x"], "query_id": ["q1"]}), BANK).iloc[0]
    assert x.A_strict == pytest.approx((0.8 + 0 + 0.1 + 0.5) / 4) and x.V_strict == pytest.approx(0.4)
    assert x.V_partial == pytest.approx((0.8 + 0.1 + 0.5) / 2)


def test_nugget_bad_input(tmp_path):
    answers = pd.DataFrame({"text_id": ["x"], "query_id": ["q1"]})
    with pytest.raises(InputError, match="assigned twice"):
        ng.support_from_labels(
            pd.DataFrame({"text_id": ["x", "x"], "item_id": ["n1", "n1"], "label": ["support", "support"]})
        )
    with pytest.raises(InputError, match="not one of") as info:
        ng.support_from_labels(pd.DataFrame({"text_id": ["x"], "item_id": ["n1"], "label": ["maybe"]}, index=[1]))
    assert info.value.row == 1 and info.value.column == "label"
    with pytest.raises(InputError, match="not in the test bank of query 'q1'"):
        ng.answer_scores(
            ng.support_from_labels(pd.DataFrame({"text_id": ["x"], "item_id": ["m1"], "label": ["support"]})),
            answers,
            BANK,
        )
    (tmp_path / "bank.jsonl").write_text(
        '{"query_id": "q1", "item_id": "n1", "text": "a"}\n{"query_id": "q1", "item_id": "n1", "text": "b"}\n'
    )
    with pytest.raises(InputError, match="duplicate item_id") as info:
        read_bank(tmp_path / "bank.jsonl")
    assert info.value.row == 2


def simulate_passages(seed=0, queries=40, per_query=15):
    """Passages with latent relevance r in 0..3, four real items and one spurious item per query.

    The LLM grades a real item high when the passage covers it (more likely when r is high),
    and grades the spurious item high whatever the passage; three assessors label r with
    their own offsets (one harsh).
    """
    rng = np.random.default_rng(seed)
    grades = np.arange(6)
    rows, texts, labels = [], [], []
    offsets = {"J1": 0.0, "J2": -0.8, "J3": 0.3}
    for q in range(queries):
        for d in range(per_query):
            text = f"q{q}_d{d}"
            r = rng.integers(0, 4)
            texts.append((text, f"q{q}", f"d{d}"))
            for i in range(5):
                covered = rng.random() < r / 3 * 0.9 if i < 4 else True
                mu = (4.3 if covered else 0.7) + rng.normal(0, 0.5)
                logits = -((grades - mu) ** 2) / 1.5 + rng.normal(0, 0.3, 6)
                p = np.exp(logits - logits.max())
                rows += [(text, "llm", f"self_rating:q{q}i{i}", str(g), float(x)) for g, x in zip(grades, p / p.sum())]
            for judge in rng.choice(list(offsets), 2, replace=False):
                labels.append(
                    (text, judge, "relevance", int(np.clip(np.round(r + offsets[judge] + rng.normal(0, 0.4)), 0, 3)))
                )
    feats = pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"])
    return (
        feats,
        pd.DataFrame(texts, columns=["text_id", "query_id", "doc_id"]),
        pd.DataFrame(labels, columns=["text_id", "judge_id", "question_id", "answer"]),
    )


@pytest.mark.slow
def test_calibrated_autograder_beats_the_uncalibrated_max_grade():
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "relevance.yaml")
    feats, texts, labels = simulate_passages()
    train_texts, test_texts = holdout_texts(texts.text_id, 0.3, seed=0)
    tables = ir_tables(feats, "self_rating", labels, rubric)
    model = NetworkCalibrator(rubric, trainer=FAST, seed=0).fit(tables.subset(train_texts))
    test = texts[texts.text_id.isin(test_texts)]
    calibrated = calibrated_labels(model, feats[feats.text_id.isin(test_texts)], "self_rating", test)
    raw = ag.passage_labels(ag.grades_from_features(feats[feats.text_id.isin(test_texts)], test, mode="expected"))
    human = labels.groupby("text_id").answer.mean().rename("human")
    key = test.set_index(["query_id", "doc_id"]).text_id
    joined = lambda df: df.assign(
        text_id=key.reindex(pd.MultiIndex.from_frame(df[["query_id", "doc_id"]])).to_numpy()
    ).join(human, on="text_id")
    cal, unc = joined(calibrated), joined(raw)
    r_cal, r_raw = np.corrcoef(cal.grade, cal.human)[0, 1], np.corrcoef(unc.grade, unc.human)[0, 1]
    assert r_cal > 0.6 and r_cal > r_raw + 0.2
    assert set(calibrated.relevance) <= {0, 1, 2, 3}
    cuts = np.quantile(calibrated.grade, [0.4, 0.7, 0.9])  # the checkpoint's rule, not rounding, labels the passages
    model.label_rule_ = LabelRule("kappa_thresholds", tuple(cuts))
    ruled = calibrated_labels(model, feats[feats.text_id.isin(test_texts)], "self_rating", test)
    np.testing.assert_array_equal(ruled.relevance, (ruled.grade.to_numpy()[:, None] >= cuts).sum(axis=1))
    assert (ruled.relevance != np.floor(ruled.grade + 0.5)).any()


@pytest.mark.slow
def test_qrels_and_trec_eval_commands(tmp_path):
    GRADES.to_csv(tmp_path / "grades.csv", index=False)
    assert main(["ir", "qrels", "--grades", str(tmp_path / "grades.csv"), "--out", str(tmp_path / "qrels.txt")]) == 0
    assert len((tmp_path / "qrels.txt").read_text().splitlines()) == 6
    (tmp_path / "sysA.txt").write_text("q1 Q0 d3 1 9 A\nq1 Q0 d1 2 8 A\nq2 Q0 e1 1 5 A\n")
    (tmp_path / "sysB.txt").write_text("q1 Q0 d2 1 9 B\nq1 Q0 d4 2 8 B\nq2 Q0 e2 1 5 B\n")
    (tmp_path / "human.txt").write_text("q1 0 d1 0\nq1 0 d2 2\nq1 0 d3 1\nq1 0 d4 1\n")
    write_bank(
        BANK[:0]
        + [Item("q1", "i1", "question", "x"), Item("q1", "i2", "question", "y"), Item("q2", "k1", "question", "z")],
        tmp_path / "bank.jsonl",
    )
    out = tmp_path / "eval"
    code = main(
        [
            "ir",
            "trec-eval",
            "--qrels",
            str(tmp_path / "qrels.txt"),
            "--runs",
            str(tmp_path / "sysA.txt"),
            str(tmp_path / "sysB.txt"),
            "--grades",
            str(tmp_path / "grades.csv"),
            "--bank",
            str(tmp_path / "bank.jsonl"),
            "--judgments",
            str(tmp_path / "human.txt"),
            "--measures",
            "P@2",
            "--threshold",
            "4",
            "--cover-k",
            "1",
            "--out-dir",
            str(out),
        ]
    )
    assert code == 0
    board = pd.read_csv(out / "leaderboard.csv").set_index("run")
    assert board.at["sysA", "P(rel=4)@2"] == pytest.approx((1.0 + 0.5) / 2) and board.at["sysB", "P(rel=4)@2"] == 0.0
    assert (
        board.at["sysA", "RubricCover@1"] == pytest.approx((1.0 + 1.0) / 2) and board.at["sysB", "RubricCover@1"] == 0.0
    )
    report = json.loads((out / "leaderboard.json").read_text())
    assert report["verification"]["spurious_items"][0]["item_id"] == "i1" and (out / "uncovered_relevant.csv").is_file()
    (tmp_path / "bad.txt").write_text("q1 Q0 d3 1 9 A\nq5 Q0 d1 2 8 A\n")
    assert (
        main(
            [
                "ir",
                "trec-eval",
                "--qrels",
                str(tmp_path / "qrels.txt"),
                "--runs",
                str(tmp_path / "bad.txt"),
                "--out-dir",
                str(tmp_path / "no"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "no").exists()
