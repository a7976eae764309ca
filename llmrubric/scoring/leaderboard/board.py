"""One question's leaderboard put together: systems, bootstrap, ranking, comparisons, label and shift intervals."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from llmrubric.io.rubric import Question
from llmrubric.scoring.leaderboard.comparisons import compare_systems
from llmrubric.scoring.leaderboard.labelled import label_differences, label_intervals
from llmrubric.scoring.leaderboard.ranking import leaderboard
from llmrubric.scoring.leaderboard.resampling import bootstrap
from llmrubric.scoring.leaderboard.shift import rms, with_shift_interval
from llmrubric.scoring.leaderboard.systems import system_data


@dataclass
class LeaderboardResult:
    board: pd.DataFrame
    comparisons: pd.DataFrame
    boot: dict
    systems: list
    settings: dict = field(default_factory=dict)


def build(
    predictions: pd.DataFrame,
    question: Question,
    texts: pd.DataFrame | None = None,
    judges: list[str] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    sample_answers: bool = True,
    labels: pd.Series | None = None,
    band_replicates: int = 200,
    shift_errors: pd.Series | None = None,
    draws: pd.DataFrame | None = None,
    small_sample: str = "student",
    sampling_rule: str | None = None,
    levels: pd.DataFrame | None = None,
) -> LeaderboardResult:
    """Leaderboard, pairwise comparisons, label intervals (:func:`label_intervals`: with human
    ``labels`` drawn uniformly, or the ``draws`` of active sampling, :func:`check_sampling`) and
    (with ``shift_errors``, :func:`read_shift_errors`) shift intervals of one question."""
    from llmrubric.scoring.labels import DESCRIPTIONS

    systems, judges = system_data(predictions, question, texts, judges)
    boot = bootstrap(systems, n_boot, seed, sample_answers, keep_text_scores=band_replicates)
    board = leaderboard(systems, boot, alpha)
    comparisons = compare_systems(systems, boot, alpha)
    label_settings = {}
    if labels is not None or draws is not None:
        board = board.merge(label_intervals(systems, labels, draws, alpha, small_sample), on="system", how="left")
        comparisons = label_differences(board, comparisons, alpha) if len(comparisons) else comparisons
        methods = ["active_ppi_pp"] if draws is not None else ["classical", "ppi", "ppi_pp"]
        label_settings = {
            "label_intervals": {
                "methods": {m: DESCRIPTIONS[m] for m in methods},
                "sampling": sampling_rule
                or ("uniform at random (assumed)" if draws is None else "active, inverse-probability weighted"),
                "k": dict(zip(board.system, board.labelled.astype(int))),
                "alpha": alpha,
                "small_sample": small_sample,
            }
        }
    if shift_errors is not None:
        board = with_shift_interval(board, shift_errors, alpha)
    if levels is not None:  # ranked by the system level (llmrubric.scoring.levels)
        from llmrubric.scoring.levels import with_level_intervals

        board = with_level_intervals(board, levels, systems, labels, alpha, small_sample)
    settings = {
        "question": question.id,
        "judges": judges,
        "bootstrap": n_boot,
        "seed": seed,
        "alpha": alpha,
        "sample_answers": sample_answers,
        **(
            {"shift_systems": len(shift_errors), "shift_rms_error": rms(shift_errors)}
            if shift_errors is not None
            else {}
        ),
        **label_settings,
    }
    return LeaderboardResult(board, comparisons, boot, systems, settings)
