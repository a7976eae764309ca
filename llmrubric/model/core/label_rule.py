"""The label rule of an ordered main question: one option per predicted distribution, chosen to agree with assessors.

Rules (:data:`RULES`): ``argmax`` (the most probable option), ``rounded_mean`` (the option whose value is
nearest the expected grade, ties up), ``frequency_thresholds`` (K-1 cut points on the expected grade that
give each option its share of the training answers) and ``kappa_thresholds`` (K-1 cut points that
maximise the objective κ on the training answers, by coordinate search over the gaps between the sorted
expected grades). :func:`choose_rule` picks the rule by cross-validation over given folds of
out-of-fold predictions: each rule's cut points are fitted on all folds but one and scored on that one;
the best mean wins and is refitted on all the predictions. Options are ranked by their value, so a
scale written high to low is labelled as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from llmrubric.config import LABEL_RULES, LabelRuleConfig, model_settings
from llmrubric.data.splits import text_folds
from llmrubric.io.errors import InputError
from llmrubric.io.predictions import probabilities
from llmrubric.io.rubric import Question
from llmrubric.io.tables import Tables
from llmrubric.model.core.encoding import question_targets

RULES = LABEL_RULES  # a tie goes to the earlier
OBJECTIVES = ("kappa", "qwk")
OBJECTIVE = LabelRuleConfig.objective
MAX_PASSES = 20
IN_SAMPLE_FOLDS = 5


@dataclass(frozen=True)
class LabelRule:
    """A fitted rule: its ``name``, the cut points of a threshold rule (ascending, ``-inf``/``inf`` where
    an option is never given) and a ``record`` (what it was fitted on, each rule's cross-validated score)."""

    name: str = "argmax"
    cuts: tuple[float, ...] = ()
    record: dict = field(default_factory=dict)

    def indices(self, probs: np.ndarray, values) -> np.ndarray:
        """Option index (in the question's option order) of each row of ``probs`` (rows, options)."""
        probs = np.asarray(probs, dtype=float)
        if self.name == "argmax":
            return probs.argmax(axis=1)
        values = np.asarray(values, dtype=float)
        cuts = midpoints(values) if self.name == "rounded_mean" else np.asarray(self.cuts, dtype=float)
        if len(cuts) != len(values) - 1:
            raise InputError(f"label rule {self.name} has {len(cuts)} cut points for {len(values)} options")
        ranks = (probs @ values >= cuts[:, None]).sum(axis=0)
        return np.argsort(values, kind="stable")[ranks]

    def to_dict(self) -> dict:
        """JSON-safe: infinite cut points as the strings ``-inf`` and ``inf``."""
        cuts = [str(c) if math.isinf(c) else float(c) for c in self.cuts]
        return {"name": self.name, "cuts": cuts, **self.record}

    @classmethod
    def from_dict(cls, data: dict | None, source: str = "<checkpoint>") -> LabelRule:
        """The rule of :meth:`to_dict`; ``None`` (a checkpoint written before rules): ``argmax``, said in the record."""
        if data is None:
            return cls("argmax", (), {"fitted_on": "none: a checkpoint without a label rule; argmax"})
        if data.get("name") not in RULES:
            raise InputError(f"unknown label rule {data.get('name')!r}; known: {list(RULES)}", file=source)
        cuts = tuple(float(c) for c in data.get("cuts") or [])
        record = {k: v for k, v in data.items() if k not in ("name", "cuts")}
        return cls(data["name"], cuts, record)


def midpoints(values) -> np.ndarray:
    """Cut points halfway between consecutive sorted option values (``rounded_mean``)."""
    v = np.sort(np.asarray(values, dtype=float))
    return (v[:-1] + v[1:]) / 2


def kappa(observed: np.ndarray, predicted: np.ndarray, k: int, objective: str = "kappa") -> float:
    """Cohen's κ (``kappa``) or quadratic weighted κ (``qwk``) of two rank vectors in ``0..k-1``; NaN when undefined."""
    confusion = np.zeros((k, k))
    np.add.at(confusion, (observed, predicted), 1.0)
    return _kappa_of(confusion, _weights(k, objective))


def _weights(k: int, objective: str) -> np.ndarray:
    if objective not in OBJECTIVES:
        raise InputError(f"{objective!r} is not one of {list(OBJECTIVES)}", setting="model.label_rule.objective")
    i = np.arange(k)
    return (
        (i[:, None] - i[None, :]) ** 2 / max(k - 1, 1) ** 2 if objective == "qwk" else (i[:, None] != i).astype(float)
    )


def _kappa_of(confusion: np.ndarray, weights: np.ndarray) -> float:
    n = confusion.sum()
    expected = np.outer(confusion.sum(axis=1), confusion.sum(axis=0)) / n
    denominator = (weights * expected).sum()
    return float(1 - (weights * confusion).sum() / denominator) if denominator > 0 else math.nan


def fit_cuts(name: str, expected: np.ndarray, ranks: np.ndarray, k: int, objective: str = OBJECTIVE) -> tuple:
    """The cut points of threshold rule ``name`` on ``expected`` grades with observed ``ranks`` (0..k-1)."""
    order = np.argsort(expected, kind="stable")
    e, r = np.asarray(expected, float)[order], np.asarray(ranks)[order]
    n = len(e)
    valid = np.ones(n + 1, dtype=bool)  # positions between distinct values (and both ends)
    valid[1:n] = e[1:] > e[:-1]
    positions = _frequency_positions(r, k, valid)
    if name == "kappa_thresholds":
        positions = _coordinate_search(positions, r, k, valid, _weights(k, objective))
    elif name != "frequency_thresholds":
        raise InputError(f"{name!r} is not a threshold rule")
    return tuple(_cut_at(e, p) for p in positions)


def _cut_at(e: np.ndarray, p: int) -> float:
    if p == 0:
        return -math.inf
    if p == len(e):
        return math.inf
    return float((e[p - 1] + e[p]) / 2)


def _frequency_positions(r: np.ndarray, k: int, valid: np.ndarray) -> np.ndarray:
    """Positions that give the options of ranks below each cut the training share of answers of those ranks."""
    targets = np.cumsum(np.bincount(r, minlength=k))[:-1]
    candidates = np.flatnonzero(valid)
    return np.array([candidates[np.abs(candidates - t).argmin()] for t in targets])


def _coordinate_search(positions: np.ndarray, r: np.ndarray, k: int, valid: np.ndarray, weights: np.ndarray):
    """Move one cut at a time to its best valid position between its neighbours until none improves.

    Moving cut j only exchanges rows between the predicted ranks j and j+1 of the confusion matrix, so
    every candidate position is scored at once from cumulative counts of the observed ranks."""
    n = len(r)
    cum = np.vstack([np.zeros(k), np.cumsum(np.eye(k)[r], axis=0)])  # (n+1, k): observed ranks before each position
    marginal = cum[-1]
    positions = positions.copy()
    best = -math.inf
    for _ in range(MAX_PASSES):
        improved = False
        for j in range(k - 1):
            bounds = np.concatenate([[0], positions, [n]])
            lo, hi = bounds[j], bounds[j + 2]
            fixed_obs, fixed_exp = 0.0, 0.0
            for i in range(k):
                if i in (j, j + 1):
                    continue
                row = cum[bounds[i + 1]] - cum[bounds[i]]
                fixed_obs += weights[:, i] @ row
                fixed_exp += (bounds[i + 1] - bounds[i]) * (weights[:, i] @ marginal)
            p = np.arange(lo, hi + 1)
            below, above = cum[p] - cum[lo], cum[hi] - cum[p]
            observed = fixed_obs + below @ weights[:, j] + above @ weights[:, j + 1]
            chance = (fixed_exp + (p - lo) * (weights[:, j] @ marginal) + (hi - p) * (weights[:, j + 1] @ marginal)) / n
            with np.errstate(divide="ignore", invalid="ignore"):
                score = np.where(valid[p] & (chance > 0), 1 - observed / chance, -np.inf)
            pick = int(score.argmax())
            if score[pick] > best + 1e-12:
                best, improved = float(score[pick]), True
                positions[j] = p[pick]
        if not improved:
            break
    return positions


def fit_rule(name: str, probs: np.ndarray, answers: np.ndarray, values, objective: str = OBJECTIVE) -> LabelRule:
    """Rule ``name`` fitted on ``probs`` (rows, options) and observed option indices ``answers``."""
    if name not in ("frequency_thresholds", "kappa_thresholds"):
        return LabelRule(name)
    values = np.asarray(values, dtype=float)
    rank_of = np.argsort(np.argsort(values, kind="stable"), kind="stable")
    return LabelRule(name, fit_cuts(name, probs @ values, rank_of[answers], len(values), objective))


def choose_rule(
    probs: np.ndarray,
    answers: np.ndarray,
    folds: np.ndarray,
    values,
    rules=RULES,
    objective: str = OBJECTIVE,
    fitted_on: str = "out-of-fold",
) -> LabelRule:
    """The rule of ``rules`` with the best mean ``objective`` over ``folds`` (each fold scored by the rule
    fitted on the others), refitted on all of ``probs``; its record holds every rule's score."""
    unknown = [r for r in rules if r not in RULES]
    if unknown or not list(rules):
        raise InputError(f"unknown label rule(s) {unknown}; known: {list(RULES)}", setting="model.label_rule.rules")
    values = np.asarray(values, dtype=float)
    rank_of = np.argsort(np.argsort(values, kind="stable"), kind="stable")
    k, folds = len(values), np.asarray(folds)
    scores = {}
    for name in rules:
        per_fold = []
        for f in np.unique(folds):
            train, test = folds != f, folds == f
            rule = fit_rule(name, probs[train], answers[train], values, objective)
            predicted = rank_of[rule.indices(probs[test], values)]
            per_fold.append(kappa(rank_of[answers[test]], predicted, k, objective))
        finite = [s for s in per_fold if not math.isnan(s)]
        scores[name] = float(np.mean(finite)) if finite else None
    ranked = [n for n in rules if scores[n] is not None]
    best = max(ranked, key=lambda n: scores[n]) if ranked else "argmax"
    rule = fit_rule(best, probs, answers, values, objective)
    record = {"fitted_on": fitted_on, "objective": objective, "folds": int(len(np.unique(folds))), "scores": scores}
    return LabelRule(rule.name, rule.cuts, record)


def settings_of(model: dict | None) -> LabelRuleConfig:
    """``model.label_rule`` of ``model`` settings (the defaults where absent), checked."""
    settings = LabelRuleConfig(**model_settings(model)["label_rule"])
    unknown = [r for r in settings.rules if r not in RULES]
    if unknown or not list(settings.rules):
        raise InputError(f"unknown label rule(s) {unknown}; known: {list(RULES)}", setting="model.label_rule.rules")
    _weights(2, settings.objective)
    return settings


def main_rule(
    question: Question, probs: np.ndarray, answers: np.ndarray, folds, model: dict | None, fitted_on: str
) -> LabelRule | None:
    """:func:`choose_rule` with ``model.label_rule``'s settings on the main question's ``probs`` (rows, options)
    and observed option indices; None for a question that is not ordered (its label is the argmax)."""
    if not question.ordered:
        return None
    settings = settings_of(model)
    known = np.asarray(answers) >= 0
    return choose_rule(
        probs[known],
        np.asarray(answers)[known],
        np.asarray(folds)[known],
        question.values,
        settings.rules,
        settings.objective,
        fitted_on,
    )


def in_sample_rule(model, tables: Tables, seed: int = 0) -> LabelRule | None:
    """The rule of a model without inner cross-validation (the network alone): chosen by folds of
    training texts over the model's in-sample predictions of the main question (``fitted_on: in-sample``)."""
    question = model.rubric.main
    pairs, answers = question_targets(tables, question)
    index, k = model.rubric.ids.index(question.id), len(question.options)
    probs = model.predict_proba(tables, pairs)[:, index, :k]
    folds = text_folds(pairs.text_id, min(IN_SAMPLE_FOLDS, pairs.text_id.nunique()), seed)
    fold_of = pd.Series(folds.fold.to_numpy(), index=folds.text_id)
    folds = fold_of.reindex(pairs.text_id).to_numpy()
    return main_rule(question, probs, answers, folds, getattr(model, "model", None), "in-sample")


def rule_of(model) -> LabelRule:
    """The model's rule (``argmax`` for a model without one, said in its record)."""
    rule = getattr(model, "label_rule_", None)
    return rule if rule is not None else LabelRule.from_dict(None)


def with_labels(predictions: pd.DataFrame, question: Question, rule: LabelRule) -> pd.DataFrame:
    """``predictions`` with a ``label`` column: ``rule``'s option key on the rows of the ordered ``question``,
    NA on the others (unchanged when ``question`` is not ordered)."""
    if not question.ordered:
        return predictions
    out = predictions.copy()
    rows = (out.question_id == question.id).to_numpy()
    keys = np.asarray(question.keys, dtype=object)
    labels = pd.Series(pd.NA, index=out.index, dtype=object)
    labels[rows] = keys[rule.indices(probabilities(out[rows], question), question.values)]
    out["label"] = labels
    return out
