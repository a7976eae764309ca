"""The canonical long tables (DESIGN.md): read, validate and write them.

Row numbers in errors are 1-based data rows (the header is not counted); frames keep
them as their index so that errors raised after a join still point into the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.errors import InputError
from llmrubric.rubric import Rubric, option_key

PROB_TOLERANCE = 1e-6
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableSpec:
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()


SPECS = {
    "annotations": TableSpec(
        ("text_id", "judge_id", "question_id", "answer"), ("system_id", "round"), ("text_id", "judge_id", "question_id", "system_id", "round")
    ),
    "features": TableSpec(
        ("text_id", "source", "question_id", "option", "prob"), (), ("text_id", "source", "question_id", "option")
    ),
    "texts": TableSpec(("text_id",), ("system_id", "query_id", "text"), ("text_id", "system_id", "query_id")),
    "predictions": TableSpec(("text_id", "judge_id", "question_id", "mean", "var"), ("system_id",), ("text_id", "judge_id", "question_id")),
}


def source_of(df: pd.DataFrame) -> str:
    return str(df.attrs.get("source", "<table>"))


def _read_raw(path: Path) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    try:
        if suffix in (".csv", ".csv.gz"):
            return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
        if suffix in (".tsv", ".tsv.gz"):
            return pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_values=[""])
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".jsonl.gz"):
            return pd.read_json(path, lines=True, dtype=False)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except ValueError as e:
        raise InputError(f"cannot be parsed: {e}", file=str(path)) from e
    raise InputError(f"unknown table format {suffix!r} (use .csv, .tsv, .parquet or .jsonl)", file=str(path))


def read_table(path: str | Path, kind: str) -> pd.DataFrame:
    """Read a canonical table of ``kind`` and check its columns; ids become strings."""
    spec = SPECS[kind]
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{kind} file not found", file=str(path))
    df = _read_raw(path)
    if df.empty:
        raise InputError(f"the {kind} table is empty", file=str(path))
    df.index = pd.RangeIndex(1, len(df) + 1)
    df.attrs["source"] = str(path)
    return check_columns(df, kind)


def check_columns(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Required columns present and non-null; id columns as stripped strings."""
    spec = SPECS[kind]
    src = source_of(df)
    missing = [c for c in spec.required if c not in df.columns]
    if missing:
        raise InputError(f"missing required column(s) {missing} in the {kind} table (has {list(df.columns)})", file=src, column=missing[0])
    for column in spec.required:
        null = df[column].isna()
        if null.any():
            raise InputError(f"empty value in required column ({int(null.sum())} such rows)", file=src, row=int(df.index[null.argmax()]), column=column)
    df = df.copy()
    df.attrs["source"] = src
    for column in spec.ids:
        if column in df.columns:
            df[column] = df[column].map(lambda v: v if pd.isna(v) else option_key(v) if isinstance(v, (int, float)) else str(v).strip())
    return df


def validate_annotations(df: pd.DataFrame, rubric: Rubric) -> pd.DataFrame:
    """Check questions and answers against the rubric; ``answer`` becomes the option key.

    Exact duplicate rows are dropped; the same (text, judge, question, round) with
    different answers is an error naming both rows. The optional ``round`` column marks a
    judge's repeated annotation of a text (a separate observation); it defaults to "1".
    """
    df = check_columns(df, "annotations")
    src = source_of(df)
    unknown = ~df["question_id"].isin(rubric.ids)
    if unknown.any():
        row = df.index[unknown.argmax()]
        raise InputError(
            f"unknown question id {df.at[row, 'question_id']!r} (rubric {rubric.name!r} has {rubric.ids})",
            file=src, row=int(row), column="question_id",
        )
    keys = []
    for row, qid, answer in zip(df.index, df["question_id"], df["answer"]):
        question = rubric[qid]
        index = question.index_of(answer)
        if index is None:
            raise InputError(
                f"answer {answer!r} is not an option of {qid} (options {list(question.keys)})",
                file=src, row=int(row), column="answer",
            )
        keys.append(question.options[index].key)
    df["answer"] = keys
    df["round"] = df["round"].fillna("1").astype(str) if "round" in df.columns else "1"
    cell = ["text_id", "judge_id", "question_id", "round"]
    dup = df.duplicated(cell, keep=False)
    if dup.any():
        groups = df[dup].groupby(cell, sort=False)["answer"]
        conflicting = groups.nunique()
        conflicting = conflicting[conflicting > 1]
        if len(conflicting):
            text, judge, qid, rnd = conflicting.index[0]
            rows = df[dup & (df.text_id == text) & (df.judge_id == judge) & (df.question_id == qid) & (df["round"] == rnd)].index.tolist()
            raise InputError(
                f"duplicate (text {text!r}, judge {judge!r}, question {qid!r}, round {rnd!r}) with different answers in rows {rows}",
                file=src, row=int(rows[1]), column="answer",
            )
        df = df[~df.duplicated(cell, keep="first")]
    df.attrs["source"] = src
    return df


