"""Intervals of predictions and judge-free scores at the coverage a user asks for, from the model's conformal
calibration (:mod:`llmrubric.model.core.conformal`); what they guarantee: docs/scoring.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.io.guards import check_choice, check_range
from llmrubric.io.predictions import probabilities

DEFAULT_COVERAGE = 0.9
COVERAGE_BY = ("pooled", "judge")  # one conformal threshold for every judge, or each judge's own
CURVE_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)  # the nominal coverages of the coverage curve


def check_coverage(coverage: float, setting: str = "coverage") -> float:
    """``coverage`` as a float in (0, 1), else an error naming the setting."""
    return check_range(setting, coverage, 0, 1, open_low=True, open_high=True)


def calibrations(model) -> dict:
    """Question id → the model's conformal calibration of it ({}: a model fitted without inner folds)."""
    return dict(getattr(model, "conformals_", {}) or {})


def calibration(model, question_id: str):
    """The model's conformal calibration of ``question_id``, or None."""
    return calibrations(model).get(question_id)


def with_intervals(predictions: pd.DataFrame, model, coverage: float, by: str = "pooled") -> pd.DataFrame:
    """``predictions`` with ``lo`` and ``hi``: each (text, judge) answer's conformal interval at ``coverage`` on
    the rows of every calibrated ordered question, and ``set`` (its prediction set, options joined by ``|``) on
    those of a calibrated categorical one; NA on other rows (no out-of-fold calibration, no guarantee). ``by``:
    ``pooled`` (one threshold for every judge) or ``judge`` (each judge's own where it has enough out-of-fold
    answers: coverage for each judge; :meth:`~llmrubric.model.core.conformal.Conformal.thresholds`)."""
    check_choice("coverage_by", by, COVERAGE_BY)
    out = predictions.assign(lo=np.nan, hi=np.nan)
    for question_id, conformal in calibrations(model).items():
        question = model.rubric[question_id]
        rows = (out.question_id == question.id).to_numpy()
        judges = out.judge_id[rows].astype(str).to_numpy() if by == "judge" else None
        if not conformal.ordered:
            if "set" not in out:
                out["set"] = pd.Series(pd.NA, index=out.index, dtype="string")
            if rows.any():
                inside = conformal.pair_sets(probabilities(out[rows], question), coverage, judges)
                keys = np.asarray(question.keys, dtype=object)
                out.loc[rows, "set"] = ["|".join(keys[member]) for member in inside]
        elif rows.any():
            lo, hi = conformal.pair_intervals(question, probabilities(out[rows], question), coverage, judges)
            out.loc[rows, "lo"], out.loc[rows, "hi"] = lo, hi
    return out


