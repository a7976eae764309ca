"""Grounded question answering evaluation (the grounded-QA evaluation note).

Per question: Recall@k of the gold document among the retrieved documents; citation
precision / recall / F1 on exact sentence ids (questions without gold evidence skipped);
answer quality ``a = A / 5`` where A is the expected value of the extracted 1–5 rubric
distribution (``answer_quality:<item>`` block of the answer); evidence score ``e`` = share
of the gold evidence words found in the predicted evidence sentences (no gold: 1 if nothing
predicted else 0; no document structure: exact id overlap / |gold|); combined
``c = λ a + (1 − λ) e``. A judge failure leaves ``a`` and ``c`` missing with its reason and
out of the means, never 0.

Inputs: the questions JSONL (``doc_id, question, answer, evidence_sentences, rubric``, and
``question_id`` or ``id``; else ``q001``… by line), the predictions JSON (question id →
``answer, evidence_sentences, retrieved_docs``), the answer-quality features (text id =
question id), optionally the extractor's failures table and a folder of ``<doc_id>.json``
documents with a ``sentences`` list (objects with ``id``/``sentence_id`` and ``text``, or
strings numbered ``S1``, ``S2``, …).
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from llmrubric.io.errors import InputError
from llmrubric.io.tables import source_of
from llmrubric.ir.blocks import block_table, family_rows

log = logging.getLogger(__name__)
WORD = re.compile(r"\w+")


def read_questions(path: str | Path) -> list[dict]:
    """Gold questions with ``question_id``; a malformed line or a duplicate id is an error naming the line."""
    path = Path(path)
    if not path.is_file():
        raise InputError("questions file not found", file=str(path))
    out, seen = [], {}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg})", file=str(path), row=n) from e
        if not isinstance(q, dict):
            raise InputError("a questions line must be a JSON object", file=str(path), row=n)
        qid = str(q.get("question_id") or q.get("id") or f"q{len(out) + 1:03d}")
        if qid in seen:
            raise InputError(
                f"question id {qid!r} also on line {seen[qid]}", file=str(path), row=n, column="question_id"
            )
        evidence = q.get("evidence_sentences") or []
        if not isinstance(evidence, list):
            raise InputError(
                "evidence_sentences must be a list of sentence ids", file=str(path), row=n, column="evidence_sentences"
            )
        seen[qid] = n
        out.append({**q, "question_id": qid, "evidence_sentences": [str(s) for s in evidence], "line": n})
    if not out:
        raise InputError("the questions file is empty", file=str(path))
    return out


def read_predictions(path: str | Path, question_ids: set[str]) -> dict[str, dict]:
    """Predictions JSON; a question id that is not among the gold questions is an error."""
    path = Path(path)
    if not path.is_file():
        raise InputError("predictions file not found", file=str(path))
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON ({e.msg})", file=str(path), row=e.lineno) from e
    if not isinstance(data, dict):
        raise InputError("predictions must be a JSON object: question id → prediction", file=str(path))
    unknown = sorted(set(map(str, data)) - question_ids)
    if unknown:
        raise InputError(
            f"{len(unknown)} predicted question ids are not in the questions file (first: {unknown[0]!r})",
            file=str(path),
            column=unknown[0],
        )
    for qid, pred in data.items():
        if not isinstance(pred, dict):
            raise InputError(f"prediction of {qid!r} is not an object", file=str(path), column=str(qid))
        for key in ("evidence_sentences", "retrieved_docs"):
            if pred.get(key) is not None and not isinstance(pred[key], list):
                raise InputError(
                    f"{key} of {qid!r} must be a list, not {type(pred[key]).__name__} {pred[key]!r:.40}",
                    file=str(path),
                    column=key,
                )
    return {str(k): v for k, v in data.items()}


def answer_quality(
    features: pd.DataFrame, family: str = "answer_quality", failures: pd.DataFrame | None = None
) -> dict[str, dict]:
    """question id → ``{"A": expected 1–5 grade}`` or ``{"A": None, "reason": …}`` for failed blocks."""
    rows = family_rows(features, family)
    out: dict[str, dict] = {}
    if len(rows):
        wide = block_table(rows).fillna(0.0)
        twice = wide.index.get_level_values("text_id").duplicated()
        if twice.any():
            raise InputError(
                f"answer {wide.index[twice.argmax()][0]!r} has several {family} blocks",
                file=source_of(features),
                column="question_id",
            )
        values = np.array([float(c) for c in wide.columns])
        p = wide.to_numpy()
        total = p.sum(axis=1)
        for (text_id, _), t, row in zip(wide.index, total, p):
            out[str(text_id)] = (
                {"A": float(row @ values / t)} if t > 0 else {"A": None, "reason": "no probability mass on 1-5"}
            )
    if failures is not None and len(failures):
        for text_id, qid, status, reason in zip(
            failures.text_id, failures.question_id, failures.status, failures.get("reason", [""] * len(failures))
        ):
            if str(qid).startswith(f"{family}:") and str(text_id) not in out:
                out[str(text_id)] = {"A": None, "reason": f"{status}: {reason}".strip(": ")}
    return out


def load_document(docs: Path | None, doc_id: str) -> dict[str, str] | None:
    """sentence id → text of ``docs/<doc_id>.json``, or None when unavailable."""
    if docs is None:
        return None
    path = docs / f"{doc_id}.json"
    if not path.is_file():
        return None
    try:
        sentences = json.loads(path.read_text()).get("sentences")
    except (json.JSONDecodeError, AttributeError) as e:
        raise InputError(f"document structure is not a JSON object with 'sentences' ({e})", file=str(path)) from e
    if not isinstance(sentences, list):
        raise InputError("'sentences' is not a list", file=str(path), column="sentences")
    out = {}
    for i, s in enumerate(sentences, start=1):
        if isinstance(s, dict):
            out[str(s.get("id", s.get("sentence_id", f"S{i}")))] = str(s.get("text", ""))
        else:
            out[f"S{i}"] = str(s)
    return out


def words(sentence_ids, document: dict[str, str]) -> set[str]:
    return {w for s in sentence_ids for w in WORD.findall(document.get(s, "").lower())}


def evidence_score(gold: list[str], pred: list[str], document: dict[str, str] | None) -> float:
    """Word overlap |words(gold) ∩ words(pred)| / |words(gold)| with the note's special cases."""
    if not gold:
        return 1.0 if not pred else 0.0
    if document is not None:
        gold_words = words(gold, document)
        if gold_words:
            return len(gold_words & words(pred, document)) / len(gold_words)
    return len(set(gold) & set(pred)) / len(set(gold))


