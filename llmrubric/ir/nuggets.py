"""Nugget scores of RAG answers (AutoNuggetizer, Pradeep et al. 2024 §4.4).

For an answer to query q with nuggets N_q (vital V_q ⊆ N_q), nugget i scores p_i:

- strict: ``p_i = 1`` if the assignment is ``support``, else 0;
- partial credit: ``support`` 1, ``partial_support`` w (default 0.5), ``not_support`` 0;

``A_strict = Σ_{N_q} p_i / |N_q|``, ``V_strict = Σ_{V_q} p_i / |V_q|`` and the partial
variants ``A_partial``, ``V_partial``. From extracted distributions (``nugget_support:<item>``
blocks) p_i is its expectation: P(support), or P(support) + w·P(partial_support). A run's
score is the mean over its answers (one per query). An answer lacking an assignment for
some of its query's nuggets is reported as ``incomplete`` and left out of the means; a
query without vital nuggets has no V scores (left out of the V means, counted).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.rows import check_unique, row_number
from llmrubric.io.tables import source_of
from llmrubric.ir.blocks import block_table, family_rows, one_source

log = logging.getLogger(__name__)
LABELS = ("support", "partial_support", "not_support")
SCORES = ("A_strict", "V_strict", "A_partial", "V_partial")


def support_from_labels(assignments: pd.DataFrame) -> pd.DataFrame:
    """``text_id, item_id, label`` → ``text_id, item_id, p_support, p_partial`` (0/1)."""
    src = source_of(assignments)
    for column in ("text_id", "item_id", "label"):
        if column not in assignments.columns:
            raise InputError(f"the assignments table needs a {column!r} column", file=src, column=column)
    labels = assignments.label.astype(str).str.strip().str.lower()
    bad = ~labels.isin(LABELS)
    if bad.any():
        row = assignments.index[bad.to_numpy().argmax()]
        raise InputError(
            f"label {assignments.at[row, 'label']!r} is not one of {LABELS}",
            file=src,
            row=row_number(row),
            column="label",
        )
    out = pd.DataFrame(
        {
            "text_id": assignments.text_id.astype(str).to_numpy(),
            "item_id": assignments.item_id.astype(str).to_numpy(),
            "p_support": (labels == "support").astype(float).to_numpy(),
            "p_partial": (labels == "partial_support").astype(float).to_numpy(),
        },
        index=assignments.index,
    )
    out.attrs["source"] = src
    return _no_duplicates(out)


def support_from_features(
    features: pd.DataFrame, family: str = "nugget_support", source: str | None = None
) -> pd.DataFrame:
    """Extracted ``<family>:<item_id>`` blocks → expected ``p_support, p_partial`` (normalised over the three labels)."""
    rows = family_rows(features, family)
    if rows.empty:
        raise InputError(f"no {family!r} blocks in the features", file=source_of(features), column="question_id")
    rows = one_source(rows, family, source, source_of(features))
    wide = block_table(rows).reindex(columns=list(LABELS)).fillna(0.0)
    total = wide.sum(axis=1).to_numpy()
    if (total <= 0).any():
        text, qid = wide.index[(total <= 0).argmax()]
        raise InputError(
            f"block (text {text!r}, question {qid!r}) has no mass on {LABELS}", file=source_of(features), column="prob"
        )
    p = wide.to_numpy() / total[:, None]
    return pd.DataFrame(
        {
            "text_id": wide.index.get_level_values("text_id").astype(str),
            "item_id": wide.index.get_level_values("question_id").str.slice(len(family) + 1),
            "p_support": p[:, 0],
            "p_partial": p[:, 1],
        }
    )


def _no_duplicates(support: pd.DataFrame) -> pd.DataFrame:
    check_unique(
        support,
        ["text_id", "item_id"],
        "nugget {item_id!r} is assigned twice for answer {text_id!r}",
        file=source_of(support),
        column="item_id",
    )
    return support


def answer_scores(support: pd.DataFrame, answers: pd.DataFrame, bank, partial_weight: float = 0.5) -> pd.DataFrame:
    """One row per answer: ``text_id, run_id, query_id, nuggets, vital, status`` and ``SCORES``.

    support: ``text_id, item_id, p_support, p_partial``; answers: ``text_id, query_id`` (+
    ``run_id`` or ``system_id``); bank: test-bank items (``query_id, item_id, importance``).
    Assignments of nuggets that are not in the answer's query's bank are an error.
    """
    answers = _checked_answers(answers)
    nuggets: dict[str, list] = {}
    for item in bank:
        nuggets.setdefault(item.query_id, []).append(item)
    _check_assignments(support, dict(zip(answers.text_id, answers.query_id)), bank)
    lookup = {
        (t, n): (s, p) for t, n, s, p in zip(support.text_id, support.item_id, support.p_support, support.p_partial)
    }
    rows = [
        _answer_row(text_id, run_id, query_id, nuggets.get(query_id, []), lookup, partial_weight)
        for text_id, run_id, query_id in zip(answers.text_id, answers.run_id, answers.query_id)
    ]
    out = pd.DataFrame(rows)
    bad = out[out.status != "ok"]
    if len(bad):
        log.warning(
            "%d answers are left out of the nugget scores: %s",
            len(bad),
            "; ".join(f"{t}: {s}" for t, s in zip(bad.text_id[:5], bad.status[:5])),
        )
    return out


def _checked_answers(answers: pd.DataFrame) -> pd.DataFrame:
    """``text_id, query_id, run_id`` as strings (run: ``run_id``, else ``system_id``, else ``run``);
    an answer listed twice or a run with two answers to a query is an error."""
    src = source_of(answers)
    for column in ("text_id", "query_id"):
        if column not in answers.columns:
            raise InputError(f"the answers table needs a {column!r} column", file=src, column=column)
    run_col = "run_id" if "run_id" in answers.columns else "system_id" if "system_id" in answers.columns else None
    answers = answers.assign(
        run_id=answers[run_col].astype(str) if run_col else "run",
        text_id=answers.text_id.astype(str),
        query_id=answers.query_id.astype(str),
    )
    check_unique(answers, "text_id", "answer {text_id!r} is listed twice", file=src, column="text_id")
    check_unique(
        answers,
        ["run_id", "query_id"],
        "run {run_id!r} has two answers for query {query_id!r}",
        file=src,
        column="query_id",
    )
    return answers


def _check_assignments(support: pd.DataFrame, query_of: dict[str, str], bank) -> None:
    """Every assignment is for a known answer and a nugget of that answer's query's bank."""
    unknown_answer = ~support.text_id.isin(query_of)
    if unknown_answer.any():
        i = int(unknown_answer.to_numpy().argmax())
        raise InputError(
            f"assignment for answer {support.text_id.iloc[i]!r}, which is not in the answers table",
            file=source_of(support),
            row=row_number(support.index[i]),
            column="text_id",
        )
    bank_ids = {(i.query_id, i.item_id) for i in bank}
    foreign = [(query_of[t], n) not in bank_ids for t, n in zip(support.text_id, support.item_id)]
    if any(foreign):
        i = int(np.argmax(foreign))
        raise InputError(
            f"nugget {support.item_id.iloc[i]!r} is not in the test bank of query {query_of[support.text_id.iloc[i]]!r}",
            file=source_of(support),
            row=row_number(support.index[i]),
            column="item_id",
        )


def _answer_row(text_id: str, run_id: str, query_id: str, items: list, lookup: dict, partial_weight: float) -> dict:
    """One answer's scores, or its status (``no_nuggets``, ``incomplete``) and NaN scores."""
    row = {
        "text_id": text_id,
        "run_id": run_id,
        "query_id": query_id,
        "nuggets": len(items),
        "vital": sum(i.importance == "vital" for i in items),
    }
    got = [lookup.get((text_id, i.item_id)) for i in items]
    if not items:
        return {**row, "status": "no_nuggets", **dict.fromkeys(SCORES, math.nan)}
    if any(g is None for g in got):
        return {
            **row,
            "status": f"incomplete ({sum(g is None for g in got)} of {len(items)} nuggets unassigned)",
            **dict.fromkeys(SCORES, math.nan),
        }
    strict = np.array([g[0] for g in got])
    partial = strict + partial_weight * np.array([g[1] for g in got])
    vital = np.array([i.importance == "vital" for i in items])
    v = (lambda x: float(x[vital].mean())) if vital.any() else (lambda x: math.nan)
    return {
        **row,
        "status": "ok",
        "A_strict": float(strict.mean()),
        "V_strict": v(strict),
        "A_partial": float(partial.mean()),
        "V_partial": v(partial),
    }


def run_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """Per run: mean of each score over its scored answers, with counts of answers left out."""
    rows = []
    for run_id, part in scores.groupby("run_id", sort=True):
        ok = part[part.status == "ok"]
        rows.append(
            {
                "run_id": run_id,
                **{s: float(ok[s].mean()) if ok[s].notna().any() else math.nan for s in SCORES},
                "answers": int(len(ok)),
                "left_out": int(len(part) - len(ok)),
                "no_vital": int(ok.V_strict.isna().sum()),
            }
        )
    return pd.DataFrame(rows).sort_values("V_strict", ascending=False, kind="stable").reset_index(drop=True)
