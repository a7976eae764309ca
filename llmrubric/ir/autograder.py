"""RUBRIC autograder evaluation (Farzi & Dietz 2024 §4; Dietz 2024 workbench §3–4).

Grades per (query, passage, test-bank item) come from the extracted self-rating
distributions (``self_rating:<item_id>`` blocks, options 0–5), decoded by ``argmax`` or as
the ``expected`` grade, or from a grades table. A passage's relevance label is the best
grade over the query's items (eq. 1), or the best grade reached by at least ``m`` items; it
is exported as TREC qrels (expected grades are rounded half up to an integer label). Runs
are evaluated with trec_eval measures through ``ir-measures``, binary measures counting a
label >= τ as relevant and nDCG zeroing the gains of labels < τ. Rubric-Cover@k is the
fraction of a query's items graded >= τ by at least one of a run's first k passages. With
human judgments, the workbench's verification analyses list spurious items (often graded
>= τ on non-relevant passages) and relevant passages that no item covers.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import ir_measures
import numpy as np
import pandas as pd
from sklearn.metrics import cohen_kappa_score

from llmrubric.io.errors import InputError
from llmrubric.io.files import write_text
from llmrubric.io.rows import check_unique, row_number
from llmrubric.io.tables import read_raw, source_of
from llmrubric.ir.blocks import block_table, family_rows, one_source

log = logging.getLogger(__name__)
GRADES = ["query_id", "doc_id", "item_id", "grade"]
RULES = ("max", "at_least_m")


def _item_blocks(features: pd.DataFrame, family: str, source: str | None) -> tuple[pd.DataFrame, list[str]]:
    """(block rows × option columns) normalised distributions of the family's item blocks, and the options."""
    rows = family_rows(features, family)
    if rows.empty:
        raise InputError(
            f"no {family!r} item blocks (question ids '{family}:<item_id>') in the features",
            file=source_of(features),
            column="question_id",
        )
    chosen = one_source(rows, family, source, source_of(features))
    if chosen.empty:
        raise InputError(
            f"no {family} blocks from source {source!r} (sources: {sorted(rows.source.unique())})",
            file=source_of(features),
            column="source",
        )
    wide = block_table(chosen).fillna(0.0)
    total = wide.sum(axis=1)
    if (total <= 0).any():
        text, qid = total.index[(total <= 0).to_numpy().argmax()]
        raise InputError(
            f"block (text {text!r}, question {qid!r}) has no probability mass", file=source_of(features), column="prob"
        )
    return wide.div(total, axis=0), list(wide.columns)


def grades_from_features(
    features: pd.DataFrame,
    texts: pd.DataFrame,
    family: str = "self_rating",
    mode: str = "argmax",
    source: str | None = None,
) -> pd.DataFrame:
    """Grades ``query_id, doc_id, item_id, grade`` from extracted item distributions.

    texts: ``text_id, query_id`` (+ ``doc_id``, the passage id used in runs; default the
    text id). mode: ``argmax`` (most probable grade) or ``expected`` (expected grade).
    """
    if mode not in ("argmax", "expected"):
        raise InputError(f"grade mode {mode!r} is not argmax or expected", column="mode")
    for column in ("text_id", "query_id"):
        if column not in texts.columns:
            raise InputError(f"the texts table needs a {column!r} column", file=source_of(texts), column=column)
    dist, options = _item_blocks(features, family, source)
    values = np.array([float(o) for o in options])
    p = dist.to_numpy()
    grade = values[p.argmax(axis=1)] if mode == "argmax" else p @ values
    text_ids = dist.index.get_level_values("text_id")
    info = texts.drop_duplicates("text_id").set_index("text_id")
    unknown = ~text_ids.isin(info.index)
    if unknown.any():
        raise InputError(
            f"{int(unknown.sum())} graded texts are not in the texts table (first: {text_ids[unknown.argmax()]!r})",
            file=source_of(texts),
            column="text_id",
        )
    doc = info["doc_id"] if "doc_id" in info.columns else pd.Series(info.index, index=info.index)
    out = pd.DataFrame(
        {
            "query_id": info.query_id.reindex(text_ids).astype(str).to_numpy(),
            "doc_id": doc.reindex(text_ids).astype(str).to_numpy(),
            "item_id": dist.index.get_level_values("question_id").str.slice(len(family) + 1).to_numpy(),
            "grade": grade,
        }
    )
    return check_grades(out)


