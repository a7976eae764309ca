"""Per-system arrays of one question's predicted distributions, checked row by row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.predictions import probabilities
from llmrubric.io.rows import check_unique
from llmrubric.io.rubric import Question
from llmrubric.io.tables import source_of

SUM_TOLERANCE = 1e-3  # a predicted distribution sums to 1 within this (tables written with few decimals)


@dataclass
class SystemData:
    """Predicted distributions of one question on one system's texts.

    probs: (texts, judges, options) with NaN rows where a (text, judge) has no prediction;
    ``text_ids`` and ``query_ids`` (or None) label the rows; ``values`` the options.
    """

    system: str
    text_ids: np.ndarray
    query_ids: np.ndarray | None
    probs: np.ndarray
    values: np.ndarray

    @property
    def present(self) -> np.ndarray:
        """(texts, judges) bool: a prediction exists."""
        return ~np.isnan(self.probs[:, :, 0])

    def text_scores(self) -> np.ndarray:
        """(texts,) judge-free score: mean over present judges of the expected answer."""
        means = np.where(self.present, np.nan_to_num(self.probs) @ self.values, np.nan)
        return np.nanmean(means, axis=1)


def system_data(
    predictions: pd.DataFrame, question: Question, texts: pd.DataFrame | None = None, judges: list[str] | None = None
) -> tuple[list[SystemData], list[str]]:
    """Split a predictions table into per-system arrays over the judges ``judges`` (default: all).

    System ids come from the predictions' ``system_id`` column or from ``texts``. A text
    without a system id is an error naming the row.
    """
    if not question.ordered:
        raise InputError(
            f"question {question.id!r} is categorical: a leaderboard needs ordered numeric options", column="question"
        )
    pred = predictions[predictions.question_id == question.id]
    src = source_of(predictions)
    if pred.empty:
        raise InputError(f"no predictions of question {question.id!r}", file=src, column="question_id")
    if texts is not None and "system_id" in texts.columns:
        info = texts.drop_duplicates("text_id").set_index("text_id")
        pred = pred.drop(columns=["system_id"], errors="ignore").assign(system_id=pred.text_id.map(info["system_id"]))
        if "query_id" in info.columns:
            pred = pred.assign(query_id=pred.text_id.map(info["query_id"]))
    if "system_id" not in pred.columns or pred.system_id.isna().any():
        bad = pred.index[pred.system_id.isna().to_numpy()][0] if "system_id" in pred.columns else pred.index[0]
        raise InputError(
            f"text {pred.at[bad, 'text_id']!r} has no system_id (give it in the predictions or a texts table)",
            file=src,
            row=int(bad),
            column="system_id",
        )
    all_judges = sorted(pred.judge_id.unique())
    judges = [str(j) for j in judges] if judges else all_judges
    unknown = sorted(set(judges) - set(all_judges))
    if unknown:
        raise InputError(
            f"trusted judge(s) {unknown} have no predictions (predicted judges: {all_judges})",
            file=src,
            column="judge_id",
        )
    pred = pred[pred.judge_id.isin(judges)]
    if "round" in pred.columns and pred.duplicated(["text_id", "judge_id"]).any():
        pred = pred.groupby(
            ["text_id", "judge_id"], sort=False, as_index=False
        ).first()  # repeated rounds share x and judge
    check_unique(
        pred,
        ["text_id", "judge_id"],
        "two predictions for (text {text_id!r}, judge {judge_id!r})",
        file=src,
        column="judge_id",
    )
    p = check_distributions(pred, question, src)
    out = []
    judge_index = {j: i for i, j in enumerate(judges)}
    for system, pos in sorted(pred.groupby("system_id").indices.items()):
        part = pred.iloc[pos]
        text_ids = np.array(sorted(part.text_id.unique()), dtype=object)
        rows = part.text_id.map({t: i for i, t in enumerate(text_ids)}).to_numpy()
        cols = part.judge_id.map(judge_index).to_numpy()
        probs = np.full((len(text_ids), len(judges), len(question.options)), np.nan)
        probs[rows, cols] = p[pos]
        queries = None
        if "query_id" in part.columns and part.query_id.notna().all():
            queries = part.drop_duplicates("text_id").set_index("text_id").query_id.reindex(text_ids).to_numpy()
        out.append(SystemData(str(system), text_ids, queries, probs, np.asarray(question.values, dtype=float)))
    return out, judges


def check_distributions(pred: pd.DataFrame, question: Question, src: str) -> np.ndarray:
    """(rows, options) probabilities of ``question``: each a number in [0, 1], each row summing
    to 1 within :data:`SUM_TOLERANCE`, else an error naming the row and column."""
    missing = [f"p_{k}" for k in question.keys if f"p_{k}" not in pred.columns]
    if missing:
        raise InputError(f"predictions of {question.id} need the columns {missing}", file=src, column=missing[0])
    p = probabilities(pred, question)
    bad = ~np.isfinite(p) | (p < 0) | (p > 1 + SUM_TOLERANCE)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InputError(
            f"probability {p[r, c]!r} of {question.id} is not a number in [0, 1]",
            file=src,
            row=int(pred.index[r]),
            column=f"p_{question.keys[c]}",
        )
    off = np.abs(p.sum(axis=1) - 1) > SUM_TOLERANCE
    if off.any():
        r = int(off.argmax())
        raise InputError(
            f"probabilities of {question.id} sum to {p[r].sum():.6f}, not 1 (± {SUM_TOLERANCE:g})",
            file=src,
            row=int(pred.index[r]),
            column=f"p_{question.keys[0]}",
        )
    return p
