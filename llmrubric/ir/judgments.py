"""TREC qrels ↔ annotations: human relevance labels of (query, passage) pairs as the annotations of
one judge on the texts ``<query_id>/<doc_id>`` (:func:`llmrubric.ir.workbench.text_id`), and back."""

from __future__ import annotations

import logging

import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.rows import check_unique, row_number
from llmrubric.io.tables import source_of
from llmrubric.ir.workbench import ANNOTATIONS, text_id

log = logging.getLogger(__name__)


def qrels_annotations(qrels: pd.DataFrame, judge_id: str, question_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read qrels (``llmrubric.ir.autograder.read_qrels``) → (annotations, texts ``text_id, query_id,
    doc_id, system_id``), in the qrels' order; the annotations keep the qrels' line numbers as index."""
    ids = [text_id(q, d) for q, d in zip(qrels.query_id, qrels.doc_id)]
    annotations = pd.DataFrame(
        {"text_id": ids, "judge_id": judge_id, "question_id": question_id, "answer": qrels.relevance.astype(str)},
        index=qrels.index,
    )[ANNOTATIONS]
    texts = pd.DataFrame(
        {"text_id": ids, "query_id": qrels.query_id.to_numpy(), "doc_id": qrels.doc_id.to_numpy()}
    ).assign(system_id=lambda t: t.query_id)
    annotations.attrs["source"] = texts.attrs["source"] = source_of(qrels)
    return annotations, texts


def add_qrels(
    annotations: pd.DataFrame, texts: pd.DataFrame, qrels: pd.DataFrame, judge_id: str, question_id: str
) -> tuple[pd.DataFrame, int]:
    """``annotations`` with the qrels' labels of the ``texts`` added (a label twice is kept once), and
    the number of qrels lines whose passage is not in ``texts`` (dropped); a qrels label that disagrees
    with an annotation of the same judge is an error naming the qrels line."""
    extra, _ = qrels_annotations(qrels, judge_id, question_id)
    known = extra.text_id.isin(texts.text_id)
    extra = extra[known]
    same = annotations[(annotations.judge_id == judge_id) & (annotations.question_id == question_id)]
    given = dict(zip(same.text_id, same.answer))
    clash = [given.get(t, a) != a for t, a in zip(extra.text_id, extra.answer)]
    if any(clash):
        line = extra.index[clash.index(True)]
        raise InputError(
            f"relevance {extra.at[line, 'answer']} of {extra.at[line, 'text_id']!r} disagrees with the "
            f"judgments ({given[extra.at[line, 'text_id']]}) of judge {judge_id!r}",
            file=source_of(qrels),
            line=int(line),
        )
    out = pd.concat([annotations, extra[~extra.text_id.isin(given)]], ignore_index=True)
    out.attrs["source"] = source_of(annotations)
    return out, int((~known).sum())


def qrels_labels(
    annotations: pd.DataFrame, texts: pd.DataFrame, judge_id: str | None, question_id: str
) -> pd.DataFrame:
    """``query_id, doc_id, relevance`` of one judge's integer labels of ``question_id``, in the
    annotations' order, for ``write_qrels``. ``judge_id`` None: the only judge of that question.
    A text missing from ``texts`` (``text_id, query_id`` + ``doc_id``, default the text id), a
    non-integer label or a text labelled twice is an error."""
    src = source_of(annotations)
    rows = annotations[annotations.question_id.astype(str) == question_id]
    judges = sorted(rows.judge_id.astype(str).unique())
    if judge_id is None:
        if len(judges) != 1:
            raise InputError(
                f"question {question_id!r} has judges {judges}: give one (--judge-id)", file=src, column="judge_id"
            )
        judge_id = judges[0]
    rows = rows[rows.judge_id.astype(str) == judge_id]
    if rows.empty:
        raise InputError(f"no {question_id!r} labels of judge {judge_id!r} (judges: {judges})", file=src)
    check_unique(
        rows,
        "text_id",
        "text {text_id!r} is labelled twice by "
        + repr(judge_id).replace("{", "{{").replace("}", "}}")
        + " (rounds are not qrels)",
        file=src,
        column="text_id",
    )
    label = pd.to_numeric(rows.answer, errors="coerce")
    bad = label.isna() | (label != label.round())
    if bad.any():
        row = rows.index[bad.to_numpy().argmax()]
        raise InputError(
            f"label {rows.at[row, 'answer']!r} is not an integer", file=src, row=row_number(row), column="answer"
        )
    info = texts.drop_duplicates("text_id").set_index("text_id")
    missing = ~rows.text_id.isin(info.index)
    if missing.any() or "query_id" not in info.columns:
        raise InputError(
            "the texts table needs text_id, query_id (+ doc_id) of every labelled text"
            + (f" (first missing: {rows.text_id[missing].iloc[0]!r})" if missing.any() else ""),
            file=source_of(texts),
            column="text_id" if missing.any() else "query_id",
        )
    doc = info["doc_id"] if "doc_id" in info.columns else pd.Series(info.index, index=info.index)
    return pd.DataFrame(
        {
            "query_id": info.query_id.reindex(rows.text_id).astype(str).to_numpy(),
            "doc_id": doc.reindex(rows.text_id).astype(str).to_numpy(),
            "relevance": label.astype(int).to_numpy(),
        }
    )