def check_grades(grades: pd.DataFrame) -> pd.DataFrame:
    """Columns present, grades numeric, no (query, doc, item) twice."""
    src = source_of(grades)
    missing = [c for c in GRADES if c not in grades.columns]
    if missing:
        raise InputError(f"a grades table needs columns {GRADES} (missing {missing})", file=src, column=missing[0])
    grades = grades.copy()
    grade = pd.to_numeric(grades.grade, errors="coerce")
    if grade.isna().any():
        row = grades.index[grade.isna().to_numpy().argmax()]
        raise InputError(
            f"grade {grades.at[row, 'grade']!r} is not a number", file=src, row=row_number(row), column="grade"
        )
    grades["grade"] = grade.astype(float)
    for c in GRADES[:3]:
        grades[c] = grades[c].astype(str).str.strip()
    check_unique(
        grades,
        GRADES[:3],
        "(query {query_id!r}, doc {doc_id!r}, item {item_id!r}) is graded twice",
        file=src,
        column="item_id",
    )
    grades.attrs["source"] = src
    return grades


def read_grades(path: str | Path) -> pd.DataFrame:
    """A grades table file (CSV, TSV, JSONL, Parquet) with ``query_id, doc_id, item_id, grade``."""
    path = Path(path)
    if not path.is_file():
        raise InputError("grades file not found", file=str(path))
    return check_grades(read_raw(path))


def passage_labels(grades: pd.DataFrame, rule: str = "max", m: int = 1) -> pd.DataFrame:
    """``query_id, doc_id, grade, relevance``: the best grade over items (``max``) or the best
    grade reached by at least ``m`` items (``at_least_m``: the m-th highest, 0 with fewer
    items); ``relevance`` is that grade rounded half up to an integer."""
    if rule not in RULES:
        raise InputError(f"unknown relevance rule {rule!r} (use {RULES})", column="rule")
    if rule == "max":
        m = 1
    if m < 1:
        raise InputError(f"m must be >= 1, got {m}", column="m")
    group = grades.groupby(["query_id", "doc_id"], sort=True).grade
    best = group.max() if m == 1 else group.agg(lambda g: np.sort(g.to_numpy())[::-1][m - 1] if len(g) >= m else 0.0)
    out = best.rename("grade").reset_index()
    out["relevance"] = np.floor(out.grade.to_numpy() + 0.5).astype(int)
    return out


def write_qrels(labels: pd.DataFrame, path: str | Path) -> Path:
    """TREC qrels ``query_id 0 doc_id relevance``, one line per passage, atomically."""
    lines = [f"{q} 0 {d} {int(r)}\n" for q, d, r in zip(labels.query_id, labels.doc_id, labels.relevance)]
    return write_text("".join(lines), path)


def read_qrels(path: str | Path) -> pd.DataFrame:
    """TREC qrels (``qid iter docid rel``) → ``query_id, doc_id, relevance``; a (query, doc) twice is an error."""
    rows = _read_columns(path, 4, "qrels")
    df = pd.DataFrame(
        [(r[0], r[2], r[3]) for _, r in rows], columns=["query_id", "doc_id", "relevance"], index=[n for n, _ in rows]
    )
    rel = pd.to_numeric(df.relevance, errors="coerce")
    if rel.isna().any() or (rel != rel.round()).any():
        row = df.index[(rel.isna() | (rel != rel.round())).to_numpy().argmax()]
        raise InputError(
            f"relevance {df.at[row, 'relevance']!r} is not an integer", file=str(path), row=int(row), column="relevance"
        )
    df["relevance"] = rel.astype(int)
    check_unique(
        df,
        ["query_id", "doc_id"],
        "(query {query_id!r}, doc {doc_id!r}) is judged twice",
        file=str(path),
        column="doc_id",
    )
    df.attrs["source"] = str(path)
    return df