def citation(gold: list[str], pred: list[str]) -> dict | None:
    """Precision, recall, F1 on exact sentence ids; None without gold evidence (skipped)."""
    if not gold:
        return None
    hit = len(set(gold) & set(pred))
    p = hit / len(set(pred)) if pred else 0.0
    r = hit / len(set(gold))
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def gold_rank(gold_doc: str, retrieved) -> int | None:
    """1-based rank of the gold document among the retrieved ones (by ``rank``, else list order)."""
    if not retrieved:
        return None
    docs = sorted(
        enumerate(retrieved), key=lambda x: x[1].get("rank", x[0] + 1) if isinstance(x[1], dict) else x[0] + 1
    )
    for position, (_, d) in enumerate(docs, start=1):
        if str(d.get("doc_id") if isinstance(d, dict) else d) == str(gold_doc):
            return position
    return None


def evaluate(
    questions: list[dict],
    predictions: dict[str, dict],
    quality: dict[str, dict] | None = None,
    docs: str | Path | None = None,
    lam: float = 0.5,
    recall_at: tuple[int, ...] = (1, 5),
    progress: bool = True,
) -> dict:
    """Per-question results and dataset-level means (see the module doc)."""
    if not 0 <= lam <= 1:
        raise InputError(f"lambda {lam} is not in [0, 1]", column="lambda")
    docs = Path(docs) if docs is not None else None
    per_question = []
    for q in tqdm(questions, desc="grounded-qa", unit="question", disable=not progress, dynamic_ncols=True):
        qid, gold = q["question_id"], q["evidence_sentences"]
        pred = predictions.get(qid)
        row: dict = {"question_id": qid, "doc_id": q.get("doc_id")}
        if pred is None:
            per_question.append({**row, "status": "no prediction"})
            continue
        predicted = [str(s) for s in pred.get("evidence_sentences") or []]
        rank = gold_rank(q.get("doc_id"), pred.get("retrieved_docs"))
        row["retrieval"] = {"gold_rank": rank, **{f"hit@{k}": int(rank is not None and rank <= k) for k in recall_at}}
        row["citation"] = citation(gold, predicted)
        row["evidence"] = evidence_score(gold, predicted, load_document(docs, str(q.get("doc_id"))))
        judged = (quality or {}).get(qid)
        if judged is None:
            row["answer"] = {"A": None, "a": None, "reason": "no answer-quality judgment"}
        elif judged["A"] is None:
            row["answer"] = {"A": None, "a": None, "reason": judged.get("reason", "judge failed")}
        else:
            row["answer"] = {"A": judged["A"], "a": judged["A"] / 5}
        a = row["answer"]["a"]
        row["combined"] = None if a is None else lam * a + (1 - lam) * row["evidence"]
        row["status"] = "ok"
        per_question.append(row)
    return {"lambda": lam, "summary": summarise(per_question, recall_at, len(questions)), "questions": per_question}


def summarise(rows: list[dict], recall_at, n_questions: int) -> dict:
    scored = [r for r in rows if r["status"] == "ok"]
    cited = [r["citation"] for r in scored if r["citation"] is not None]
    judged = [r for r in scored if r["answer"]["a"] is not None]
    missing = [
        {"question_id": r["question_id"], "reason": r["answer"]["reason"]} for r in scored if r["answer"]["a"] is None
    ]
    missing += [{"question_id": r["question_id"], "reason": r["status"]} for r in rows if r["status"] != "ok"]
    if missing:
        log.warning(
            "%d questions have no answer-quality score (left out of its means): %s",
            len(missing),
            "; ".join(f"{m['question_id']}: {m['reason']}" for m in missing[:5]),
        )
    mean = lambda xs: float(np.mean(xs)) if len(xs) else math.nan
    return {
        "questions": n_questions,
        "with_prediction": len(scored),
        "retrieval": {f"recall@{k}": mean([r["retrieval"][f"hit@{k}"] for r in scored]) for k in recall_at},
        "retrieval_hits": {f"hit@{k}": int(sum(r["retrieval"][f"hit@{k}"] for r in scored)) for k in recall_at},
        "citation": {
            "questions_with_evidence": len(cited),
            **{m: mean([c[m] for c in cited]) for m in ("precision", "recall", "f1")},
        },
        "answer_score_raw": mean([r["answer"]["A"] for r in judged]),
        "answer_score": mean([r["answer"]["a"] for r in judged]),
        "evidence_score": mean([r["evidence"] for r in scored]),
        "combined_score": mean([r["combined"] for r in judged]),
        "judged": len(judged),
        "missing": missing,
    }
