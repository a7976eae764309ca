"""Inner cross-validation: the folds of the training texts (by text or by system), fold models fitted on their
training folds, their out-of-fold probabilities of the main question and its likelihood, candidates tuned on the
folds, and the record of what was chosen and why. ``model=auto`` (:mod:`llmrubric.model.auto`) orchestrates it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import optuna
import pandas as pd

from llmrubric.data.splits import text_folds, text_systems
from llmrubric.io.errors import InputError, NotApplicableError, TrainingDiverged
from llmrubric.io.tables import Tables
from llmrubric.model.core.combine import PROB_FLOOR
from llmrubric.model.core.encoding import question_targets
from llmrubric.model.core.params import quiet_study, sample_space
from llmrubric.model.core.registry import capabilities, fit_questions, search_space

log = logging.getLogger(__name__)

MIN_SYSTEMS = 3  # inner folds by system need this many training systems


@dataclass
class InnerFolds:
    """The inner folds of a training set: ``splits`` (train, held-out) tables, each fold's held-out ``pairs`` of
    the main question, ``answers`` (their option indices, folds concatenated), ``fold_of`` (each answer's fold),
    ``group`` (``text`` or ``system``: by system unless it fell back) and ``fallback`` (why it fell back)."""

    splits: list[tuple[Tables, Tables]]
    pairs: list[pd.DataFrame]
    answers: np.ndarray
    fold_of: np.ndarray
    group: str
    fallback: str | None = None

    @classmethod
    def of(cls, tables: Tables, main, group: str, k: int, seed: int, strict: bool) -> InnerFolds:
        """``k`` inner folds of ``tables`` by ``group``; by system with fewer than :data:`MIN_SYSTEMS` systems
        falls back to folds by text (``strict``: an error naming ``model.auto.group`` instead)."""
        folds, group, fallback = _fold_of_texts(tables, group, k, seed, strict)
        return cls.from_frame(tables, main, folds, group, fallback)

    @classmethod
    def from_frame(
        cls, tables: Tables, main, folds: pd.DataFrame, group: str = "text", fallback: str | None = None
    ) -> InnerFolds:
        """The folds of ``folds`` (``text_id``, ``fold``: a search's or a protocol's) of ``tables``."""
        splits = [
            (tables.subset(folds.text_id[folds.fold != f]), tables.subset(folds.text_id[folds.fold == f]))
            for f in sorted(folds.fold.unique())
        ]
        held = [question_targets(test, main) for _, test in splits]
        answers = np.concatenate([index for _, index in held])
        fold_of = np.concatenate([np.full(len(p), f) for f, (p, _) in enumerate(held)])
        return cls(splits, [p for p, _ in held], answers, fold_of, group, fallback)

    @property
    def trains(self) -> list[Tables]:
        return [train for train, _ in self.splits]

    def text_ids(self) -> np.ndarray:
        """The text of each held-out answer (folds concatenated)."""
        return np.concatenate([p.text_id.astype(str).to_numpy() for p in self.pairs])

    def judge_ids(self) -> np.ndarray:
        """The judge of each held-out answer (folds concatenated)."""
        return np.concatenate([p.judge_id.astype(str).to_numpy() for p in self.pairs])

    def likelihood(self, probs: np.ndarray) -> np.ndarray:
        """Each held-out answer's probability under ``probs`` (answers, options), floored at :data:`PROB_FLOOR`."""
        return np.clip(probs[np.arange(len(self.answers)), self.answers], PROB_FLOOR, 1.0)

    def nll(self, probs: np.ndarray) -> tuple[float, list[float]]:
        """The pooled out-of-fold NLL of ``probs`` (answers, options) and each fold's."""
        loss = -np.log(self.likelihood(probs))
        return float(loss.mean()), [float(loss[self.fold_of == f].mean()) for f in range(len(self.splits))]


def _fold_of_texts(tables: Tables, group: str, k: int, seed: int, strict: bool) -> tuple[pd.DataFrame, str, str | None]:
    """(text_id, fold) of every training text, the grouping used and why it fell back (None: it did not)."""
    if group == "text":
        return text_folds(tables.text_ids, min(k, len(tables.text_ids)), seed), "text", None
    systems = text_systems(tables)
    names = np.array(sorted(systems.unique()))
    if len(names) < MIN_SYSTEMS:
        reason = f"inner folds by system need at least {MIN_SYSTEMS} training systems, found {len(names)}"
        if strict:
            raise InputError(reason, setting="model.auto.group")
        log.warning("model=auto: %s; inner folds by text instead", reason)
        folds, _, _ = _fold_of_texts(tables, "text", k, seed, strict)
        return folds, "text", f"{reason}: inner folds by text"
    order = np.random.default_rng(seed).permutation(len(names))
    fold_of = {names[i]: n % min(k, len(names)) for n, i in enumerate(order)}
    return pd.DataFrame({"text_id": systems.index, "fold": systems.map(fold_of).to_numpy()}), "system", None


def fit_folds(models: list, trains: list[Tables], main_id: str) -> list:
    """Fold models fitted on their training folds: as one program where the family has ``joint_fit`` (the
    network's heads), else one by one on the main question."""
    if capabilities(models[0]).joint_fit:
        models[0].fit_many(models, trains)
        return models
    return [fit_questions(model, train, [main_id]) for model, train in zip(models, trains)]


def held_out(models: list, folds: InnerFolds, rubric) -> list[np.ndarray]:
    """Each fold model's main-question probabilities of its held-out pairs (an error where not finite)."""
    main_index, k = rubric.ids.index(rubric.main.id), len(rubric.main.options)
    out = [m.predict_proba(test, p)[:, main_index, :k] for m, (_, test), p in zip(models, folds.splits, folds.pairs)]
    if not all(np.isfinite(f).all() for f in out):
        raise InputError("non-finite inner-CV predictions")
    return out


def tune(
    names: list[str],
    build: Callable,
    skip: Callable[[str, object], bool],
    folds: InnerFolds,
    rubric,
    trials: int,
    seed: int,
) -> dict:
    """Candidate → ``{"params": its best trial's, "trials": [{"params", "nll" or "error"}]}`` of every candidate
    of ``names`` whose settings declare a search space (``build(name, params=None)``: the unfitted candidate;
    ``skip(name, model)``: leave it out), tuned by ``trials`` Optuna trials (TPE seeded by ``seed``) on ``folds``,
    the first at its own settings (those within the space), so tuning never makes it worse on them; a failed trial
    is recorded with its reason, and a candidate with no trial that fits keeps its own settings (``params`` empty)."""
    out = {}
    for name in names:
        model = build(name)
        space = search_space(name, model.get_params())
        if not space or skip(name, model):
            continue
        study = quiet_study(optuna.samplers.TPESampler(seed=seed))
        own = model.get_params()
        study.enqueue_trial({k: own[k] for k, spec in space.items() if k in own and in_space(own[k], spec)})
        records = []
        for _ in range(trials):
            trial = study.ask()
            params = sample_space(trial, space)
            try:
                models = fit_folds([build(name, params) for _ in folds.splits], folds.trains, rubric.main.id)
                probs = np.concatenate(held_out(models, folds, rubric))
            except (NotApplicableError, TrainingDiverged) as e:  # a draw that these data cannot fit, or diverged
                records.append({"params": params, "error": reason(e)})
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            nll = float(-np.log(folds.likelihood(probs)).mean())
            records.append({"params": params, "nll": nll})
            study.tell(trial, nll)
        fitted = [t for t in records if "nll" in t]
        out[name] = {"params": min(fitted, key=lambda t: t["nll"])["params"] if fitted else {}, "trials": records}
        log.info("model=auto: %s tuned by %d trials: %s", name, len(records), out[name]["params"])
    return out


def in_space(value, spec: dict) -> bool:
    """Whether ``value`` is one a search space's ``spec`` can draw."""
    if spec.get("type") == "categorical":
        return value in list(spec["choices"])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not spec["low"] <= value <= spec["high"]:
        return False
    return spec.get("type") != "int" or (value - spec["low"]) % spec.get("step", 1) == 0


def reason(error: Exception) -> str:
    """An error's message on one line, at most 300 characters."""
    return " ".join(str(error).split())[:300]


def point_figures(probs: np.ndarray, answers: np.ndarray, question) -> dict:
    """Pearson of the expected against the observed answer (ordered questions)."""
    if not question.ordered:
        return {}
    values = np.asarray(question.values, dtype=float)
    expected, observed = probs @ values, values[answers]
    if np.ptp(expected) == 0 or np.ptp(observed) == 0:
        return {"pearson": float("nan")}
    return {"pearson": float(np.corrcoef(expected, observed)[0, 1])}


def decision(table: dict, weights: dict, rule: str, rule_cv: dict | None = None, parts: dict | None = None) -> dict:
    """Why the weights are what they are: the rule (with ``rule=auto`` each rule's cross-validated
    NLL), the winner (``select``) or the weighted members (``stack``), the best candidate with and
    without the system level (``parts``: label → :class:`~llmrubric.model.core.system_level.Part`), by how much
    the folds agree, and why any candidate was left out."""
    fitted = {n: r for n, r in table.items() if "nll" in r}
    ranked = sorted(fitted, key=lambda n: fitted[n]["nll"])
    levelled = {n for n, part in (parts or {}).items() if part.where is not None}
    best = {
        kind: next((n for n in ranked if (n in levelled) == with_level), None)
        for kind, with_level in (("with_level", True), ("without_level", False))
    }
    out = {"rule": rule, "ranking": ranked, **{f"best_{k}": v for k, v in best.items()}}
    left_out = {n: r["not_applicable"] for n, r in table.items() if "not_applicable" in r}
    if left_out:
        out["not_applicable"] = left_out
    if rule_cv:
        out["rule_cv"] = rule_cv
    if best["with_level"] and best["without_level"]:
        a, b = (np.asarray(fitted[best[k]]["fold_nll"]) for k in ("with_level", "without_level"))
        out["level_gain"] = float(fitted[best["without_level"]]["nll"] - fitted[best["with_level"]]["nll"])
        out["folds_level_better"] = f"{int((a < b).sum())} of {len(a)}"
    winner = max(weights, key=weights.get)
    runner = next((n for n in ranked if n != winner), None)
    out["reason"] = (
        f"lowest inner-CV NLL: {winner} {fitted[winner]['nll']:.4f}"
        + (f" vs {runner} {fitted[runner]['nll']:.4f}" if runner else "")
        if rule == "select"
        else f"stacked weights {weights}"
    )
    return out
