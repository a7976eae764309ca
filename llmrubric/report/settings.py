"""What the report computes: :class:`ReportSettings` (``report.*`` of ``conf/report/*.yaml``) and their checks."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.model.baselines import METHODS

SECTIONS = ("table1", "calibration", "ablations", "per_question", "oracles", "learning_curve")


@dataclass
class ReportSettings:
    """What the report computes (``conf/report/*.yaml``)."""

    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    methods: list[str] | None = None
    seeds: int = 3
    workers: int = 1
    seed: int = 0
    permutations: int = 10_000
    bootstrap: int = 1000
    alpha: float = 0.05
    confidence: float = 0.95
    calibration_bootstrap: int = 200
    calibration_min_examples: int = 30
    diagram_bootstrap: int = 100
    judge_figure_min_pairs: int = 15
    ablation_questions: list[str] | None = None
    per_question: list[str] | None = None
    lc_fractions: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    lc_repetitions: int = 3
    depersonalized_min_coverage: float = 0.5
    model: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> ReportSettings:
        """Settings from ``report.*`` config keys; a bad value is an InputError naming the key."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k not in ("enabled", "name", "dir")}
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
            self.methods = list(METHODS)

    def check(self) -> None:
        def bad(key, message):
            raise InputError(f"report.{key}: {message}", column=f"report.{key}")

        if not self.sections or set(self.sections) - set(SECTIONS):
            bad("sections", f"must be a non-empty subset of {list(SECTIONS)}, got {self.sections}")
        if set(self.methods) - set(METHODS) or "llm_rubric" not in self.methods:
            bad("methods", f"must include llm_rubric and only methods of {list(METHODS)}, got {self.methods}")
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
