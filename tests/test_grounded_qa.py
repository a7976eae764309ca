"""Grounded QA: the note's formulas and example numbers, missing judgments, bad input."""

import json
import math

import pandas as pd
import pytest

from llmrubric.cli import main
from llmrubric.io.errors import InputError
from llmrubric.ir import grounded_qa as gq


def test_citation_and_evidence_formulas():
    c = gq.citation(["S13", "S14"], ["S13", "S15", "S16"])
    assert (
        c["precision"] == pytest.approx(1 / 3)
        and c["recall"] == 0.5
        and c["f1"] == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))
    )
    assert gq.citation([], ["S1"]) is None and gq.citation(["S1"], [])["f1"] == 0.0
    doc = {"S1": "The EU plan cuts gas use", "S2": "by 15 percent", "S3": "Gas prices rose"}
    assert gq.evidence_score(["S1", "S2"], ["S3"], doc) == pytest.approx(1 / 9)  # {gas} of the 9 gold words
    assert gq.evidence_score([], [], doc) == 1.0 and gq.evidence_score([], ["S1"], doc) == 0.0
    assert gq.evidence_score(["S1", "S2"], ["S2", "S9"], None) == 0.5


def _questions(tmp_path, n=24):
    lines = []
    for i in range(1, n + 1):
        evidence = [] if i > 22 else [f"S{i}", f"S{i + 1}"]
        lines.append(
            json.dumps(
                {
                    "doc_id": f"doc{i}",
                    "question": f"q {i}?",
                    "answer": "a",
                    "evidence_sentences": evidence,
                    "rubric": {"scale": {}},
                }
            )
        )
    (tmp_path / "questions.jsonl").write_text("\n".join(lines) + "\n")
    return gq.read_questions(tmp_path / "questions.jsonl")


def test_recall_at_k_reproduces_the_note_example(tmp_path):
    questions = _questions(tmp_path)
    predictions = {}
    for i, q in enumerate(questions, start=1):
        gold = q["doc_id"]
        if i <= 14:
            docs = [gold, "x1", "x2"]
        elif i <= 16:
            docs = ["x1", "x2", "x3", gold]
        else:
            docs = ["x1", "x2", "x3", "x4", "x5", gold]
        predictions[q["question_id"]] = {
            "answer": "a",
            "evidence_sentences": q["evidence_sentences"][:1],
            "retrieved_docs": [{"doc_id": d, "rank": r} for r, d in enumerate(docs, start=1)],
        }
    result = gq.evaluate(questions, predictions, progress=False)
    s = result["summary"]
    assert s["retrieval_hits"] == {"hit@1": 14, "hit@5": 16}
    assert s["retrieval"]["recall@1"] == pytest.approx(14 / 24) and s["retrieval"]["recall@5"] == pytest.approx(16 / 24)
    assert (
        s["citation"]["questions_with_evidence"] == 22
        and s["citation"]["precision"] == 1.0
        and s["citation"]["recall"] == 0.5
    )
    assert questions[0]["question_id"] == "q001"


def test_answer_quality_from_distributions_and_failures_are_missing_not_zero(tmp_path):
    questions = _questions(tmp_path, n=3)
    preds = {q["question_id"]: {"answer": "a", "evidence_sentences": q["evidence_sentences"]} for q in questions}
    feats = pd.DataFrame(
        [("q001", "llm", "answer_quality:i1", str(k), p) for k, p in zip(range(1, 6), [0, 0, 0.5, 0.5, 0])]
        + [("q002", "llm", "answer_quality:i2", str(k), p) for k, p in zip(range(1, 6), [0, 0, 0, 0, 1.0])],
        columns=["text_id", "source", "question_id", "option", "prob"],
    )
    failures = pd.DataFrame(
        {
            "text_id": ["q003"],
            "source": ["llm"],
            "question_id": ["answer_quality:i3"],
            "status": ["failed"],
            "reason": ["HTTP 429"],
        }
    )
    quality = gq.answer_quality(feats, failures=failures)
    result = gq.evaluate(questions, preds, quality, lam=0.5, progress=False)
    rows = {r["question_id"]: r for r in result["questions"]}
    assert rows["q001"]["answer"]["A"] == 3.5 and rows["q001"]["answer"]["a"] == pytest.approx(0.7)
    assert rows["q001"]["evidence"] == 1.0 and rows["q001"]["combined"] == pytest.approx(0.85)
    assert (
        rows["q003"]["answer"]["a"] is None
        and rows["q003"]["combined"] is None
        and "HTTP 429" in rows["q003"]["answer"]["reason"]
    )
    s = result["summary"]
    assert s["answer_score"] == pytest.approx((0.7 + 1.0) / 2) and s["combined_score"] == pytest.approx(
        (0.85 + 1.0) / 2
    )
    assert s["judged"] == 2 and s["missing"][0]["question_id"] == "q003"
    assert math.isclose(s["answer_score_raw"], 4.25)


def test_bad_input(tmp_path):
    questions = _questions(tmp_path, n=2)
    (tmp_path / "pred.json").write_text(json.dumps({"q001": {"answer": "a"}, "q099": {"answer": "b"}}))
    with pytest.raises(InputError, match="q099"):
        gq.read_predictions(tmp_path / "pred.json", {q["question_id"] for q in questions})
    (tmp_path / "dup.jsonl").write_text('{"id": "a", "doc_id": "d"}\n{"id": "a", "doc_id": "e"}\n')
    with pytest.raises(InputError, match="also on line 1") as info:
        gq.read_questions(tmp_path / "dup.jsonl")
    assert info.value.row == 2
    with pytest.raises(InputError, match="lambda"):
        gq.evaluate(questions, {}, lam=1.5)


def test_grounded_qa_command_with_documents(tmp_path):
    _questions(tmp_path, n=2)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "doc1.json").write_text(
        json.dumps(
            {
                "sentences": [
                    {"id": "S1", "text": "alpha beta"},
                    {"id": "S2", "text": "gamma"},
                    {"id": "S3", "text": "beta delta"},
                ]
            }
        )
    )
    (tmp_path / "pred.json").write_text(
        json.dumps(
            {"q001": {"answer": "a", "evidence_sentences": ["S3"], "retrieved_docs": [{"doc_id": "doc1", "rank": 1}]}}
        )
    )
    code = main(
        [
            "ir",
            "grounded-qa",
            str(tmp_path / "questions.jsonl"),
            str(tmp_path / "pred.json"),
            "--docs",
            str(docs),
            "--no-progress",
            "--out",
            str(tmp_path / "out.json"),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "out.json").read_text())
    q1 = result["questions"][0]
    assert q1["evidence"] == pytest.approx(1 / 3)  # gold S1+S2 words {alpha, beta, gamma}; predicted S3 has beta
    assert result["summary"]["retrieval"]["recall@1"] == 1.0 and result["questions"][1]["status"] == "no prediction"
