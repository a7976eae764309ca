"""Which variants the report's sections need: the methods that apply to the data, the questions of
each section, and the variants to train with their number of seeds."""

from __future__ import annotations

import pandas as pd

from llmrubric.experiments.experiment import Split
from llmrubric.experiments.variants import (
    Variant,
    ablation_variants,
    learning_curve_variants,
    oracle_variants,
    per_question_variants,
    table1_variants,
)
from llmrubric.io.rubric import Rubric
from llmrubric.model.core.encoding import FeatureLayout
from llmrubric.model.core.registry import capabilities
from llmrubric.model.families.oracles import JudgeAnswers
from llmrubric.report.settings import ReportSettings, check_questions


class ReportPlan:
    """The methods and questions of the report on ``splits`` and the variants its ``settings.sections`` need."""

    def __init__(self, rubric: Rubric, splits: list[Split], settings: ReportSettings):
        self.rubric, self.splits, self.settings = rubric, splits, settings
        self.question = rubric.main
        self.annotations = pd.concat([s.test.annotations for s in splits], ignore_index=True)
        check_questions(settings, rubric)
        self.llm_questions = self.feature_questions()
        self.methods = [
            m
            for m in settings.methods
            if self.question.id in self.llm_questions or not capabilities(m).needs_llm_answers
        ]
        self.method_notes = [
            f"{m} left out: no LLM source answered {self.question.id} in the features"
            for m in settings.methods
            if m not in self.methods
        ]

    def feature_questions(self) -> list[str]:
        """Rubric questions that some LLM source answered (have a feature block)."""
        layout = FeatureLayout.from_features(self.splits[0].train.features, self.rubric)
        return [q for q in self.rubric.ids if any(b.question_id == q for b in layout.blocks)]

    def depersonalized_coverage(self) -> float:
        """The smallest share, over splits, of held-out pairs with another judge on the same text."""
        judge_answers = JudgeAnswers(self.rubric, others=True)
        return min(judge_answers.coverage(s.test) for s in self.splits)

    def requests(self) -> dict[Variant, int]:
        """Every variant the sections need, with its number of seeds."""
        s = self.settings
        out: dict[Variant, int] = {}

        def add(variant: Variant, seeds: int = s.seeds):
            out[variant] = max(out.get(variant, 0), seeds)

        sections = set(s.sections)
        if sections & {"table1", "oracles"}:
            for v in table1_variants(self.methods):
                add(v)
        if "calibration" in sections:
            add(Variant("llm_rubric"))
            if self.question.id in self.llm_questions:
                add(Variant("expected_llm", method="expected_llm"))
        if "ablations" in sections:
            for v in ablation_variants(self.rubric, self.ablation_questions()).values():
                add(v)
        if "per_question" in sections:
            for model, base in per_question_variants(self.rubric, self.table3_questions()).values():
                add(model)
                add(base)
        if "oracles" in sections:
            for _, v in oracle_variants(self.depersonalized_coverage() >= s.depersonalized_min_coverage).values():
                add(v)
        if "learning_curve" in sections:
            for v in learning_curve_variants(self.fractions()).values():
                add(v, s.lc_repetitions)
        return out

    def ablation_questions(self) -> list[str]:
        """The feature questions removed one at a time in Table 2."""
        return (
            list(self.settings.ablation_questions)
            if self.settings.ablation_questions is not None
            else self.feature_questions()
        )

    def table3_questions(self, kept: bool = True) -> list[str]:
        """The questions of Table 3 (``kept=False``: those left out): answered by the judges, ordered and
        answered by an LLM source."""
        ids = self.settings.per_question if self.settings.per_question is not None else self.rubric.ids
        answered = set(self.annotations.question_id)
        return [q for q in ids if q in answered and (self.rubric[q].ordered and q in self.llm_questions) == kept]

    def fractions(self) -> list[float]:
        """The learning curve's shares of the training texts, ascending."""
        return sorted({float(f) for f in self.settings.lc_fractions})