def read_run(path: str | Path, queries: set[str] | None = None) -> pd.DataFrame:
    """TREC run (``qid Q0 docid rank score tag``) → ``query_id, doc_id, rank, score``.

    A (query, doc) listed twice, a non-numeric score, or a query not in ``queries`` (the
    queries of the qrels or test bank) is an error naming the line.
    """
    rows = _read_columns(path, 6, "run")
    df = pd.DataFrame(
        [(r[0], r[2], r[3], r[4]) for _, r in rows],
        columns=["query_id", "doc_id", "rank", "score"],
        index=[n for n, _ in rows],
    )
    for column in ("rank", "score"):
        values = pd.to_numeric(df[column], errors="coerce")
        if values.isna().any():
            row = df.index[values.isna().to_numpy().argmax()]
            raise InputError(
                f"{column} {df.at[row, column]!r} is not a number", file=str(path), row=int(row), column=column
            )
        df[column] = values
    check_unique(
        df,
        ["query_id", "doc_id"],
        "(query {query_id!r}, doc {doc_id!r}) is listed twice",
        file=str(path),
        column="doc_id",
    )
    if queries is not None:
        unknown = ~df.query_id.isin(queries)
        if unknown.any():
            row = df.index[unknown.to_numpy().argmax()]
            raise InputError(
                f"unknown query {df.at[row, 'query_id']!r} (not in the qrels / test bank)",
                file=str(path),
                row=int(row),
                column="query_id",
            )
    df.attrs["source"] = str(path)
    return df


def _read_columns(path: str | Path, n: int, kind: str) -> list[tuple[int, list[str]]]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{kind} file not found", file=str(path))
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != n:
            raise InputError(
                f"a {kind} line has {n} whitespace-separated fields, this one has {len(parts)}",
                file=str(path),
                row=number,
            )
        rows.append((number, parts))
    if not rows:
        raise InputError(f"the {kind} file is empty", file=str(path))
    return rows


def ranked(run: pd.DataFrame) -> pd.DataFrame:
    """Run rows in trec_eval order: by query, score descending, doc id descending on ties."""
    return run.sort_values(["query_id", "score", "doc_id"], ascending=[True, False, False], kind="stable")


def thresholded(measure_names: list[str], threshold: int, labels: list[int]):
    """ir-measures objects: binary measures with ``rel=threshold``; nDCG with gains of labels < τ set to 0."""
    out = []
    for name in measure_names:
        try:
            measure = ir_measures.parse_measure(name)
        except (ValueError, NameError, SyntaxError) as e:
            raise InputError(f"unknown measure {name!r}: {e}", column="measures") from e
        supported = measure.SUPPORTED_PARAMS
        if "rel" in supported and "rel" not in measure.params:
            measure = measure(rel=threshold)
        elif "gains" in supported and "gains" not in measure.params:
            measure = measure(gains={label: (label if label >= threshold else 0) for label in labels})
        out.append(measure)
    return out


