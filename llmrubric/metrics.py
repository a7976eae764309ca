"""Metrics on (text, judge) pairs of one question: RMSE, correlations, held-out NLL."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.data import PAIR, with_round
from llmrubric.errors import InputError
from llmrubric.predictions import probabilities
from llmrubric.rubric import Question

METRICS = ("rmse", "pearson", "spearman", "kendall", "nll")
MIN_JUDGE_PAIRS = 5


def point_metrics(y: np.ndarray, yhat: np.ndarray) -> dict:
    """RMSE and Pearson/Spearman/Kendall (tau-b); correlations are NaN for constant inputs."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    constant = np.ptp(y) == 0 or np.ptp(yhat) == 0
    corr = lambda f: math.nan if constant else float(f(y, yhat)[0])
    return {
        "rmse": float(np.sqrt(np.mean((y - yhat) ** 2))),
        "pearson": corr(stats.pearsonr),
        "spearman": corr(stats.spearmanr),
        "kendall": corr(stats.kendalltau),
    }


def nll(probs: np.ndarray, answer_index: np.ndarray) -> float:
    """Mean -log p(observed answer); infinite if an observed answer got probability 0."""
    p = probs[np.arange(len(answer_index)), answer_index]
    with np.errstate(divide="ignore"):
        return float(-np.mean(np.log(p)))


def align(predictions: pd.DataFrame, annotations: pd.DataFrame, question: Question) -> pd.DataFrame:
    """Predictions of ``question`` joined to the observed answers by (text, judge, round)."""
    ann = with_round(annotations[annotations.question_id == question.id])
    pred = with_round(predictions[predictions.question_id == question.id])
    merged = pred.drop(columns=["system_id"], errors="ignore").merge(ann[PAIR + ["answer"]], on=PAIR, how="inner", validate="one_to_one")
    if len(merged) != len(ann):
        raise InputError(f"{len(ann) - len(merged)} annotated pairs of {question.id} have no prediction")
    if not np.isfinite(merged["mean"]).all():
        raise InputError(f"non-finite predictions for {question.id}")
    return merged


def evaluate(predictions: pd.DataFrame, annotations: pd.DataFrame, question: Question, per_judge: bool = True) -> dict:
    """Pooled metrics over all annotated pairs, plus (``per_judge``) the mean of per-judge metrics."""
    merged = align(predictions, annotations, question)
    index = pd.Index(question.keys).get_indexer(merged.answer)
    y = np.asarray(question.values, float)[index]
    out = point_metrics(y, merged["mean"].to_numpy())
    out["nll"] = nll(probabilities(merged, question), index)
    out["n"] = int(len(merged))
    if not per_judge:
        return out
    per_judge = [
        point_metrics(y[rows], merged["mean"].to_numpy()[rows])
        for rows in merged.groupby("judge_id").indices.values()
        if len(rows) >= MIN_JUDGE_PAIRS
    ]
    out["per_judge"] = {m: _nanmean([j[m] for j in per_judge]) for m in ("rmse", "pearson", "spearman", "kendall")}
    out["per_judge"]["judges"] = len(per_judge)
    return out


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def markdown_table(rows: dict[str, dict], metrics=METRICS) -> str:
    """A markdown table of ``{method: {metric: value or (mean, sd)}}``."""
    lines = ["| method | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, values in rows.items():
        cells = []
        for m in metrics:
            v = values.get(m)
            if isinstance(v, (tuple, list)):
                cells.append(f"{v[0]:.3f} ± {v[1]:.3f}")
            elif v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("—")
            else:
                cells.append(f"{v:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
