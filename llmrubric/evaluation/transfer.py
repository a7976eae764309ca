"""System means of calibrated scores for systems no model saw, with intervals that include the
model's own error under system shift.

A held-out system's score is the mean, over its annotated (text, judge) pairs, of the calibrated
expected answers. Sampling alone makes that mean precise, but on a new system the model is
biased by an unknown amount (it saturates, or its calibration does not carry over), so an
interval from sampling alone is far too narrow. :func:`shift_intervals` widens it by the error
the model made on other systems when they were held out (leave-one-system-out over the
training systems, a jackknife over systems): with residuals e_t = predicted − human mean of
the K other systems, the interval is ``estimate ± t_{K, 1-α/2} · sqrt(mean e_t²)``
(:func:`llmrubric.scoring.leaderboard.shift_half_width`). :func:`shift_errors` gives the e_t of a
``protocol=systems`` run, as ``llmrubric evaluate`` writes them to ``system_errors.csv`` for
``llmrubric leaderboard build --shift-errors``. :func:`system_metrics` sums up a run whose folds are
whole systems (RMS error, Kendall τ-b within held-out groups and overall, shift-interval coverage),
as ``llmrubric evaluate`` writes it to ``metrics.json``; :func:`grouped_kendall` averages the Kendall
within held-out groups over several groupings of the systems (``protocol=system_groups``: one model
scores every system of its group, as a user ranks new systems). :func:`ppi_intervals` instead corrects the estimate with k
human labels of the new system (prediction-powered inference through ``ppi_py``,
:func:`llmrubric.scoring.labels.uniform_interval`), averaged over random draws of the k labelled pairs.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from llmrubric.evaluation.metrics import align
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Question
from llmrubric.io.tables import source_of
from llmrubric.scoring.labels import uniform_interval
from llmrubric.scoring.leaderboard import rank_correlation, rms, shift_half_width


def pair_scores(
    predictions: pd.DataFrame, annotations: pd.DataFrame, question: Question, systems: pd.Series
) -> pd.DataFrame:
    """One row per annotated pair of ``question``: ``system_id``, human value ``y``, predicted expected answer ``yhat``.

    ``systems``: text id → system id; every annotated text needs one."""
    merged = align(predictions, annotations, question)
    system = merged.text_id.map(systems)
    if system.isna().any():
        raise InputError(
            f"{int(system.isna().sum())} annotated texts have no system_id (first: {merged.text_id[system.isna()].iloc[0]!r})",
            file=source_of(annotations),
            column="system_id",
        )
    y = np.asarray(question.values, float)[pd.Index(question.keys).get_indexer(merged.answer)]
    return pd.DataFrame(
        {
            "system_id": system.to_numpy(),
            "text_id": merged.text_id.to_numpy(),
            "y": y,
            "yhat": merged["mean"].to_numpy(float),
        }
    )


def system_means(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per system: ``human`` and ``predicted`` means over its pairs and the number of ``pairs``."""
    g = pairs.groupby("system_id")
    return pd.DataFrame({"human": g.y.mean(), "predicted": g.yhat.mean(), "pairs": g.size()})


def shift_errors(
    predictions: pd.DataFrame, annotations: pd.DataFrame, question: Question, systems: pd.Series
) -> pd.DataFrame:
    """Per system (``system_id``): ``human`` and ``predicted`` means, ``error`` = predicted − human and
    ``pairs``, from predictions of a leave-one-system-out run (each system by a model that did not see it)."""
    means = system_means(pair_scores(predictions, annotations, question, systems))
    return means.assign(error=means.predicted - means.human).reset_index()


