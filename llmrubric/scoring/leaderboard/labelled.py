"""Intervals of system means and of their differences from human-labelled texts: classical, PPI and
PPI++ (labels drawn uniformly), active PPI++ (the draws of ``llmrubric label suggest``,
:mod:`llmrubric.scoring.labels`); and the ranks of the systems' human means those labels allow."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError
from llmrubric.io.tables import source_of
from llmrubric.scoring.leaderboard.systems import SUM_TOLERANCE, SystemData
from llmrubric.scoring.ranks import rank_intervals


def check_sampling(
    sampling: pd.DataFrame, systems: list[SystemData], labelled: pd.DataFrame, src_labels: str
) -> pd.DataFrame:
    """The draws of a sampling-probability file (:func:`llmrubric.scoring.labels.read_sampling`) matched
    with the ``labelled`` (text, round) pairs: one row per drawn (text, round) with ``system, prob, draws, label``.

    Errors (naming file, row and column): a text not in the predictions, a system's probabilities of a
    round that do not cover its texts or do not sum to 1, a labelled text not drawn or with probability 0,
    a drawn text without labels."""
    src = source_of(sampling)
    system_of = {t: s.system for s in systems for t in s.text_ids}
    counts = {s.system: len(s.text_ids) for s in systems}
    unknown = ~sampling.text_id.isin(system_of.keys())
    if unknown.any():
        row = sampling.index[unknown.to_numpy().argmax()]
        raise InputError(
            f"text {sampling.at[row, 'text_id']!r} has no predictions", file=src, row=int(row), column="text_id"
        )
    sampling = sampling.assign(system=sampling.text_id.map(system_of))
    for (system, rnd), part in sampling.groupby(["system", "round"], sort=True):
        if len(part) != counts[system] or abs(part.prob.sum() - 1) > SUM_TOLERANCE:
            raise InputError(
                f"the probabilities of system {system!r} in round {rnd!r} cover {len(part)} of its {counts[system]} texts "
                f"and sum to {part.prob.sum():.6f}; they must cover every text and sum to 1",
                file=src,
                row=int(part.index[0]),
                column="prob",
            )
    merged = labelled.merge(
        sampling.reset_index(names="sampling_row"), on=["text_id", "round"], how="outer", indicator=True
    )
    not_drawn = (merged._merge == "left_only") | ((merged._merge == "both") & (merged.draws.fillna(0) == 0))
    if not_drawn.any():
        r = merged[not_drawn].iloc[0]
        raise InputError(
            f"text {r.text_id!r} has labels in round {r['round']!r} but was not drawn in that round of the sampling file",
            file=src_labels,
            row=int(r.row),
            column="text_id",
        )
    zero = (merged._merge == "both") & (merged.prob <= 0)
    if zero.any():
        r = merged[zero].iloc[0]
        raise InputError(
            f"labelled text {r.text_id!r} has sampling probability 0", file=src, row=int(r.sampling_row), column="prob"
        )
    unlabelled = (merged._merge == "right_only") & (merged.draws > 0)
    if unlabelled.any():
        r = merged[unlabelled].iloc[0]
        raise InputError(
            f"text {r.text_id!r} was drawn in round {r['round']!r} but has no labels in {src_labels}",
            file=src,
            row=int(r.sampling_row),
            column="draws",
        )
    drawn = merged[merged._merge == "both"]
    return drawn[["text_id", "round", "system", "prob", "draws", "label"]].reset_index(drop=True)


def label_intervals(
    systems: list[SystemData],
    labels: pd.Series | None = None,
    draws: pd.DataFrame | None = None,
    alpha: float = 0.05,
    small_sample: str = "student",
    methods: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Per system: ``labelled`` (k), ``unlabelled`` and each method's estimate and interval
    (``<method>, <method>_low, <method>_high``, :mod:`llmrubric.scoring.labels`).

    ``labels`` (text id → human mean, drawn uniformly): ``classical``, ``ppi`` and ``ppi_pp`` (or the ``methods``
    of these); ``draws`` (from :func:`check_sampling`, drawn actively): ``active_ppi_pp``. Fewer than 2 labels: NaN."""
    from llmrubric.scoring import labels as lab

    rows = []
    for s in systems:
        f = pd.Series(s.text_scores(), index=s.text_ids)
        row = {"system": s.system}
        if draws is None:
            has = f.index.isin(labels.index)
            y, fl, fu = labels.reindex(f.index[has]).to_numpy(), f[has].to_numpy(), f[~has].to_numpy()
            row.update(labelled=int(has.sum()), unlabelled=int((~has).sum()))
            for method in methods or lab.UNIFORM:
                out = lab.uniform_interval(method, y, fl, fu, alpha, small_sample)
                row.update({method: out["estimate"], f"{method}_low": out["low"], f"{method}_high": out["high"]})
        else:
            mine = draws[draws.system == s.system]
            times = mine.draws.to_numpy(int)
            y, q = np.repeat(mine.label.to_numpy(float), times), np.repeat(mine.prob.to_numpy(float), times)
            fl = np.repeat(f.reindex(mine.text_id).to_numpy(), times)
            out = lab.active_ppi_pp(y, fl, q, f.to_numpy(), alpha, small_sample=small_sample)
            row.update(labelled=int(times.sum()), unlabelled=len(f))
            row.update(active_ppi_pp=out["estimate"], active_ppi_pp_low=out["low"], active_ppi_pp_high=out["high"])
        rows.append(row)
    return pd.DataFrame(rows)


def label_rank_intervals(
    systems: list[SystemData],
    labels: pd.Series | None = None,
    draws: pd.DataFrame | None = None,
    alpha: float = 0.05,
    small_sample: str = "student",
) -> pd.DataFrame:
    """``system, label_rank_low, label_rank_high``: the ranks of the K systems' human means, all K jointly at
    1 − alpha, from each system's PPI++ interval (active PPI++ with ``draws``) at alpha / K (Bonferroni) through
    :func:`llmrubric.scoring.ranks.rank_intervals`. A system with fewer than 2 labels has no interval: it may hold
    any rank and is surely above or below no other."""
    method = "active_ppi_pp" if draws is not None else "ppi_pp"
    joint = label_intervals(systems, labels, draws, alpha / max(1, len(systems)), small_sample, methods=(method,))
    low, high = rank_intervals(joint[f"{method}_low"], joint[f"{method}_high"])
    return pd.DataFrame({"system": joint.system, "label_rank_low": low, "label_rank_high": high})


def label_differences(board: pd.DataFrame, comparisons: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """``comparisons`` with ``<method>_diff, _low, _high`` for each label method of ``board``: the
    difference of the two systems' estimates, its interval from the sum of their variances (the
    systems' texts are labelled independently; each variance read off its interval)."""
    from llmrubric.scoring.labels import METHODS

    z = stats.norm.ppf(1 - alpha / 2)
    by = board.set_index("system")
    out = comparisons.copy()
    for method in [m for m in METHODS if m in board.columns]:
        se = (by[f"{method}_high"] - by[f"{method}_low"]) / (2 * z)
        a, b = out.system_a.map(by[method]), out.system_b.map(by[method])
        half = z * np.sqrt(out.system_a.map(se) ** 2 + out.system_b.map(se) ** 2)
        out[f"{method}_diff"], out[f"{method}_diff_low"], out[f"{method}_diff_high"] = a - b, a - b - half, a - b + half
    return out