def evaluate_runs(
    qrels: pd.DataFrame, runs: dict[str, pd.DataFrame], measures: list[str], threshold: int = 1
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(leaderboard: one row per run, one column per measure; per-query values) via ir-measures.

    Queries in the qrels that a run does not answer score 0 (ir-measures' convention, as
    ``trec_eval -c``); they are counted in the ``missing_queries`` column and logged.
    """
    labels = sorted({int(r) for r in qrels.relevance} | {0})
    objs = thresholded(measures, threshold, labels)
    q = [ir_measures.Qrel(a, b, int(c)) for a, b, c in zip(qrels.query_id, qrels.doc_id, qrels.relevance)]
    board, per_query = [], []
    for name, run in runs.items():
        unknown = sorted(set(run.query_id) - set(qrels.query_id))
        if unknown:
            raise InputError(
                f"run {name!r} names queries without judgments {unknown[:5]}", file=source_of(run), column="query_id"
            )
        docs = [ir_measures.ScoredDoc(a, b, float(c)) for a, b, c in zip(run.query_id, run.doc_id, run.score)]
        values = {str(m): math.nan for m in objs}
        rows = [
            {"run": name, "query_id": x.query_id, "measure": str(x.measure), "value": float(x.value)}
            for x in ir_measures.iter_calc(objs, q, docs)
        ]
        per_query.extend(rows)
        if rows:
            values.update(pd.DataFrame(rows).groupby("measure").value.mean().to_dict())
        missing = len(set(qrels.query_id) - set(run.query_id))
        if missing:
            log.warning("run %s retrieves nothing for %d judged queries (they score 0)", name, missing)
        board.append({"run": name, **values, "queries": int(run.query_id.nunique()), "missing_queries": missing})
    return pd.DataFrame(board), pd.DataFrame(per_query, columns=["run", "query_id", "measure", "value"])


def rubric_cover(
    grades: pd.DataFrame, run: pd.DataFrame, k: int, threshold: float, items: dict[str, set[str]] | None = None
) -> pd.DataFrame:
    """Rubric-Cover@k per query: ``query_id, items, covered, cover, unjudged``.

    ``items``: query → its test-bank item ids (default: the items graded for the query). A
    passage among the first k without grades covers nothing and is counted in ``unjudged``.
    """
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}", column="k")
    top = ranked(run).groupby("query_id", sort=True).head(k)
    good = grades[grades.grade >= threshold]
    graded = set(zip(grades.query_id, grades.doc_id))
    rows = []
    for query, part in top.groupby("query_id", sort=True):
        bank = items.get(query, set()) if items is not None else set(grades.item_id[grades.query_id == query])
        docs = set(part.doc_id)
        covered = set(good.item_id[(good.query_id == query) & good.doc_id.isin(docs)]) & bank
        unjudged = sum((query, d) not in graded for d in docs)
        rows.append(
            {
                "query_id": query,
                "items": len(bank),
                "covered": len(covered),
                "cover": len(covered) / len(bank) if bank else math.nan,
                "unjudged": unjudged,
            }
        )
    out = pd.DataFrame(rows, columns=["query_id", "items", "covered", "cover", "unjudged"])
    if out.unjudged.sum():
        log.warning(
            "%d passages in the first %d of the run have no grades (they cover nothing)", int(out.unjudged.sum()), k
        )
    return out


def spurious_items(grades: pd.DataFrame, judgments: pd.DataFrame, threshold: float, relevant: int = 1) -> pd.DataFrame:
    """Items graded >= τ on judged non-relevant passages, most often first.

    ``query_id, item_id, nonrelevant_covered, nonrelevant_judged, relevant_covered`` (workbench
    "spurious test bank entries"); only judged passages count.
    """
    joined = grades.merge(judgments, on=["query_id", "doc_id"], how="inner")
    joined["hit"] = joined.grade >= threshold
    joined["rel"] = joined.relevance >= relevant
    out = (
        joined.groupby(["query_id", "item_id"])
        .apply(
            lambda g: pd.Series(
                {
                    "nonrelevant_covered": int((g.hit & ~g.rel).sum()),
                    "nonrelevant_judged": int((~g.rel).sum()),
                    "relevant_covered": int((g.hit & g.rel).sum()),
                }
            ),
            include_groups=False,
        )
        .reset_index()
    )
    return out.sort_values(
        ["nonrelevant_covered", "query_id", "item_id"], ascending=[False, True, True], kind="stable"
    ).reset_index(drop=True)


def uncovered_relevant(
    grades: pd.DataFrame, judgments: pd.DataFrame, threshold: float, relevant: int = 1
) -> pd.DataFrame:
    """Judged relevant passages that no item covers (best grade < τ, or no grades):
    ``query_id, doc_id, relevance, max_grade`` (workbench "missing in test bank")."""
    best = grades.groupby(["query_id", "doc_id"]).grade.max().rename("max_grade").reset_index()
    rel = judgments[judgments.relevance >= relevant].merge(best, on=["query_id", "doc_id"], how="left")
    out = rel[rel.max_grade.isna() | (rel.max_grade < threshold)]
    return (
        out[["query_id", "doc_id", "relevance", "max_grade"]].sort_values(["query_id", "doc_id"]).reset_index(drop=True)
    )


def agreement(labels: pd.DataFrame, judgments: pd.DataFrame, threshold: int, relevant: int = 1) -> dict:
    """Agreement of autograded labels (>= τ) with judgments (>= ``relevant``) on passages with both."""
    joined = labels.merge(judgments, on=["query_id", "doc_id"], suffixes=("_auto", "_human"))
    if joined.empty:
        return {"passages": 0, "kappa": math.nan, "accuracy": math.nan}
    a, h = joined.relevance_auto >= threshold, joined.relevance_human >= relevant
    kappa = cohen_kappa_score(a, h) if a.nunique() > 1 or h.nunique() > 1 else math.nan
    return {
        "passages": int(len(joined)),
        "kappa": float(kappa),
        "accuracy": float((a == h).mean()),
        "auto_relevant": int(a.sum()),
        "human_relevant": int(h.sum()),
    }
