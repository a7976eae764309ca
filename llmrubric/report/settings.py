"""What the report computes: :class:`ReportSettings` (``report.*`` of ``conf/report/*.yaml``) and their checks."""

from __future__ import annotations

from dataclasses import dataclass, fields

from llmrubric.config import REPORT_SECTIONS, ReportConfig
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.model.core.registry import names
from llmrubric.model.families.baselines import report_methods

SECTIONS = REPORT_SECTIONS


@dataclass
class ReportSettings(ReportConfig):
    """What the report computes: ``report.*`` with the defaults of :class:`llmrubric.config.ReportConfig`,
    checked; ``methods`` None becomes every method of Table 1."""

    @classmethod
    def from_dict(cls, data: dict) -> ReportSettings:
        """Settings from ``report.*`` config keys; a bad value is an InputError naming the key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(
                f"unknown report setting(s) {unknown}; known: {sorted(known)}", column=f"report.{unknown[0]}"
            )
        self = cls(**data)
        self.check()
        return self

    def __post_init__(self) -> None:
        if self.methods is None:
            self.methods = report_methods()

    def check(self) -> None:
        def bad(key, message):
            raise InputError(f"report.{key}: {message}", column=f"report.{key}")

        if not self.sections or set(self.sections) - set(SECTIONS):
            bad("sections", f"must be a non-empty subset of {list(SECTIONS)}, got {self.sections}")
        if set(self.methods) - set(names()) or "llm_rubric" not in self.methods:
            bad("methods", f"must include llm_rubric and only registered methods {names()}, got {self.methods}")
        for key in ("seeds", "workers", "permutations", "bootstrap", "lc_repetitions"):
            if int(getattr(self, key)) < 1:
                bad(key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("calibration_bootstrap", "diagram_bootstrap", "calibration_min_examples", "judge_figure_min_pairs"):
            if int(getattr(self, key)) < 0:
                bad(key, f"must be >= 0, got {getattr(self, key)}")
        if not 0 < self.alpha < 1:
            bad("alpha", f"must be in (0, 1), got {self.alpha}")
        if not 0 < self.confidence < 1:
            bad("confidence", f"must be in (0, 1), got {self.confidence}")
        if not self.lc_fractions or any(not 0 < float(f) <= 1 for f in self.lc_fractions):
            bad("lc_fractions", f"must be shares in (0, 1], got {self.lc_fractions}")


def check_questions(settings: ReportSettings, rubric: Rubric) -> None:
    """The rubric suits the report: an ordered main question, and every question the settings name exists."""
    if not rubric.main.ordered:
        raise InputError(
            f"the report needs an ordered main question; {rubric.main.id} is categorical "
            "(evaluate.py without report= scores it by accuracy, macro-F1, NLL and Brier)",
            column="main_question",
        )
    for key, ids in (("ablation_questions", settings.ablation_questions), ("per_question", settings.per_question)):
        unknown = [q for q in (ids or []) if q not in rubric]
        if unknown:
            raise InputError(
                f"report.{key}: question(s) {unknown} are not in the rubric {rubric.ids}", column=f"report.{key}"
            )
