"""Loader for the LLM-Rubric release (microsoft/LLM-Rubric, ``data/``) → canonical tables.

Quirks handled here and nowhere else: an answer of 0 or an empty cell means NA and becomes
an absent row; synthetic rows with ``Q0 == 0`` ("not a conversation") are dropped whole;
numbers written as floats (``4.0``) are accepted; Q8's human scale 1..3 comes from the
rubric, while the LLM was asked with answers 1..4 for every question.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, read_table, require_features, validate_annotations, validate_features

log = logging.getLogger(__name__)

SOURCE = "gpt-3.5-turbo-16k"
FILES = {
    "synthetic": (
        "synthetic/human_judges_synth_all_FIXED_ANON.tsv",
        "synthetic/gpt-3.5-turbo-16k_synth_evaluations_FIXED.tsv",
    ),
    "real": ("real/human_judges_real_convs_FIXED_ANON.tsv", "real/gpt-3.5-turbo-16k_real_evaluations_FIXED.tsv"),
}
QUESTION_COLUMNS = [f"Q{i}" for i in range(9)]
PROB_COLUMNS = [f"answer{i}_prob" for i in range(1, 5)]


def _read_tsv(path: Path, required: list[str]) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(
            "file not found (is the LLM-Rubric release at this path? see `llmrubric data fetch`)", file=str(path)
        )
    df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_values=[""])
    if df.empty:
        raise InputError("the table is empty", file=str(path))
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(f"missing required column(s) {missing}", file=str(path), column=missing[0])
    df.index = pd.RangeIndex(1, len(df) + 1)
    df.attrs["source"] = str(path)
    return df


def _numeric(df: pd.DataFrame, column: str) -> pd.Series:
    values = pd.to_numeric(df[column], errors="coerce")
    bad = values.isna() & df[column].notna()
    if bad.any():
        row = df.index[bad.argmax()]
        raise InputError(
            f"{df.at[row, column]!r} is not a number", file=df.attrs["source"], row=int(row), column=column
        )
    return values


def _system_id(split: str, human: pd.DataFrame) -> pd.Series:
    if split == "real":
        return "DS" + (_numeric(human, "dialogue_system").astype(int) + 1).astype(str)
    prefix = human["text_id"].str.extract(r"^V(\d+)_", expand=False)
    return ("DS" + prefix).where(prefix.notna(), None)


def read_annotations(path: Path, split: str, rubric: Rubric) -> pd.DataFrame:
    """One row per non-NA (text, judge, question) answer."""
    required = ["text_id", "annotator_id", *QUESTION_COLUMNS] + (["dialogue_system"] if split == "real" else [])
    human = _read_tsv(path, required)
    answers = pd.DataFrame({q: _numeric(human, q) for q in QUESTION_COLUMNS}, index=human.index)
    not_conversation = answers["Q0"] == 0
    if not_conversation.any():
        log.info("%s: dropped %d rows with Q0 == 0 (not a conversation)", path, int(not_conversation.sum()))
    wide = pd.concat([human[["text_id", "annotator_id"]], answers], axis=1)
    wide["round"] = human["round"].str.removeprefix("round") if "round" in human.columns else "1"
    wide["system_id"] = _system_id(split, human)
    wide = wide[~not_conversation]
    long = wide.reset_index(names="row").melt(
        id_vars=["row", "text_id", "annotator_id", "system_id", "round"],
        value_vars=QUESTION_COLUMNS,
        var_name="question_id",
        value_name="answer",
    )
    long = long[long.answer.notna() & (long.answer != 0)]
    long = long.rename(columns={"annotator_id": "judge_id"}).set_index("row").sort_index(kind="stable")
    long.index.name = None
    long["judge_id"] = long["judge_id"].map(
        lambda v: str(int(float(v))) if str(v).replace(".", "", 1).isdigit() else str(v)
    )
    long = long[["text_id", "judge_id", "question_id", "answer", "system_id", "round"]]
    long.attrs["source"] = str(path)
    return validate_annotations(long, rubric)


def read_features(path: Path, rubric: Rubric) -> pd.DataFrame:
    """One row per (text, question, answer option) of the LLM's distribution."""
    llm = _read_tsv(path, ["text_id", "criterion", *PROB_COLUMNS])
    probs = pd.DataFrame({c: _numeric(llm, c) for c in PROB_COLUMNS}, index=llm.index)
    rows = []
    for option, column in enumerate(PROB_COLUMNS, start=1):
        part = pd.DataFrame(
            {
                "text_id": llm.text_id,
                "source": SOURCE,
                "question_id": llm.criterion,
                "option": str(option),
                "prob": probs[column],
            }
        )
        rows.append(part)
    features = pd.concat(rows).sort_index(kind="stable")
    missing = features.prob.isna()
    if missing.any():
        row = features.index[missing.argmax()]
        raise InputError("empty probability", file=str(path), row=int(row), column=PROB_COLUMNS[0])
    features.attrs["source"] = str(path)
    return validate_features(features, rubric)


def load(
    root: str | Path, split: str, rubric: Rubric, drop_unfeatured: bool = True, features: str | Path | None = None
) -> Tables:
    """Canonical tables of one split (``synthetic`` or ``real``) of the release at ``root``;
    ``features``: a features table of another LLM to use instead of the release's GPT-3.5 one."""
    if split not in FILES:
        raise InputError(f"unknown LLM-Rubric split {split!r} (use {sorted(FILES)})")
    root = Path(root)
    human_file, llm_file = (root / f for f in FILES[split])
    annotations = read_annotations(human_file, split, rubric)
    if features is None:
        features = read_features(llm_file, rubric)
    else:
        features = validate_features(read_table(features, "features"), rubric)
    annotations = require_features(annotations, features, drop_unfeatured)
    texts = (
        annotations.groupby("text_id", sort=True)["system_id"].first().reset_index()
        if annotations.system_id.notna().any()
        else pd.DataFrame({"text_id": sorted(features.text_id.unique())})
    )
    texts["split"] = split
    texts.attrs["source"] = str(human_file)
    return Tables(annotations, features, texts)


def summary(tables: Tables) -> dict:
    """Counts a user checks after loading: annotations, texts, judges, cells per question."""
    ann = tables.annotations
    main = ann[ann.question_id == "Q0"]
    return {
        "annotations": int(len(main)),
        "texts": int(main.text_id.nunique()),
        "judges": int(main.judge_id.nunique()),
        "cells": int(len(ann)),
        "q0_std": float(np.std(main.answer.astype(float))),
    }