def shift_intervals(means: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """``means`` (from :func:`system_means`, each system's prediction by a model that did not see it)
    with ``low``/``high``: the interval of each system from the residuals of the others (module doc)."""
    if len(means) < 2:
        raise InputError(f"shift intervals need at least 2 systems, got {len(means)}", column="system_id")
    residual = (means.predicted - means.human).to_numpy()
    half = [shift_half_width(np.delete(residual, i), alpha) for i in range(len(means))]
    return means.assign(low=means.predicted - half, high=means.predicted + half)


def ppi_intervals(
    pairs: pd.DataFrame,
    k: int,
    draws: int = 50,
    seed: int = 0,
    alpha: float = 0.05,
    method: str = "ppi",
    small_sample: str = "normal",
) -> pd.DataFrame:
    """Per system and draw: the ``method`` (classical, ppi, ppi_pp) estimate of the human mean from
    ``k`` randomly labelled pairs of the system plus the predictions of the others (``estimate, low,
    high, human``)."""
    rows = []
    rng = np.random.default_rng(seed)
    for system, part in pairs.groupby("system_id"):
        if k > len(part):
            raise InputError(
                f"k={k} human labels requested but system {system!r} has only {len(part)} labelled pairs", column="k"
            )
        for d in range(draws):
            labelled = np.zeros(len(part), dtype=bool)
            labelled[rng.choice(len(part), k, replace=False)] = True
            y, yhat = part.y.to_numpy(), part.yhat.to_numpy()
            est = uniform_interval(method, y[labelled], yhat[labelled], yhat[~labelled], alpha, small_sample)
            rows.append(
                {
                    "system_id": system,
                    "draw": d,
                    "estimate": est["estimate"],
                    "low": est["low"],
                    "high": est["high"],
                    "human": y.mean(),
                }
            )
    return pd.DataFrame(rows)


def coverage(intervals: pd.DataFrame, truth: str = "human") -> tuple[float, float]:
    """Share of intervals holding the truth, and their mean width."""
    covered = (intervals.low <= intervals[truth]) & (intervals[truth] <= intervals.high)
    return float(covered.mean()), float((intervals.high - intervals.low).mean())


def system_metrics(
    predictions: pd.DataFrame,
    annotations: pd.DataFrame,
    question: Question,
    systems: pd.Series,
    groups: pd.Series,
    alpha: float = 0.05,
) -> dict:
    """System-level figures of held-out predictions whose folds are whole systems.

    ``systems``: text id → system id; ``groups``: system id → the held-out group (fold) whose model
    scored it. Figures over the system means (:func:`system_means`): ``rms_error`` of predicted − human,
    Kendall τ-b of predicted against human means over all systems (``kendall``) and within each
    group of 2+ systems, averaged over the ``groups_ranked`` groups where it is defined
    (``kendall_within_groups``), and the ``coverage`` and mean ``width`` of the
    :func:`shift_intervals`. An undefined Kendall is NaN with a ``*_reason``."""
    means = shift_intervals(system_means(pair_scores(predictions, annotations, question, systems)), alpha)
    group = groups.reindex(means.index)
    if group.isna().any():
        raise InputError(f"system {group.index[group.isna()][0]!r} has no held-out group", column="system_id")
    overall = rank_correlation(means.human, means.predicted)
    within = within_group_kendall(means, group)
    ranked = np.isfinite(within)
    cov, width = coverage(means)
    out = {
        "systems": len(means),
        "groups": int(group.nunique()),
        "rms_error": rms(means.predicted - means.human),
        "kendall": overall["kendall"],
        "kendall_within_groups": float(within[ranked].mean()) if ranked.any() else math.nan,
        "groups_ranked": int(ranked.sum()),
        "coverage": cov,
        "width": width,
    }
    if "reason" in overall:
        out["kendall_reason"] = overall["reason"]
    if not ranked.any():
        out["kendall_within_groups_reason"] = (
            "no held-out group has 2 or more systems" if len(within) == 0 else "tied scores in every held-out group"
        )
    return out


def within_group_kendall(means: pd.DataFrame, group: pd.Series) -> np.ndarray:
    """Kendall τ-b of ``predicted`` against ``human`` (columns of ``means``, indexed by system) within each
    group (``group``: system → group) of 2 or more systems; NaN for a group whose scores are all tied."""
    return np.array(
        [rank_correlation(part.human, part.predicted)["kendall"] for _, part in means.groupby(group) if len(part) > 1],
        dtype=float,
    )


def grouped_kendall(means: list[pd.DataFrame], groups: list[pd.Series]) -> dict:
    """The Kendall within held-out groups over several groupings of the systems: ``means[g]``
    (:func:`system_means` of grouping ``g``'s held-out predictions) and ``groups[g]`` (system → its
    group there). ``kendall_groups``: the mean of :func:`within_group_kendall` over every group of
    every grouping where it is defined (``groups_ranked`` of them), NaN with a reason where none is."""
    if len(means) != len(groups) or not means:
        raise InputError(
            f"{len(means)} groupings of predictions but {len(groups)} of systems", setting="grouping_seeds"
        )
    within = np.concatenate([within_group_kendall(m, g.reindex(m.index)) for m, g in zip(means, groups)])
    ranked = np.isfinite(within)
    out = {
        "kendall_groups": float(within[ranked].mean()) if ranked.any() else math.nan,
        "groupings": len(means),
        "groups_ranked": int(ranked.sum()),
    }
    if not ranked.any():
        out["kendall_groups_reason"] = (
            "no held-out group has 2 or more systems" if len(within) == 0 else "tied scores in every held-out group"
        )
    return out
