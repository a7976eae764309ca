"""Scoring and leaderboard settings (``conf/scoring/``: ``llmrubric score``, ``llmrubric leaderboard``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LeaderboardConfig:
    """System leaderboards (``leaderboard.*`` of the scoring settings).

    Attributes:
        question: None: the checkpoint's (rubric's) main question.
        bootstrap: replicates; texts and judges resampled, answers drawn from p̂_a.
        alpha: intervals are 1 - alpha.
        sample_answers: False: replicates use expected answers (no answer sampling).
        band_replicates: replicates kept for the density plot's uncertainty bands.
        missing_systems: a system absent from the reference leaderboard: ``error`` or ``drop`` (warned).
        small_sample: label intervals (classical, PPI, PPI++): ``student`` widens ppi_py's normal
            interval to Student's t_{k-1} with Bessel's correction (k labels); ``normal`` keeps the library's.
        transport_margin: the transport check of ``--levels --annotations`` (:mod:`llmrubric.scoring.transport`):
            the largest error of a new system's level that its labels may show and PASS (label scale); None: each
            system's own prior half-width z_{1-alpha/2}·level_sd. FAIL and INCONCLUSIVE replace the system's level
            interval by the PPI++ interval of its labels alone.
        transport_min_labels: fewest labels of a system for the check (fewer: ``too few labels``, not checked).
    """

    question: str | None = None
    bootstrap: int = 1000
    seed: int = 0
    alpha: float = 0.05
    sample_answers: bool = True
    band_replicates: int = 200
    missing_systems: str = "error"
    small_sample: str = "student"
    transport_margin: float | None = None
    transport_min_labels: int = 10


@dataclass
class ScoringConfig:
    """Scoring new texts with a trained calibrator and system leaderboards (LLM-Rubric Appendix A):
    ``llmrubric score texts`` and ``llmrubric leaderboard build`` (``conf/scoring/``, ``--config``).

    Attributes:
        trusted_judges: the trusted set A; None: every judge known to the checkpoint.
        questions: questions to score; None: every ordered rubric question (categorical ones have no score).
        quantile: judge-free quantile over A, reported beside mean and max.
        coverage: the coverage of the conformal intervals ``lo``/``hi`` of the main question's score and predictions.
        coverage_by: ``pooled``: one conformal threshold for every judge (coverage on average over judges);
            ``judge``: each judge's own where it has enough out-of-fold answers (coverage for each such judge).
        chunk_texts: texts per chunk; memory is bounded by chunk_texts × |A| pairs.
    """

    trusted_judges: list[str] | None = None
    questions: list[str] | None = None
    quantile: float = 0.9
    coverage: float = 0.9
    coverage_by: str = "pooled"
    chunk_texts: int = 4096
    leaderboard: LeaderboardConfig = field(default_factory=LeaderboardConfig)
