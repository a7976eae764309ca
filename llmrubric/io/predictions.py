"""The canonical predictions table: one row per (text, judge, question) with the distribution."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.io.rubric import Question, Rubric


def option_columns(rubric: Rubric, questions: list[Question] | None = None) -> list[str]:
    """``p_<option>`` columns: the union of option keys of the questions, first-seen order."""
    keys: list[str] = []
    for q in questions or rubric.questions:
        keys += [k for k in q.keys if k not in keys]
    return [f"p_{k}" for k in keys]


def predictions_frame(
    pairs: pd.DataFrame, questions: list[Question], probs: np.ndarray, means: np.ndarray | None = None
) -> pd.DataFrame:
    """Long predictions for ``pairs`` × ``questions``.

    probs: (pairs, questions, max options) in each question's option order (padding ignored).
    ``mean`` is the expected value (eq. 2) unless point predictions ``means`` (pairs, questions)
    are given (baselines that predict a value, not a distribution mean); ``var`` is the
    distribution's variance.
    """
    probs = np.asarray(probs, dtype=np.float64)
    frames = []
    for qi, question in enumerate(questions):
        k = len(question.options)
        p = probs[:, qi, :k]
        values = np.asarray(question.values)
        mean = p @ values
        frame = pairs.reset_index(drop=True).copy()
        frame.insert(2, "question_id", question.id)
        for j, key in enumerate(question.keys):
            frame[f"p_{key}"] = p[:, j]
        frame["mean"] = mean if means is None else np.asarray(means)[:, qi]
        frame["var"] = p @ values**2 - mean**2
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    columns = [c for c in out.columns if not c.startswith("p_") and c not in ("mean", "var")]
    p_cols = [c for c in out.columns if c.startswith("p_")]
    return out[columns + p_cols + ["mean", "var"]]


def predicted_frame(
    rubric: Rubric, pairs: pd.DataFrame, probs: np.ndarray, questions: list[str] | None = None
) -> pd.DataFrame:
    """:func:`predictions_frame` of the ``questions`` (every rubric question by default) that ``probs``
    (pairs, rubric questions, max options) predicts for every pair: a question with a non-finite row is left out."""
    ids = [q for q in (questions or rubric.ids) if np.isfinite(probs[:, rubric.ids.index(q)]).all()]
    index = [rubric.ids.index(q) for q in ids]
    return predictions_frame(pairs, [rubric[q] for q in ids], probs[:, index])


def probabilities(predictions: pd.DataFrame, question: Question) -> np.ndarray:
    """(rows, options) probabilities of ``question`` from a predictions table."""
    return predictions[[f"p_{k}" for k in question.keys]].to_numpy(dtype=np.float64)
