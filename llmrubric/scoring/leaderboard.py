"""System leaderboards from calibrated predictions, with uncertainty (LLM-Rubric Appendix A).

A system's score is the mean over its texts of the judge-free score ŷ(T) = mean over the
trusted judges A of the expected answer ŷ^a(T). Its 95 % interval comes from a bootstrap
that, in every replicate, resamples the judges A (shared by all systems, so that
differences are paired by judge), resamples each system's texts, and replaces each
ŷ^a(T) by an answer drawn from the predicted distribution p̂_a(y | T). The same replicates
give intervals on differences between systems and the density bands of the plot.

Also: paired tests between systems (by ``query_id`` where texts share queries, else
unpaired), classical, PPI and PPI++ intervals of system means and of their differences when
some texts have human labels (:mod:`llmrubric.scoring.labels`, through ``ppi_py``; active
PPI++ when the labelled texts were drawn by ``llmrubric label suggest``), rank correlations
between leaderboards, and shift intervals that
widen each score by the errors a leave-one-system-out run measured on held-out systems
(:func:`shift_half_width`, :mod:`llmrubric.evaluation.transfer`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError
from llmrubric.io.files import write_json, write_table, write_text
from llmrubric.io.predictions import probabilities
from llmrubric.io.rows import check_unique
from llmrubric.io.rubric import Question
from llmrubric.io.tables import read_nonempty, source_of

log = logging.getLogger(__name__)
SUM_TOLERANCE = 1e-3  # a predicted distribution sums to 1 within this (tables written with few decimals)
MEMORY_CELLS = 20_000_000  # float64 cells one bootstrap block may hold (about 160 MB)


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


def _replicate_text_scores(
    data: SystemData, text_idx: np.ndarray, judge_idx: np.ndarray, rng: np.random.Generator, sample: bool
) -> np.ndarray:
    """(B, n) judge-free text scores of replicates: texts ``text_idx`` (B, n), judges ``judge_idx`` (B, m).

    With ``sample`` every (text, judge) expected answer is replaced by a draw from p̂_a.
    """
    p = data.probs[text_idx[:, :, None], judge_idx[:, None, :]]  # (B, n, m, K)
    present = ~np.isnan(p[..., 0])
    p = np.nan_to_num(p)
    if sample:
        cdf = np.cumsum(p, axis=-1)
        u = rng.random(cdf.shape[:-1])[..., None] * cdf[..., -1:]
        y = data.values[np.minimum((u >= cdf).sum(axis=-1), len(data.values) - 1)]
    else:
        y = p @ data.values
    with np.errstate(invalid="ignore"):
        return np.where(present, y, 0).sum(axis=-1) / present.sum(axis=-1)


def bootstrap(
    systems: list[SystemData], n_boot: int = 1000, seed: int = 0, sample_answers: bool = True, keep_text_scores: int = 0
) -> dict:
    """Bootstrap replicates of every system's mean score.

    Returns ``{"means": {system: (n_boot,)}, "text_scores": {system: [(n,) arrays]}}``; the
    judges drawn in a replicate are the same for all systems. ``keep_text_scores`` keeps the
    text scores of the first replicates (for density bands).
    """
    if n_boot < 1:
        raise InputError(f"bootstrap samples must be >= 1, got {n_boot}", column="bootstrap")
    rng = np.random.default_rng(seed)
    m = systems[0].probs.shape[1]
    judge_idx = rng.integers(0, m, (n_boot, m))
    means = {s.system: np.empty(n_boot) for s in systems}
    kept: dict[str, list] = {s.system: [] for s in systems}
    for s in systems:
        n, k = s.probs.shape[0], s.probs.shape[2]
        block = max(1, MEMORY_CELLS // max(1, n * m * k * 3))
        srng = np.random.default_rng([seed, len(s.system), *map(ord, s.system)])
        for lo in range(0, n_boot, block):
            hi = min(n_boot, lo + block)
            text_idx = srng.integers(0, n, (hi - lo, n))
            scores = _replicate_text_scores(s, text_idx, judge_idx[lo:hi], srng, sample_answers)
            with np.errstate(invalid="ignore"):
                means[s.system][lo:hi] = np.nanmean(scores, axis=1)
            for row in scores[: max(0, keep_text_scores - lo)]:
                kept[s.system].append(row[~np.isnan(row)])
    return {"means": means, "text_scores": kept}


def interval(values: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile interval of bootstrap values (NaN replicates ignored)."""
    v = values[~np.isnan(values)]
    if not len(v):
        return math.nan, math.nan
    return float(np.quantile(v, alpha / 2)), float(np.quantile(v, 1 - alpha / 2))


