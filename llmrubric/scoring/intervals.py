"""Intervals of predictions and judge-free scores at the coverage a user asks for, from the model's conformal
calibration (:mod:`llmrubric.model.core.conformal`); what they guarantee: docs/scoring.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.predictions import probabilities

DEFAULT_COVERAGE = 0.9


def check_coverage(coverage: float, setting: str = "coverage") -> float:
    """``coverage`` as a float in (0, 1), else an error naming the setting."""
    try:
        value = float(coverage)
    except (TypeError, ValueError):
        raise InputError(f"{coverage!r} is not a number in (0, 1)", setting=setting) from None
    if not 0 < value < 1:
        raise InputError(f"{coverage!r} is not in (0, 1)", setting=setting)
    return value


def calibration(model):
    """The model's conformal calibration (one ordered question), or None (a model fitted without inner folds)."""
    return getattr(model, "conformal_", None)


def with_intervals(predictions: pd.DataFrame, model, coverage: float) -> pd.DataFrame:
    """``predictions`` with ``lo`` and ``hi``: each (text, judge) answer's conformal interval at ``coverage`` for
    the calibrated question's rows; NA on other questions' rows (no out-of-fold calibration, no guarantee)."""
    out = predictions.assign(lo=np.nan, hi=np.nan)
    conformal = calibration(model)
    if conformal is None:
        return out
    question = model.rubric[conformal.question_id]
    rows = (out.question_id == question.id).to_numpy()
    if rows.any():
        lo, hi = conformal.pair_intervals(question, probabilities(out[rows], question), coverage)
        out.loc[rows, "lo"], out.loc[rows, "hi"] = lo, hi
    return out


def score_intervals(model, question, probs: np.ndarray, coverage: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of each text's mean over the trusted judges (``probs``: texts, judges, options) where the model
    has a calibration of ``question``, else NaN."""
    conformal = calibration(model)
    if conformal is None or conformal.question_id != question.id:
        nan = np.full(len(probs), np.nan)
        return nan, nan.copy()
    return conformal.score_intervals(question, probs, coverage)


def coverage_figures(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> dict:
    """Observed coverage and mean width of the ``lo``/``hi`` intervals of ``question`` on annotated pairs."""
    rows = predictions[(predictions.question_id == question.id) & predictions.lo.notna()]
    if not len(rows):
        return {}
    answers = annotations[annotations.question_id == question.id][["text_id", "judge_id", "answer"]]
    value = dict(zip(question.keys, question.values))
    merged = rows.merge(answers.astype({"text_id": str, "judge_id": str}), on=["text_id", "judge_id"])
    y = merged.answer.astype(str).map(value).astype(float)
    inside = (merged.lo <= y) & (y <= merged.hi)
    return {"pairs": int(len(merged)), "coverage": float(inside.mean()), "width": float((merged.hi - merged.lo).mean())}
