"""Prediction intervals with a coverage guarantee, conformalised on out-of-fold predictions.

A model predicts a distribution over an ordered question's values for each (text, judge) pair, and for a
text's judge-free score (the mean over judges) the distribution of that mean (the judges' distributions
convolved). Each is turned into an interval by distributional conformal prediction (Chernozhukov, Wüthrich
and Zhu, PNAS 2021): the conformity score of an observed value ``y`` under the predictive CDF ``F`` is its
tail mass from the nearer side, ``min(F(y), 1 - F(y-))``; the interval at coverage ``1 - a`` holds every value
whose score reaches ``q``, the ``floor(a (n + 1))``-th smallest of ``n`` calibration scores (the values between
the two central quantiles of tail mass ``q``: an interval, narrower where the model is sure). The calibration
scores are those of out-of-fold predictions of the training data (``model=auto``'s inner folds: CV+-style, no
labels spent twice), kept sorted in the checkpoint, so any coverage can be asked for when scoring. The guarantee
is marginal, over texts exchangeable with the training texts: P(y in interval) >= 1 - a on average over texts,
not for each text, nor for a system that the model misjudges as a whole.

A categorical question gets prediction sets instead (least ambiguous set-valued classifiers, Sadinle, Lei and
Wasserman, JASA 2019): the score of an observed option is its predicted probability, and the set at coverage
``1 - a`` holds every option whose probability reaches ``q`` (never empty: the most probable option at least).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from llmrubric.io.guards import check_range

GRID = 1e-9  # values closer than this are one support point of a convolved mean


def tail_scores(cdf_below: np.ndarray, cdf_at: np.ndarray) -> np.ndarray:
    """``min(F(y), 1 - F(y-))``: the tail mass at and beyond ``y`` from the nearer side."""
    return np.minimum(cdf_at, 1.0 - cdf_below)


def rank(n: int, coverage: float) -> int:
    """``floor((1 - coverage)(n + 1))``: which smallest of ``n`` scores is the threshold (0: too few scores)."""
    return int(np.floor((1 - coverage) * (n + 1)))


def threshold(scores: np.ndarray, coverage: float) -> float:
    """The conformal threshold: the :func:`rank`-th smallest score (0 where that is 0: too few scores for the
    coverage asked, every value is in the interval)."""
    coverage = check_range("coverage", coverage, 0, 1, open_low=True, open_high=True)
    k = rank(len(scores), coverage)
    return float(np.sort(scores)[k - 1]) if k >= 1 else 0.0


def per_row(q) -> np.ndarray:
    """A threshold ready to compare with (rows, options) scores: one for all rows, or one per row as a column."""
    q = np.asarray(q, dtype=float)
    return q[:, None] if q.ndim else q


def interval(values: np.ndarray, probs: np.ndarray, q) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of each row's values whose tail score reaches ``q`` (one threshold, or one per row) of (rows,
    support) distributions over ascending ``values``; where none does (q above every score), the interval is the
    row's median point."""
    cdf = np.cumsum(probs, axis=-1)
    below = cdf - probs
    inside = tail_scores(below, cdf) >= per_row(q) - 1e-12
    median = np.argmax(cdf >= 0.5 - 1e-12, axis=-1)
    inside[np.arange(len(inside)), median] |= ~inside.any(axis=-1)
    lo = values[np.argmax(inside, axis=-1)]
    hi = values[inside.shape[-1] - 1 - np.argmax(inside[:, ::-1], axis=-1)]
    return lo, hi