def leaderboard(systems: list[SystemData], boot: dict, alpha: float = 0.05) -> pd.DataFrame:
    """``rank, system, score, low, high, texts`` sorted by score (ties share the average rank)."""
    rows = []
    for s in systems:
        low, high = interval(boot["means"][s.system], alpha)
        rows.append(
            {
                "system": s.system,
                "score": float(np.nanmean(s.text_scores())),
                "low": low,
                "high": high,
                "texts": len(s.text_ids),
            }
        )
    board = (
        pd.DataFrame(rows)
        .sort_values(["score", "system"], ascending=[False, True], kind="stable")
        .reset_index(drop=True)
    )
    board.insert(0, "rank", stats.rankdata(-board.score.to_numpy(), method="average"))
    return board


def compare_systems(systems: list[SystemData], boot: dict, alpha: float = 0.05) -> pd.DataFrame:
    """Every pair of systems: score difference, its bootstrap interval and p-value, and a test.

    Texts of two systems that share ``query_id`` values are paired by query (mean text score
    per query): paired t-test and Wilcoxon signed-rank test on the common queries. Otherwise
    the test is Welch's t-test and the Mann-Whitney U test on text scores. ``p_holm`` is the
    Holm-adjusted t-test p-value over all pairs.
    """
    rows = []
    scores = {s.system: s.text_scores() for s in systems}
    for i, a in enumerate(systems):
        for b in systems[i + 1 :]:
            diff = boot["means"][a.system] - boot["means"][b.system]
            low, high = interval(diff, alpha)
            d = diff[~np.isnan(diff)]
            p_boot = float(min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean()))) if len(d) else math.nan
            row = {
                "system_a": a.system,
                "system_b": b.system,
                "diff": float(np.nanmean(scores[a.system]) - np.nanmean(scores[b.system])),
                "low": low,
                "high": high,
                "p_bootstrap": p_boot,
            }
            row.update(_test(a, b, scores[a.system], scores[b.system]))
            rows.append(row)
    out = pd.DataFrame(rows)
    if len(out):
        out["p_holm"] = holm(out["p_t"].to_numpy())
    return out


def _test(a: SystemData, b: SystemData, sa: np.ndarray, sb: np.ndarray) -> dict:
    if a.query_ids is not None and b.query_ids is not None:
        qa = pd.Series(sa, index=a.query_ids).groupby(level=0).mean()
        qb = pd.Series(sb, index=b.query_ids).groupby(level=0).mean()
        common = qa.index.intersection(qb.index)
        if len(common) >= 2:
            x, y = qa[common].to_numpy(), qb[common].to_numpy()
            t = stats.ttest_rel(x, y)
            w = stats.wilcoxon(x, y) if np.any(x != y) else None
            return {
                "test": "paired",
                "n": int(len(common)),
                "p_t": float(t.pvalue) if np.isfinite(t.pvalue) else 1.0,
                "p_rank": float(w.pvalue) if w is not None else 1.0,
            }
    x, y = sa[~np.isnan(sa)], sb[~np.isnan(sb)]
    t = stats.ttest_ind(x, y, equal_var=False)
    u = stats.mannwhitneyu(x, y, alternative="two-sided")
    return {
        "test": "unpaired",
        "n": int(min(len(x), len(y))),
        "p_t": float(t.pvalue) if np.isfinite(t.pvalue) else 1.0,
        "p_rank": float(u.pvalue),
    }


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def human_labels(annotations: pd.DataFrame, question: Question) -> pd.Series:
    """text id → mean human answer (as the option value) on ``question``."""
    ann = annotations[annotations.question_id == question.id]
    values = ann.answer.map({k: v for k, v in zip(question.keys, question.values)}).astype(float)
    return values.groupby(ann.text_id).mean()


