"""Human-label settings (``conf/labels/``: ``llmrubric label suggest``, ``llmrubric judges add``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SuggestConfig:
    """``llmrubric label suggest``.

    Attributes:
        floor: share of each draw's probability spread uniformly over the system's texts (every text can be drawn).
        seed: seeds the draws; give each round its own.
        round: the round the drawn texts are labelled in (annotations' ``round`` column).
        question: whose predicted variance ranks the texts; None: the rubric's main question.
    """

    floor: float = 0.2
    seed: int = 0
    round: str = "1"
    question: str | None = None


@dataclass
class JudgesConfig:
    """``llmrubric judges add``.

    Attributes:
        min_annotations: fewest answers of the main question that a judge is fitted from.
        l2: L2 on the new judge's parameters: a number, None (the checkpoint's ``trainer.delta_l2``)
            or ``cv``: the value of ``l2_grid`` with the lowest cross-validated NLL on the judge's own texts.
        cv_folds: folds over the judge's annotated texts (fewer texts: one per fold).
        max_iter: L-BFGS iterations of the fit (full batch, shared parameters frozen).
    """

    min_annotations: int = 5
    l2: Any = "cv"
    l2_grid: list[float] = field(default_factory=lambda: [0.001, 0.01, 0.1, 1.0, 10.0])
    cv_folds: int = 5
    max_iter: int = 200


@dataclass
class PlanConfig:
    """``llmrubric label plan`` (:mod:`llmrubric.scoring.label_plan`).

    Attributes:
        assurance: the share of draws of the k labels whose interval must be at most the target width.
        power: the probability of detecting the stated difference between two systems.
        alpha: intervals and the test are at 1 - alpha; None: the leaderboard's (scoring ``leaderboard.alpha``).
        residual_sd: the SD of labels around the calibrated scores within a system; None: from pilot labels
            (``--annotations``), else the checkpoint's system level (``sigma_within``).
    """

    assurance: float = 0.9
    power: float = 0.8
    alpha: float | None = None
    residual_sd: float | None = None


@dataclass
class LabelsConfig:
    """Human labels of new systems and new judges (``conf/labels/``, ``--config``); the leaderboard's
    label intervals take their alpha and small_sample from :class:`LeaderboardConfig`."""

    suggest: SuggestConfig = field(default_factory=SuggestConfig)
    judges: JudgesConfig = field(default_factory=JudgesConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