def validate_features(df: pd.DataFrame, rubric: Rubric | None = None) -> pd.DataFrame:
    """Check probabilities and block shapes; ``option`` becomes the option key.

    A block is one (text, source, question). Probabilities must be finite, >= 0 and sum to
    at most 1 + 1e-6 per block (they are kept unnormalised). Blocks of a rubric question
    must offer exactly that question's ``llm_options``; blocks of other questions must all
    offer the same options.
    """
    df = check_columns(df, "features")
    src = source_of(df)
    df["option"] = df["option"].map(option_key)
    prob = pd.to_numeric(df["prob"], errors="coerce")
    bad = prob.isna() | ~np.isfinite(prob) | (prob < 0)
    if bad.any():
        row = df.index[bad.argmax()]
        raise InputError(f"probability {df.at[row, 'prob']!r} is not a finite number >= 0", file=src, row=int(row), column="prob")
    df["prob"] = prob.astype(float)
    block = ["text_id", "source", "question_id"]
    dup = df.duplicated(block + ["option"], keep=False)
    if dup.any():
        rows = df.index[dup].tolist()[:2]
        raise InputError(f"option listed twice in one (text, source, question) block, rows {rows}", file=src, row=int(rows[1]), column="option")
    sums = df.groupby(block, sort=False)["prob"].sum()
    over = sums[sums > 1 + PROB_TOLERANCE]
    if len(over):
        text, source, qid = over.index[0]
        row = df.index[(df.text_id == text) & (df.source == source) & (df.question_id == qid)][0]
        raise InputError(
            f"probabilities of block (text {text!r}, source {source!r}, question {qid!r}) sum to {over.iloc[0]:.6f} > 1",
            file=src, row=int(row), column="prob",
        )
    option_sets = df.groupby(block, sort=False)["option"].agg(lambda s: tuple(sorted(s)))
    for (source, qid), sets in option_sets.groupby(level=["source", "question_id"], sort=False):
        if rubric is not None and qid in rubric:
            expected = tuple(sorted(rubric[qid].llm_options))
        else:
            expected = sets.value_counts().index[0]
        wrong = sets[sets != expected]
        if len(wrong):
            text = wrong.index[0][0]
            row = df.index[(df.text_id == text) & (df.source == source) & (df.question_id == qid)][0]
            raise InputError(
                f"features block (text {text!r}, source {source!r}, question {qid!r}) has {len(wrong.iloc[0])} options "
                f"{list(wrong.iloc[0])}, expected {len(expected)} {list(expected)}",
                file=src, row=int(row), column="option",
            )
    df.attrs["source"] = src
    return df


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table by its suffix, atomically: a failure leaves no partial file."""
    path = Path(path)
    writers = {
        ".parquet": lambda t: df.to_parquet(t, index=False),
        ".csv": lambda t: df.to_csv(t, index=False),
        ".tsv": lambda t: df.to_csv(t, sep="\t", index=False),
        ".jsonl": lambda t: df.to_json(t, orient="records", lines=True),
    }
    if path.suffix not in writers:
        raise InputError(f"unknown table format {path.suffix!r} (use .csv, .tsv, .parquet or .jsonl)", file=str(path))
    with atomic_path(path) as tmp:
        writers[path.suffix](tmp)
    return path


def write_text(text: str, path: str | Path) -> Path:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(data: dict, path: str | Path) -> Path:
    """Write JSON atomically (NumPy scalars converted, non-finite floats as null)."""
    return write_text(json.dumps(data, indent=2, default=_json_default) + "\n", path)


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


@dataclass
class Tables:
    """One data set in canonical form: annotations, features and (optionally) texts."""

    annotations: pd.DataFrame
    features: pd.DataFrame
    texts: pd.DataFrame | None = None

    def subset(self, text_ids) -> Tables:
        """The rows of these texts only."""
        keep = set(text_ids)
        pick = lambda df: None if df is None else _keep_source(df, df[df.text_id.isin(keep)])
        return Tables(pick(self.annotations), pick(self.features), pick(self.texts))

    @property
    def text_ids(self) -> list[str]:
        return sorted(self.annotations.text_id.unique())


def _keep_source(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    new.attrs["source"] = source_of(old)
    return new


def require_features(annotations: pd.DataFrame, features: pd.DataFrame, drop: bool) -> pd.DataFrame:
    """Annotations whose text has no features: an error, or dropped with a warning if ``drop``."""
    missing = ~annotations.text_id.isin(set(features.text_id))
    if not missing.any():
        return annotations
    texts = annotations.text_id[missing].nunique()
    message = f"{int(missing.sum())} annotations on {texts} texts have no features (first: text {annotations.text_id[missing].iloc[0]!r})"
    if not drop:
        raise InputError(
            message + "; set data.drop_unfeatured=true to drop them",
            file=source_of(annotations), row=int(annotations.index[missing.argmax()]), column="text_id",
        )
    log.warning("%s: dropped %s", source_of(annotations), message)
    return _keep_source(annotations, annotations[~missing])


def load_tables(
    annotations: str | Path,
    features: str | Path,
    rubric: Rubric,
    texts: str | Path | None = None,
    drop_unfeatured: bool = False,
) -> Tables:
    """Read and validate the canonical tables from files."""
    ann = validate_annotations(read_table(annotations, "annotations"), rubric)
    feat = validate_features(read_table(features, "features"), rubric)
    ann = require_features(ann, feat, drop_unfeatured)
    txt = read_table(texts, "texts") if texts else None
    return Tables(ann, feat, txt)
