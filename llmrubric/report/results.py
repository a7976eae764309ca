"""The trained variants' predictions as the sections read them: seeds, seed-averaged predictions, per-seed metrics."""

from __future__ import annotations

import pandas as pd

from llmrubric.evaluation.metrics import evaluate
from llmrubric.evaluation.significance import Aligned, compare_methods
from llmrubric.experiments.variants import ensemble
from llmrubric.report.plan import ReportPlan

DROP_METRICS = ("rmse", "pearson")


class Results:
    """The predictions of every trained ``(variant name, seed)`` of a :class:`ReportPlan` (``runs``)."""

    def __init__(self, plan: ReportPlan, runs: dict[tuple[str, int], pd.DataFrame], reference: dict | None = None):
        self.plan, self.runs, self.reference = plan, runs, reference or {}
        self.rubric, self.settings = plan.rubric, plan.settings
        self.question, self.annotations = plan.question, plan.annotations

    def seeds_of(self, name: str, limit: int | None = None) -> list[int]:
        """The variant's trained seeds, the first ``limit`` (default: the report's ``seeds``)."""
        return sorted(seed for n, seed in self.runs if n == name)[: limit or self.settings.seeds]

    def prediction(self, name: str, question: str | None = None, limit: int | None = None) -> pd.DataFrame:
        """The seed-averaged predictions of a variant."""
        frames = [self.runs[(name, seed)] for seed in self.seeds_of(name, limit)]
        return ensemble(frames, self.rubric, question or self.question.id)

    def per_seed_metrics(self, name: str, question=None) -> list[dict]:
        """The metrics of each seed's predictions of a variant."""
        question = question or self.question
        return [evaluate(self.runs[(name, seed)], self.annotations, question) for seed in self.seeds_of(name)]


def as_predictions(aligned: Aligned, name: str, question) -> pd.DataFrame:
    """The aligned (pooled) predictions of method ``name`` as a predictions table."""
    frame = aligned.pairs.assign(question_id=question.id)
    for j, key in enumerate(question.keys):
        frame[f"p_{key}"] = aligned.probs[name][:, j]
    return frame.assign(mean=aligned.means[name], var=0.0)


def drop_tests(r: Results, full: str, others: list[str], aligned: Aligned) -> pd.DataFrame:
    """One-sided paired permutation tests: is ``full`` better than each of ``others`` (RMSE, Pearson)?"""
    return compare_methods(aligned, [(full, o) for o in others], DROP_METRICS, r.settings.permutations, r.settings.seed)
