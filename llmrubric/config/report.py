"""The evaluation report's settings (``report.*``, ``conf/report/``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REPORT_SECTIONS = ("table1", "calibration", "ablations", "per_question", "oracles", "learning_curve")


@dataclass
class ReportConfig:
    """The evaluation report (``report.*``; ``report=full`` as defined here, ``fast`` for tests and
    smoke runs, ``none``), checked by :class:`llmrubric.report.settings.ReportSettings`. Every variant
    is trained anew under the experiment's protocol with its model/trainer settings; seeds, shares
    and repetitions are sized for the LLM-Rubric real-data report to fit in 15 minutes on 2 cores.

    Attributes:
        dir: where report.md, report.html, report.json, CSVs and figures/ are written.
        methods: Table 1 rows; None: every method of :func:`llmrubric.model.families.baselines.report_methods`.
        seeds: seeds per learned variant; a method's prediction is the mean over its seeds.
        workers: training processes (one torch thread each).
        seed: seeds permutations and bootstraps.
        permutations: paired permutation test (one-sided, swaps per pair).
        bootstrap: percentile bootstrap resamples of every metric.
        alpha, confidence: significance level of the marks; bootstrap interval level.
        calibration_bootstrap: resamples of each smECE interval (relplot itself uses 100).
        calibration_min_examples: smallest judge / system group calibrated separately.
        diagram_bootstrap: bootstrap curves of each reliability diagram's band.
        judge_figure_min_pairs: smallest judge shown in the judge-distribution figure.
        ablation_questions: feature questions left out one at a time; None: every question with LLM features.
        per_question: target questions of Table 3; None: every rubric question.
        lc_fractions: shares of the training texts (the paper: 10 %, 20 %, …, 100 %, 50 repetitions).
        lc_repetitions: repetitions (sample and seed) per share of training data.
        depersonalized_min_coverage: rows e, f need this share of held-out pairs with a second judge on the text.
        model: overrides of the experiment's model settings for every variant of the report.
    """

    name: str = "full"
    enabled: bool = True
    dir: str = "${run_dir}/report"
    sections: list[str] = field(default_factory=lambda: list(REPORT_SECTIONS))
    methods: list[str] | None = None
    seeds: int = 2
    workers: int = 2
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
    lc_fractions: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])
    lc_repetitions: int = 3
    depersonalized_min_coverage: float = 0.5
    model: dict[str, Any] = field(default_factory=dict)