def human_leaderboard(annotations: pd.DataFrame, question: Question, texts: pd.DataFrame | None = None) -> pd.Series:
    """system → mean human answer over all annotations (as in LLM-Rubric Tables 4–5)."""
    ann = annotations[annotations.question_id == question.id]
    systems = ann.system_id if "system_id" in ann.columns else None
    if texts is not None and "system_id" in texts.columns:
        systems = ann.text_id.map(texts.drop_duplicates("text_id").set_index("text_id").system_id)
    if systems is None or systems.isna().any():
        raise InputError(
            "annotations need a system_id (column or texts table) for a human leaderboard",
            file=source_of(annotations),
            column="system_id",
        )
    values = ann.answer.map({k: v for k, v in zip(question.keys, question.values)}).astype(float)
    return values.groupby(systems.to_numpy()).mean().rename_axis("system")


def human_labels_by_round(annotations: pd.DataFrame, question: Question) -> pd.DataFrame:
    """One row per labelled (text, round) of ``question``: ``text_id, round, label`` (mean human
    answer as the option value) and ``row``, the annotations file row of its first answer."""
    ann = annotations[annotations.question_id == question.id]
    rounds = ann["round"].astype(str) if "round" in ann.columns else pd.Series("1", index=ann.index)
    values = ann.answer.map({k: v for k, v in zip(question.keys, question.values)}).astype(float)
    frame = pd.DataFrame({"text_id": ann.text_id.to_numpy(), "round": rounds.to_numpy(), "label": values.to_numpy()})
    frame["row"] = ann.index.to_numpy()
    return frame.groupby(["text_id", "round"], as_index=False, sort=True).agg(
        label=("label", "mean"), row=("row", "min")
    )


def check_labelled_texts(systems: list[SystemData], annotations: pd.DataFrame, question: Question) -> None:
    """Every annotated text of ``question`` must have predictions, else an error naming its annotations row."""
    known = {t for s in systems for t in s.text_ids}
    ann = annotations[annotations.question_id == question.id]
    unknown = ~ann.text_id.isin(known)
    if unknown.any():
        row = ann.index[unknown.to_numpy().argmax()]
        raise InputError(
            f"text {ann.at[row, 'text_id']!r} has human labels but no predictions of {question.id}",
            file=source_of(annotations),
            row=int(row),
            column="text_id",
        )


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
) -> pd.DataFrame:
    """Per system: ``labelled`` (k), ``unlabelled`` and each method's estimate and interval
    (``<method>, <method>_low, <method>_high``, :mod:`llmrubric.scoring.labels`).

    ``labels`` (text id → human mean, drawn uniformly): ``classical``, ``ppi`` and ``ppi_pp``;
    ``draws`` (from :func:`check_sampling`, drawn actively): ``active_ppi_pp``. Fewer than 2 labels: NaN."""
    from llmrubric.scoring import labels as lab

    rows = []
    for s in systems:
        f = pd.Series(s.text_scores(), index=s.text_ids)
        row = {"system": s.system}
        if draws is None:
            has = f.index.isin(labels.index)
            y, fl, fu = labels.reindex(f.index[has]).to_numpy(), f[has].to_numpy(), f[~has].to_numpy()
            row.update(labelled=int(has.sum()), unlabelled=int((~has).sum()))
            for method in lab.UNIFORM:
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