def score_intervals(model, question, probs: np.ndarray, coverage: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of each text's mean over the trusted judges (``probs``: texts, judges, options) where the model
    has a calibration of ``question`` (ordered), else NaN."""
    conformal = calibration(model, question.id)
    if conformal is None or not conformal.ordered:
        nan = np.full(len(probs), np.nan)
        return nan, nan.copy()
    return conformal.score_intervals(question, probs, coverage)


def pair_coverage(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> pd.DataFrame:
    """Each annotated pair of ``question`` with an interval (a prediction ``set`` for a categorical question):
    ``text_id``, ``judge_id``, the observed value ``y``, ``lo``, ``hi`` (NaN for a categorical question), ``inside`` (whether the
    answer lies in the interval or set), ``width`` (the set's size), ``error`` (the prediction's ``mean`` minus
    ``y``; NaN without a ``mean`` column or a value) and ``p_answer`` (the probability the prediction gave the
    observed answer)."""
    column = "lo" if question.ordered else "set"
    if column not in predictions.columns:
        return pd.DataFrame(columns=["text_id", "judge_id", "y", "lo", "hi", "inside", "width", "error", "p_answer"])
    rows = predictions[(predictions.question_id == question.id) & predictions[column].notna()]
    rows = rows.astype({"text_id": str, "judge_id": str})
    answers = annotations[annotations.question_id == question.id][["text_id", "judge_id", "answer"]]
    merged = rows.merge(answers.astype({"text_id": str, "judge_id": str}), on=["text_id", "judge_id"])
    answer = merged.answer.astype(str).map({k: i for i, k in enumerate(question.keys)}).to_numpy(int)
    p_answer = probabilities(merged, question)[np.arange(len(merged)), answer]
    if question.ordered:
        y = merged.answer.astype(str).map(dict(zip(question.keys, question.values))).astype(float)
        inside, width = (merged.lo <= y) & (y <= merged.hi), merged.hi - merged.lo
    else:
        y = pd.Series(np.nan, index=merged.index)
        members = merged["set"].astype(str).str.split("|")
        inside = pd.Series([str(a) in m for a, m in zip(merged.answer, members)], index=merged.index)
        width = members.str.len().astype(float)
    mean = merged["mean"].astype(float) if "mean" in merged else pd.Series(np.nan, index=merged.index)
    return pd.DataFrame(
        {
            "text_id": merged.text_id,
            "judge_id": merged.judge_id,
            "y": y,
            "lo": merged.lo.astype(float) if question.ordered else np.nan,
            "hi": merged.hi.astype(float) if question.ordered else np.nan,
            "inside": inside,
            "width": width,
            "error": mean - y,
            "p_answer": p_answer,
        }
    )


def _inside(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> tuple[pd.Series, pd.Series]:
    """Whether each annotated pair's answer lies in its interval (or prediction set), and its width (size)."""
    pairs = pair_coverage(predictions, annotations, question)
    return pairs.inside, pairs.width


def coverage_figures(predictions: pd.DataFrame, annotations: pd.DataFrame, question) -> dict:
    """Observed coverage and mean width of the ``lo``/``hi`` intervals of ``question`` on annotated pairs (of a
    categorical question: of its prediction sets, the width their mean size)."""
    inside, width = _inside(predictions, annotations, question)
    if not len(inside):
        return {}
    return {"pairs": int(len(inside)), "coverage": float(inside.mean()), "width": float(width.mean())}


def coverage_by_group(pairs: pd.DataFrame, groups, nominal: float) -> pd.DataFrame:
    """Coverage within each group of :func:`pair_coverage`'s ``pairs`` (``groups``: a column of ``pairs`` or
    one label per pair), one row per group, ascending coverage: ``pairs``, ``coverage``, ``width``,
    ``mean_error`` and ``p_under``, the binomial probability of at most that many pairs inside if each were inside
    with probability ``nominal`` (small: under-coverage beyond chance for a group of that size; the marginal
    guarantee promises nothing per group, so this says where it fails, not that it was broken)."""
    from scipy.stats import binom

    nominal = check_coverage(nominal)
    keys = pairs[groups] if isinstance(groups, str) else pd.Series(np.asarray(groups), index=pairs.index)
    table = (
        pairs.assign(_group=keys.astype(str).to_numpy())
        .groupby("_group")
        .agg(
            pairs=("inside", "size"),
            inside=("inside", "sum"),
            coverage=("inside", "mean"),
            width=("width", "mean"),
            mean_error=("error", "mean"),
        )
    )
    table["p_under"] = binom.cdf(table.inside, table.pairs, nominal)
    table.index.name = "group"
    return table.drop(columns="inside").sort_values(["coverage", "pairs"], ascending=[True, False])


def coverage_curve(held_out: list[tuple], question, levels=CURVE_LEVELS, by: str = "pooled") -> list[dict]:
    """Observed against nominal coverage on held-out pairs: ``held_out`` holds (model, predictions, annotations) of
    each split; [] where no model has a calibration of ``question``."""
    curve = []
    for level in levels:
        parts = [
            _inside(with_intervals(predictions, model, level, by), annotations, question)
            for model, predictions, annotations in held_out
            if calibration(model, question.id) is not None
        ]
        if not parts:
            return []
        inside, width = pd.concat([i for i, _ in parts]), pd.concat([w for _, w in parts])
        curve.append({"nominal": level, "coverage": float(inside.mean()), "width": float(width.mean())})
    return curve


def coverage_figure(curve: list[dict], title: str):
    """Observed against nominal coverage (the diagonal is exact), each point labelled with its mean width."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2, 4.2))
    ax = fig.subplots()
    nominal, observed = [c["nominal"] for c in curve], [c["coverage"] for c in curve]
    ax.plot([0.4, 1], [0.4, 1], color="grey", lw=1, ls="--", label="nominal")
    ax.plot(nominal, observed, marker="o", label="held-out pairs")
    for c in curve:
        ax.annotate(f"{c['width']:.2f}", (c["nominal"], c["coverage"]), textcoords="offset points", xytext=(4, -10))
    ax.set(xlabel="nominal coverage", ylabel="observed coverage", title=title, xlim=(0.4, 1), ylim=(0.4, 1))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def coverage_plot(curve: list[dict], path, title: str) -> None:
    """:func:`coverage_figure` written as a PNG at ``path`` (atomically)."""
    from llmrubric.io.files import atomic_path

    with atomic_path(path) as tmp:
        coverage_figure(curve, title).savefig(tmp, format="png", dpi=110)