def mean_distribution(values: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of the mean of independent answers: ``probs`` (judges, options) over ``values`` →
    (support, probabilities) of their mean."""
    support, mass = np.zeros(1), np.ones(1)
    for p in probs:
        sums = (support[:, None] + values[None, :]).ravel()
        weights = (mass[:, None] * p[None, :]).ravel()
        keys = np.round(sums / GRID).astype(np.int64)
        uniq, inverse = np.unique(keys, return_inverse=True)
        support, mass = uniq * GRID, np.bincount(inverse, weights=weights)
    return support / len(probs), mass


def mean_intervals(values: np.ndarray, probs: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of the mean over judges for each text: ``probs`` (texts, judges, options)."""
    lo, hi = np.empty(len(probs)), np.empty(len(probs))
    for i, p in enumerate(probs):
        support, mass = mean_distribution(values, p)
        (lo[i],), (hi[i],) = interval(support, mass[None, :], q)
    return lo, hi


def mean_score(values: np.ndarray, probs: np.ndarray, observed: float) -> float:
    """The tail score of an observed mean over the judges whose distributions are ``probs`` (judges, options)."""
    support, mass = mean_distribution(values, probs)
    cdf = np.cumsum(mass)
    at = int(np.argmin(np.abs(support - observed)))
    return float(tail_scores(cdf[at] - mass[at], cdf[at]))


def prediction_sets(probs: np.ndarray, q) -> np.ndarray:
    """(rows, options) membership of each row's prediction set: the options of probability at least ``q`` (one
    threshold, or one per row), and the most probable one where none reaches it."""
    inside = probs >= per_row(q) - 1e-12
    inside[np.arange(len(probs)), np.argmax(probs, axis=-1)] = True
    return inside


@dataclass
class Conformal:
    """The calibration scores of one question (sorted): ``pairs`` of (text, judge) answers and, for an ordered
    question, ``texts`` of the mean over each text's judges (empty for a categorical one, whose pairs get
    prediction sets). :meth:`fit` takes out-of-fold predictions."""

    question_id: str
    pairs: np.ndarray
    texts: np.ndarray
    ordered: bool = True
    judges: dict[str, np.ndarray] = field(default_factory=dict)  # each judge's own pair scores (sorted)

    @classmethod
    def fit(cls, question, probs: np.ndarray, answers: np.ndarray, text_ids, judge_ids=None) -> Conformal:
        """``probs`` (pairs, options) out-of-fold distributions of ``question``, ``answers`` the observed option
        index of each pair, ``text_ids`` each pair's text, ``judge_ids`` its judge (kept for :meth:`thresholds`
        by judge)."""
        rows = np.arange(len(answers))
        judges = pd.Series(np.asarray(judge_ids if judge_ids is not None else [], dtype=str))
        if not question.ordered:
            scores = probs[rows, answers]
            return cls(question.id, np.sort(scores), np.zeros(0), False, _by_judge(scores, judges))
        values = np.asarray(question.values, dtype=float)
        probs = probs[:, : len(values)]
        cdf = np.cumsum(probs, axis=1)
        pairs = tail_scores(cdf[rows, answers] - probs[rows, answers], cdf[rows, answers])
        frame = pd.DataFrame({"text": np.asarray(text_ids, dtype=object), "row": rows})
        texts = [
            mean_score(values, probs[group.row.to_numpy()], float(values[answers[group.row.to_numpy()]].mean()))
            for _, group in frame.groupby("text", sort=False)
        ]
        texts = np.sort(np.asarray(texts, dtype=float))
        return cls(question.id, np.sort(pairs), texts, True, _by_judge(pairs, judges))

    def thresholds(self, coverage: float, judge_ids=None) -> np.ndarray | float:
        """The conformal threshold of the pooled scores, or with ``judge_ids`` one per row: the judge's own
        scores' where it has enough for the coverage (``floor((1 - coverage)(n + 1)) >= 1``: coverage holds for
        each such judge, Mondrian conformal prediction), the pooled one for the others."""
        pooled = threshold(self.pairs, coverage)
        if judge_ids is None:
            return pooled
        own = {j: threshold(s, coverage) for j, s in self.judges.items() if rank(len(s), coverage) >= 1}
        return np.array([own.get(str(j), pooled) for j in judge_ids], dtype=float)

    def pair_intervals(
        self, question, probs: np.ndarray, coverage: float, judge_ids=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of each (text, judge) answer: ``probs`` (pairs, options); ``judge_ids``: by judge
        (:meth:`thresholds`)."""
        values = np.asarray(question.values, dtype=float)
        return interval(values, probs[:, : len(values)], self.thresholds(coverage, judge_ids))

    def pair_sets(self, probs: np.ndarray, coverage: float, judge_ids=None) -> np.ndarray:
        """(pairs, options) membership of each (text, judge) answer's prediction set (a categorical question)."""
        return prediction_sets(probs, self.thresholds(coverage, judge_ids))

    def score_intervals(self, question, probs: np.ndarray, coverage: float) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of each text's mean over judges: ``probs`` (texts, judges, options)."""
        values = np.asarray(question.values, dtype=float)
        return mean_intervals(values, probs[:, :, : len(values)], threshold(self.texts, coverage))

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """Metadata and arrays for a checkpoint."""
        meta = {"question_id": self.question_id, "pairs": len(self.pairs), "texts": len(self.texts)}
        judges = {"judges": list(self.judges), "judge_pairs": [len(s) for s in self.judges.values()]}
        scores = np.concatenate([*self.judges.values(), np.zeros(0)])
        return {**meta, "ordered": self.ordered, **judges}, {
            "pairs": self.pairs,
            "texts": self.texts,
            "judge_scores": scores,
        }

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> Conformal:
        pairs, texts = np.asarray(arrays["pairs"], float), np.asarray(arrays["texts"], float)
        ends = np.cumsum(meta.get("judge_pairs", []), dtype=int)
        scores = np.asarray(arrays.get("judge_scores", np.zeros(0)), float)
        judges = {j: scores[e - n : e] for j, n, e in zip(meta.get("judges", []), meta.get("judge_pairs", []), ends)}
        return cls(meta["question_id"], pairs, texts, bool(meta.get("ordered", True)), judges)


def _by_judge(scores: np.ndarray, judges: pd.Series) -> dict[str, np.ndarray]:
    """Each judge's scores, sorted ({} without judge ids)."""
    if not len(judges):
        return {}
    return {str(j): np.sort(scores[rows]) for j, rows in judges.groupby(judges, sort=True).indices.items()}