def rank_correlation(a: pd.Series, b: pd.Series, missing: str = "error", name_a: str = "a", name_b: str = "b") -> dict:
    """Spearman ρ and Kendall τ-b (ties get average ranks) between two system → score maps.

    Systems in only one of them: an :class:`InputError` (``missing="error"``), or left out
    and counted (``missing="drop"``, with a logged warning).
    """
    only_a, only_b = sorted(set(a.index) - set(b.index)), sorted(set(b.index) - set(a.index))
    if only_a or only_b:
        message = f"systems only in {name_a}: {only_a}; only in {name_b}: {only_b}"
        if missing == "error":
            raise InputError(message, file=name_b if only_a else name_a, column="system")
        log.warning("%s (left out of the rank correlation)", message)
    common = sorted(set(a.index) & set(b.index))
    x, y = a.reindex(common).to_numpy(float), b.reindex(common).to_numpy(float)
    out = {"systems": len(common), "left_out": only_a + only_b}
    if len(common) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        reason = (
            f"undefined: {len(common)} common system(s)"
            if len(common) < 2
            else f"undefined: constant scores in {name_a if np.ptp(x) == 0 else name_b}"
        )
        return {
            **out,
            "spearman": math.nan,
            "spearman_p": math.nan,
            "kendall": math.nan,
            "kendall_p": math.nan,
            "reason": reason,
        }
    rho, tau = stats.spearmanr(x, y), stats.kendalltau(x, y)
    return {
        **out,
        "spearman": float(rho.statistic),
        "spearman_p": float(rho.pvalue),
        "kendall": float(tau.statistic),
        "kendall_p": float(tau.pvalue),
    }


def read_predictions(path: str | Path) -> pd.DataFrame:
    """A predictions table file; ``p_<option>``, ``mean`` and ``var`` become numbers (bad cells are errors)."""
    from llmrubric.io.tables import read_table

    pred = read_table(path, "predictions")
    for column in [c for c in pred.columns if c.startswith("p_")] + ["mean", "var"]:
        values = pd.to_numeric(pred[column], errors="coerce")
        bad = values.isna() & pred[column].notna() & (pred[column].astype(str).str.strip() != "")
        if bad.any():
            row = pred.index[bad.to_numpy().argmax()]
            raise InputError(f"{pred.at[row, column]!r} is not a number", file=str(path), row=int(row), column=column)
        pred[column] = values.astype(float)
    return pred


def read_leaderboard(path: str | Path) -> pd.Series:
    """A reference leaderboard file (CSV, TSV, JSONL, Parquet) with ``system`` (or ``system_id``) and ``score``."""
    return read_system_values(path, "leaderboard", lambda columns: ["score"]).score


def read_shift_errors(path: str | Path) -> pd.Series:
    """system → shift error (predicted − human system mean, the system held out) from a
    leave-one-system-out run's ``system_errors.csv``: an ``error`` column, or ``predicted`` and ``human``."""
    table = read_system_values(
        path, "shift errors table", lambda columns: ["error"] if "error" in columns else ["predicted", "human"]
    )
    errors = table.error if "error" in table else table.predicted - table.human
    if len(errors) < 2:
        raise InputError(f"shift intervals need the errors of at least 2 systems, got {len(errors)}", file=str(path))
    return errors.rename("error")


def read_system_values(path: str | Path, what: str, columns_of) -> pd.DataFrame:
    """A table with one row per ``system`` (or ``system_id``) and the numeric columns that
    ``columns_of(its columns)`` names, indexed by system; each problem an error naming file, row and column."""
    path = Path(path)
    df = read_nonempty(path, what, empty=f"the {what} is empty")
    system = "system" if "system" in df.columns else "system_id" if "system_id" in df.columns else None
    wanted = columns_of(list(df.columns))
    absent = [c for c in wanted if c not in df.columns]
    if system is None or absent:
        raise InputError(
            f"a {what} needs columns {', '.join(repr(c) for c in ['system', *wanted])} (has {list(df.columns)})",
            file=str(path),
            column="system" if system is None else absent[0],
        )
    values = {}
    for column in wanted:
        value = pd.to_numeric(df[column], errors="coerce")
        bad = ~np.isfinite(value.to_numpy(float))
        if bad.any():
            row = df.index[bad.argmax()]
            raise InputError(
                f"{column} {df.at[row, column]!r} is not a finite number", file=str(path), row=int(row), column=column
            )
        values[column] = value.to_numpy(float)
    names = df[system].astype(str).str.strip()
    check_unique(names.to_frame("name"), "name", "system {name!r} is listed twice", file=str(path), column=system)
    return pd.DataFrame(values, index=pd.Index(names.to_numpy(), name="system"))


def rms(errors) -> float:
    """Root mean square of shift errors: sqrt(mean e²)."""
    return math.sqrt(float(np.mean(np.square(np.asarray(errors, float)))))


