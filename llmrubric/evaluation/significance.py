"""Paired permutation tests and bootstrap confidence intervals for methods scored on the same pairs.

Methods are compared on exactly the same (text, judge, round) pairs of one question: their
predictions are joined to the annotations by key (:func:`align_methods`), never by row
order. The permutation test swaps the two methods' predictions on a random half of the
pairs (each pair independently, probability 1/2) and recomputes the difference of a
metric; under the null hypothesis that the two methods are exchangeable, the observed
difference is a typical draw. Every metric is computed for a whole batch of permutations
at once: RMSE and Pearson directly; Spearman and Kendall's tau-b through pairwise
comparison matrices (for ``n`` up to :data:`PAIRWISE_MAX` pairs), because swapping
changes each pair's value between two known numbers, so ranks and concordance counts are
linear and quadratic forms of the swap indicators.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats
from tqdm import tqdm

from llmrubric.evaluation.metrics import point_metrics
from llmrubric.io.errors import InputError
from llmrubric.io.predictions import probabilities
from llmrubric.io.rubric import Question
from llmrubric.model.core.encoding import PAIR, with_round

POINT_METRICS = ("rmse", "pearson", "spearman", "kendall")
LOWER_IS_BETTER = frozenset({"rmse", "nll"})
PAIRWISE_MAX = 3000
BATCH = 500


@dataclass
class Aligned:
    """Observed answers and each method's predictions on the same pairs, in the same row order.

    pairs: (n, ids) the annotated pairs; y: (n,) numeric answers; answer_index: (n,) option
    index; means: method → (n,) point predictions; probs: method → (n, options).
    """

    pairs: pd.DataFrame
    y: np.ndarray
    answer_index: np.ndarray
    question: Question
    means: dict[str, np.ndarray] = field(default_factory=dict)
    probs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        return list(self.means)

    def subset(self, rows: np.ndarray) -> Aligned:
        return Aligned(
            self.pairs.iloc[rows].reset_index(drop=True),
            self.y[rows],
            self.answer_index[rows],
            self.question,
            {m: v[rows] for m, v in self.means.items()},
            {m: v[rows] for m, v in self.probs.items()},
        )


def _describe(keys: pd.DataFrame, limit: int = 5) -> str:
    shown = ", ".join("(" + ", ".join(str(v) for v in row) + ")" for row in keys.head(limit).itertuples(index=False))
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{shown}{more}"


def align_methods(predictions: dict[str, pd.DataFrame], annotations: pd.DataFrame, question: Question) -> Aligned:
    """Join every method's predictions of ``question`` to its annotated pairs by (text, judge, round).

    Predictions may come in any row order and may cover extra pairs (ignored). An annotated
    pair a method does not predict, a pair predicted twice, or a non-finite prediction is an
    :class:`InputError` naming the method and the first offending pairs.
    """
    ann = with_round(annotations[annotations.question_id == question.id])
    if ann.empty:
        raise InputError(f"no annotations of {question.id} to compare methods on", column="question_id")
    ann = ann.sort_values(PAIR, kind="stable").reset_index(drop=True)
    keys = pd.MultiIndex.from_frame(ann[PAIR].astype(str))
    cols = PAIR + (["system_id"] if "system_id" in ann.columns else [])
    aligned = Aligned(
        ann[cols].reset_index(drop=True),
        ann.answer.map(lambda a: question.values[question.keys.index(a)]).to_numpy(float),
        ann.answer.map(lambda a: question.keys.index(a)).to_numpy(),
        question,
    )
    p_cols = [f"p_{k}" for k in question.keys]
    for name, table in predictions.items():
        missing_cols = [c for c in ["text_id", "judge_id", "question_id", "mean", *p_cols] if c not in table.columns]
        if missing_cols:
            raise InputError(f"predictions of method {name!r} lack column(s) {missing_cols}", column=missing_cols[0])
        pred = with_round(table[table.question_id == question.id]).copy()
        pred[PAIR] = pred[PAIR].astype(str)
        dup = pred.duplicated(PAIR, keep=False)
        if dup.any():
            raise InputError(
                f"method {name!r} predicts some pairs of {question.id} more than once: {_describe(pred.loc[dup, PAIR].drop_duplicates())}"
            )
        rows = pd.MultiIndex.from_frame(pred[PAIR]).get_indexer(keys)
        if (rows < 0).any():
            raise InputError(
                f"method {name!r} has no prediction for {int((rows < 0).sum())} of {len(keys)} annotated pairs of {question.id} "
                f"(text, judge, round): {_describe(ann.loc[rows < 0, PAIR])}"
            )
        picked = pred.iloc[rows]
        mean = picked["mean"].to_numpy(float)
        prob = probabilities(picked, question)
        bad = ~np.isfinite(mean) | ~np.isfinite(prob).all(axis=1)
        if bad.any():
            raise InputError(
                f"method {name!r} has non-finite predictions of {question.id} for {int(bad.sum())} pairs: {_describe(ann.loc[bad, PAIR])}"
            )
        aligned.means[name], aligned.probs[name] = mean, prob
    return aligned


def pair_nll(probs: np.ndarray, answer_index: np.ndarray) -> np.ndarray:
    """(n,) -log p(observed answer) per pair."""
    with np.errstate(divide="ignore"):
        return -np.log(probs[np.arange(len(answer_index)), answer_index])


def pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row of x (R, n) with y (n,) or row-wise with y (R, n); NaN where either is constant."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(axis=-1) / np.sqrt((xc**2).sum(axis=-1) * (yc**2).sum(axis=-1))
    constant = (np.ptp(x, axis=-1) == 0) | (np.ptp(y, axis=-1) == 0)
    return np.where(constant, np.nan, r)


def _sign(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.sign(u[:, None] - v[None, :])


class SwapStatistics:
    """Metrics of both swapped predictions for batches of swap indicators S (R, n) in {0, 1}.

    ``x' = b where S=1 else a`` (method a's slot) and ``x'' = a where S=1 else b`` (b's slot).
    Pairwise terms g(x'_i, x'_j) expand as G00 + s_j (G01 - G00) + s_i (G10 - G00) +
    s_i s_j (G00 - G01 - G10 + G11) with G01[i, j] = g(a_i, b_j) etc., so ranks are linear
    and concordance / tie counts quadratic forms of s; x'' is x' at 1 - s, which reuses the
    same matrix products.
    """

    def __init__(self, y: np.ndarray, a: np.ndarray, b: np.ndarray, metrics: tuple[str, ...]):
        self.y, self.a, self.b, self.metrics = y, a, b, metrics
        n = len(y)
        self.pairwise = n <= PAIRWISE_MAX
        self.y_rank = stats.rankdata(y)
        grids = [(a, a), (a, b), (b, a), (b, b)]
        off = 1.0 - np.eye(n, dtype=np.float32)
        if self.pairwise and "spearman" in metrics:
            h = lambda u, v: ((v[None, :] < u[:, None]) + 0.5 * (v[None, :] == u[:, None])).astype(np.float32) * off
            self.rank_terms = [h(u, v) for u, v in grids]
            self.rank_sums = [t.sum(axis=1) for t in self.rank_terms]
        if self.pairwise and "kendall" in metrics:
            w = np.sign(y[:, None] - y[None, :]).astype(np.float32)
            self.concordance = self._quadratic([w * _sign(u, v).astype(np.float32) for u, v in grids])
            self.ties = self._quadratic([off * (u[:, None] == v[None, :]).astype(np.float32) for u, v in grids])
            pairs = n * (n - 1) / 2
            _, counts = np.unique(y, return_counts=True)
            self.y_untied = pairs - float((counts * (counts - 1) / 2).sum())
            self.n_pairs = pairs

    @staticmethod
    def _quadratic(g: list[np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
        """(constant, linear, symmetric quadratic) terms of the sum over i != j of the pairwise terms."""
        g00, g01, g10, g11 = g
        quad = g00 - g01 - g10 + g11
        return float(g00.sum()), (g10 - g00).sum(axis=1) + (g01 - g00).sum(axis=0), (quad + quad.T) / 2

    @staticmethod
    def _forms(terms: tuple[float, np.ndarray, np.ndarray], s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sums over pairs i < j at s and at 1 - s."""
        const, linear, quad = terms
        sq = s @ quad
        qs = (sq * s).sum(axis=1)
        at_s = const + s @ linear + qs
        at_complement = const + linear.sum() - s @ linear + quad.sum() - 2 * (s @ quad.sum(axis=1)) + qs
        return at_s.astype(np.float64) / 2, at_complement.astype(np.float64) / 2

    def _kendall(self, score: np.ndarray, ties: np.ndarray) -> np.ndarray:
        untied = self.n_pairs - ties
        with np.errstate(invalid="ignore", divide="ignore"):
            tau = score / np.sqrt(untied * self.y_untied)
        return np.where(untied > 0, tau, np.nan)

    def __call__(self, s: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """({metric: (R,)} of x', {metric: (R,)} of x'') for swap indicators ``s`` (R, n)."""
        xs = (np.where(s > 0, self.b, self.a), np.where(s > 0, self.a, self.b))
        out: tuple[dict, dict] = ({}, {})
        for o, x in zip(out, xs):
            if "rmse" in self.metrics:
                o["rmse"] = np.sqrt(((x - self.y) ** 2).mean(axis=1))
            if "pearson" in self.metrics:
                o["pearson"] = pearson_rows(x, self.y)
        if "spearman" in self.metrics:
            if self.pairwise:
                p00, p01, p10, p11 = (s @ t.T for t in self.rank_terms)
                r00, r01, r10, r11 = self.rank_sums
                keep = 1.0 - s
                ranks = (
                    1.0 + keep * (r00 - p00 + p01) + s * (r10 - p10 + p11),
                    1.0 + s * (p00 + r01 - p01) + keep * (p10 + r11 - p11),
                )
            else:
                ranks = tuple(stats.rankdata(x, axis=1) for x in xs)
            for o, r in zip(out, ranks):
                o["spearman"] = pearson_rows(r, self.y_rank)
        if "kendall" in self.metrics:
            if self.pairwise:
                scores, ties = self._forms(self.concordance, s), self._forms(self.ties, s)
                for o, score, tie in zip(out, scores, ties):
                    o["kendall"] = self._kendall(score, tie)
            else:
                for o, x in zip(out, xs):
                    o["kendall"] = np.array([stats.kendalltau(row, self.y)[0] for row in x])
        return out


def paired_permutation_test(
    y: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    metrics: tuple[str, ...] = POINT_METRICS,
    n_permutations: int = 10_000,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, dict]:
    """Paired permutation test of method ``a`` against method ``b`` on the same pairs.

    y, a, b: (n,) observed values and the two methods' point predictions. For each metric
    the statistic is the improvement of ``a`` over ``b`` (``rmse(b) - rmse(a)``; for
    correlations ``corr(a) - corr(b)``). Returns per metric: ``a``, ``b`` (the metric of
    each), ``improvement``, ``p_value`` (one-sided: ``a`` better than ``b``),
    ``p_value_reverse`` (``b`` better than ``a``) and ``p_two_sided``, all with the +1
    correction ``(1 + #{T* >= T}) / (1 + R)``. NaN where a correlation is undefined.
    """
    y, a, b = (np.asarray(v, dtype=np.float64) for v in (y, a, b))
    if not (len(y) == len(a) == len(b)):
        raise InputError(f"paired test needs equal lengths, got {len(y)}, {len(a)}, {len(b)}")
    if n_permutations < 1:
        raise InputError(f"n_permutations must be >= 1, got {n_permutations}")
    unknown = sorted(set(metrics) - set(POINT_METRICS))
    if unknown:
        raise InputError(f"unknown metric(s) {unknown}; known: {list(POINT_METRICS)}")
    stat = SwapStatistics(y, a, b, tuple(metrics))
    sign = {m: -1.0 if m in LOWER_IS_BETTER else 1.0 for m in metrics}
    observed_a = point_metrics(y, a)
    observed_b = point_metrics(y, b)
    observed = {m: sign[m] * (observed_a[m] - observed_b[m]) for m in metrics}
    ge = {m: 0 for m in metrics}
    le = {m: 0 for m in metrics}
    absge = {m: 0 for m in metrics}
    rng = np.random.default_rng(seed)
    done = 0
    with tqdm(total=n_permutations, desc="permutations", unit="perm", disable=not progress, leave=False) as bar:
        while done < n_permutations:
            r = min(BATCH, n_permutations - done)
            s = (rng.random((r, len(y))) < 0.5).astype(np.float32 if stat.pairwise else np.float64)
            first, second = stat(s)
            for m in metrics:
                t = sign[m] * (first[m] - second[m])
                tol = 1e-9 * max(1.0, abs(observed[m])) if np.isfinite(observed[m]) else 0.0
                ge[m] += int(np.sum(t >= observed[m] - tol))
                le[m] += int(np.sum(t <= observed[m] + tol))
                absge[m] += int(np.sum(np.abs(t) >= abs(observed[m]) - tol))
            done += r
            bar.update(r)
    out = {}
    for m in metrics:
        finite = bool(np.isfinite(observed[m]))
        p = lambda count: (1 + count) / (1 + n_permutations) if finite else math.nan
        out[m] = {
            "a": observed_a[m],
            "b": observed_b[m],
            "improvement": observed[m] if finite else math.nan,
            "p_value": p(ge[m]),
            "p_value_reverse": p(le[m]),
            "p_two_sided": p(absge[m]),
        }
    return out


def _metric_functions():
    """Vectorised statistics ``f(y, x, axis)`` for scipy.stats.bootstrap (resamples along ``axis``)."""

    def rmse(y, x, axis=-1):
        return np.sqrt(np.mean((np.asarray(x) - np.asarray(y)) ** 2, axis=axis))

    def pearson(y, x, axis=-1):
        return pearson_rows(np.moveaxis(np.asarray(x, float), axis, -1), np.moveaxis(np.asarray(y, float), axis, -1))

    def spearman(y, x, axis=-1):
        return pearson(stats.rankdata(y, axis=axis), stats.rankdata(x, axis=axis), axis=axis)

    def kendall(y, x):
        return stats.kendalltau(y, x)[0] if np.ptp(y) > 0 and np.ptp(x) > 0 else np.nan

    return {"rmse": (rmse, True), "pearson": (pearson, True), "spearman": (spearman, True), "kendall": (kendall, False)}


def bootstrap_intervals(
    y: np.ndarray,
    mean: np.ndarray,
    probs: np.ndarray | None,
    answer_index: np.ndarray | None,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals (scipy.stats.bootstrap, pairs resampled) of every metric.

    Returns ``{metric: (low, high)}`` for RMSE, Pearson, Spearman, Kendall and, when ``probs``
    and ``answer_index`` are given, NLL. NaN bounds where a metric is undefined (a
    constant prediction has no correlation).
    """
    y, mean = np.asarray(y, float), np.asarray(mean, float)
    out = {}
    for offset, (name, (fn, vectorized)) in enumerate(_metric_functions().items()):
        if np.ptp(mean) == 0 and name != "rmse":
            out[name] = (math.nan, math.nan)
            continue
        out[name] = _interval((y, mean), fn, vectorized, n_resamples, seed + offset, confidence)
    if probs is not None and answer_index is not None:
        losses = pair_nll(np.asarray(probs, float), np.asarray(answer_index))
        if np.isfinite(losses).all():
            out["nll"] = _interval(
                (losses,), lambda v, axis=-1: np.mean(v, axis=axis), True, n_resamples, seed + 10, confidence
            )
        else:
            out["nll"] = (math.inf, math.inf)
    return out


MAX_UNDEFINED_RESAMPLES = 0.1


def _interval(data, fn, vectorized, n_resamples, seed, confidence) -> tuple[float, float]:
    """Percentile interval of a paired bootstrap; resamples where the metric is undefined (a
    constant resample has no correlation) are left out while they are under 10 %, else NaN."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap(
            data,
            fn,
            paired=True,
            vectorized=vectorized,
            n_resamples=n_resamples,
            method="percentile",
            confidence_level=confidence,
            rng=np.random.default_rng(seed),
        )
    dist = np.asarray(res.bootstrap_distribution, float)
    if np.mean(~np.isfinite(dist)) > MAX_UNDEFINED_RESAMPLES:
        return math.nan, math.nan
    tail = 100 * (1 - confidence) / 2
    low, high = np.nanpercentile(dist[np.isfinite(dist)], [tail, 100 - tail])
    return float(low), float(high)


def compare_methods(
    aligned: Aligned,
    pairs: list[tuple[str, str]],
    metrics: tuple[str, ...] = POINT_METRICS,
    n_permutations: int = 10_000,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    """Paired tests for each (a, b) in ``pairs``: one row per (a, b, metric) with both one-sided p-values."""
    rows = []
    for a, b in tqdm(pairs, desc="significance", unit="pair", disable=not progress or not pairs):
        result = paired_permutation_test(aligned.y, aligned.means[a], aligned.means[b], metrics, n_permutations, seed)
        rows += [{"method_a": a, "method_b": b, "metric": m, **r} for m, r in result.items()]
    return pd.DataFrame(
        rows,
        columns=[
            "method_a",
            "method_b",
            "metric",
            "a",
            "b",
            "improvement",
            "p_value",
            "p_value_reverse",
            "p_two_sided",
        ],
    )


def better_than(tests: pd.DataFrame, alpha: float) -> dict[tuple[str, str, str], bool]:
    """{(winner, loser, metric): True} for every significant one-sided improvement in ``tests``."""
    out = {}
    for row in tests.itertuples(index=False):
        if row.p_value < alpha:
            out[(row.method_a, row.method_b, row.metric)] = True
        if row.p_value_reverse < alpha:
            out[(row.method_b, row.method_a, row.metric)] = True
    return out


def superscripts(
    tests: pd.DataFrame, labels: dict[str, str], metric: str, alpha: float = 0.05, star_group: list[str] | None = None
) -> dict[str, str]:
    """Table 1-style marks: for each method, the labels of the methods it beats significantly on ``metric``.

    ``labels`` maps method → row label (``1``, ``2``, ``a``…). When a method beats every
    method of ``star_group`` it can be compared with (a constant prediction has no
    correlation), those labels collapse into ``*`` (the paper's "all rows 1–6").
    """
    rows = tests[tests.metric == metric]
    wins = better_than(rows, alpha)
    defined = {frozenset((r.method_a, r.method_b)) for r in rows.itertuples(index=False) if math.isfinite(r.p_value)}
    out = {}
    for method in labels:
        beaten = [other for other in labels if (method, other, metric) in wins]
        group = [g for g in star_group or [] if g != method and frozenset((method, g)) in defined]
        star = bool(group) and all(g in beaten for g in group) and method not in (star_group or [])
        marks = (["*"] if star else []) + [labels[o] for o in beaten if not (star and o in star_group)]
        out[method] = "".join(marks)
    return out