def shift_half_width(errors, alpha: float = 0.05) -> float:
    """Half-width of the interval for a new system's human mean from the shift ``errors`` of K
    other systems (each measured with that system held out): ``t_{K, 1-α/2} · sqrt(mean e²)``,
    a prediction interval for one more system's error (errors exchangeable, roughly normal)."""
    return float(stats.t.ppf(1 - alpha / 2, df=len(errors)) * rms(errors))


def with_shift_interval(board: pd.DataFrame, errors: pd.Series, alpha: float = 0.05) -> pd.DataFrame:
    """``board`` with ``shift_low``/``shift_high``: each score ± :func:`shift_half_width` of ``errors``."""
    half = shift_half_width(errors, alpha)
    return board.assign(shift_low=board.score - half, shift_high=board.score + half)


LABEL_HEADS = {"classical": "classical", "ppi": "PPI", "ppi_pp": "PPI++", "active_ppi_pp": "active PPI++"}


def markdown(board: pd.DataFrame, title: str = "", settings: dict | None = None) -> str:
    """A markdown leaderboard table; with label intervals, a ``k`` column and a legend that says what
    each interval column is and how its labels were sampled (``settings["label_intervals"]``)."""
    from llmrubric.scoring.labels import METHODS

    methods = [m for m in METHODS if m in board.columns]
    extra = [c for c in ("shift_low", "level", "human") if c in board.columns]
    head = ["rank", "system", "score", "95% interval", "texts"]
    head += ["shift interval"] if "shift_low" in extra else []
    head += ["level [interval]"] if "level" in extra else []
    head += (["k"] if methods else []) + [f"{LABEL_HEADS[m]} [interval]" for m in methods]
    head += ["human"] if "human" in extra else []
    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in board.to_dict("records"):
        cells = [
            f"{r['rank']:g}",
            str(r["system"]),
            f"{r['score']:.3f}",
            f"[{r['low']:.3f}, {r['high']:.3f}]",
            str(r["texts"]),
        ]
        if "shift_low" in extra:
            cells.append(f"[{r['shift_low']:.3f}, {r['shift_high']:.3f}]")
        if "level" in extra:
            cells.append(f"{r['level']:.3f} [{r['level_low']:.3f}, {r['level_high']:.3f}]")
        if methods:
            cells.append(str(r["labelled"]))
        cells += [f"{r[m]:.3f} [{r[m + '_low']:.3f}, {r[m + '_high']:.3f}]" for m in methods]
        if "human" in extra:
            cells.append(f"{r['human']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    info = (settings or {}).get("label_intervals")
    if info:
        level = f"{100 * (1 - info['alpha']):g} %"
        lines += [
            "",
            f"k: human-labelled texts of the system (draws under active sampling); sampling: {info['sampling']}.",
        ]
        kind = {"student": "widened to Student's t with k - 1 degrees of freedom", "normal": "normal"}[
            info["small_sample"]
        ]
        lines += [f"- {LABEL_HEADS[m]}: {info['methods'][m]}; {level}, {kind}" for m in methods]
    return "\n".join(lines) + "\n"


@dataclass
class LeaderboardResult:
    board: pd.DataFrame
    comparisons: pd.DataFrame
    boot: dict
    systems: list
    settings: dict = field(default_factory=dict)


def build(
    predictions: pd.DataFrame,
    question: Question,
    texts: pd.DataFrame | None = None,
    judges: list[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    sample_answers: bool = True,
    labels: pd.Series | None = None,
    band_replicates: int = 200,
    shift_errors: pd.Series | None = None,
    draws: pd.DataFrame | None = None,
    small_sample: str = "student",
    sampling_rule: str | None = None,
    levels: pd.DataFrame | None = None,
) -> LeaderboardResult:
    """Leaderboard, pairwise comparisons, label intervals (:func:`label_intervals`: with human
    ``labels`` drawn uniformly, or the ``draws`` of active sampling, :func:`check_sampling`) and
    (with ``shift_errors``, :func:`read_shift_errors`) shift intervals of one question."""
    from llmrubric.scoring.labels import DESCRIPTIONS

    systems, judges = system_data(predictions, question, texts, judges)
    boot = bootstrap(systems, n_boot, seed, sample_answers, keep_text_scores=band_replicates)
    board = leaderboard(systems, boot, alpha)
    comparisons = compare_systems(systems, boot, alpha)
    label_settings = {}
    if labels is not None or draws is not None:
        board = board.merge(label_intervals(systems, labels, draws, alpha, small_sample), on="system", how="left")
        comparisons = label_differences(board, comparisons, alpha) if len(comparisons) else comparisons
        methods = ["active_ppi_pp"] if draws is not None else ["classical", "ppi", "ppi_pp"]
        label_settings = {
            "label_intervals": {
                "methods": {m: DESCRIPTIONS[m] for m in methods},
                "sampling": sampling_rule
                or ("uniform at random (assumed)" if draws is None else "active, inverse-probability weighted"),
                "k": dict(zip(board.system, board.labelled.astype(int))),
                "alpha": alpha,
                "small_sample": small_sample,
            }
        }
    if shift_errors is not None:
        board = with_shift_interval(board, shift_errors, alpha)
    if levels is not None:  # ranked by the system level (llmrubric.scoring.levels)
        from llmrubric.scoring.levels import with_level_intervals

        board = with_level_intervals(board, levels, systems, labels, alpha)
    settings = {
        "question": question.id,
        "judges": judges,
        "bootstrap": n_boot,
        "seed": seed,
        "alpha": alpha,
        "sample_answers": sample_answers,
        **(
            {"shift_systems": len(shift_errors), "shift_rms_error": rms(shift_errors)}
            if shift_errors is not None
            else {}
        ),
        **label_settings,
    }
    return LeaderboardResult(board, comparisons, boot, systems, settings)


def write(
    result: LeaderboardResult, out_dir: str | Path, plot: bool = True, extra: dict | None = None
) -> dict[str, Path]:
    """``leaderboard.{md,csv,json}``, ``comparisons.csv`` and ``density.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    title = f"{result.settings['question']}: mean judge-free score over {len(result.settings['judges'])} judges"
    paths = {
        "csv": write_table(result.board, out_dir / "leaderboard.csv"),
        "comparisons": write_table(result.comparisons, out_dir / "comparisons.csv"),
        "json": write_json(
            {
                "settings": result.settings,
                "leaderboard": result.board.to_dict("records"),
                "comparisons": result.comparisons.to_dict("records"),
                **(extra or {}),
            },
            out_dir / "leaderboard.json",
        ),
        "md": write_text(markdown(result.board, title, result.settings), out_dir / "leaderboard.md"),
    }
    if plot:
        paths["plot"] = density_plot(result.systems, result.boot, out_dir / "density.png", title)
    return paths


def density_plot(
    systems: list[SystemData], boot: dict, path: str | Path, title: str = "", grid_points: int = 200
) -> Path:
    """Per-system density (Gaussian KDE) of judge-free text scores with a 95 % band over replicates.

    The band is pointwise over the kept bootstrap replicates (resampled texts and judges,
    answers drawn from the predicted distributions), as the LLM-Rubric dashboard suggests.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from llmrubric.io.files import atomic_path

    values = systems[0].values
    grid = np.linspace(np.nanmin(values) - 0.5, np.nanmax(values) + 0.5, grid_points)
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in systems:
        scores = s.text_scores()
        curve = _kde(scores[~np.isnan(scores)], grid)
        label = f"{s.system} (n={len(s.text_ids)})"
        line = (
            ax.axvline(float(np.nanmean(scores)), label=label)
            if curve is None
            else ax.plot(grid, curve, label=label)[0]
        )
        reps = [c for c in (_kde(r, grid) for r in boot["text_scores"].get(s.system, [])) if c is not None]
        if reps:
            low, high = np.quantile(np.stack(reps), [0.025, 0.975], axis=0)
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("judge-free score (mean over trusted judges)")
    ax.set_ylabel("density over texts")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
    return path


def _kde(x: np.ndarray, grid: np.ndarray) -> np.ndarray | None:
    """Gaussian KDE on ``grid``; None when it is undefined (fewer than 2 distinct values)."""
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    return stats.gaussian_kde(x)(grid)
