"""One question's leaderboard put together: systems, bootstrap, ranking, comparisons, label and shift intervals."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from llmrubric.io.rubric import Question
from llmrubric.scoring.leaderboard.comparisons import compare_systems
from llmrubric.scoring.leaderboard.labelled import label_differences, label_intervals, label_rank_intervals
from llmrubric.scoring.leaderboard.ranking import RANK_METHOD, leaderboard
from llmrubric.scoring.leaderboard.resampling import bootstrap
from llmrubric.scoring.leaderboard.shift import rms, with_shift_interval
from llmrubric.scoring.leaderboard.systems import system_data
from llmrubric.scoring.ranks import rank_intervals


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
    transport=None,
) -> LeaderboardResult:
    """Leaderboard, pairwise comparisons, label intervals (:func:`label_intervals`: with human
    ``labels`` drawn uniformly, or the ``draws`` of active sampling, :func:`check_sampling`) and
    (with ``shift_errors``, :func:`read_shift_errors`) shift intervals of one question.

    Rank intervals, joint over the K systems at 1 − alpha: ``rank_low, rank_high`` from the max-t intervals of the
    bootstrap replicates (:func:`leaderboard`); with ``levels`` the board ranks by level and they come from the
    level intervals at alpha / K (Bonferroni: the replicates do not carry the level); with ``shift_errors`` also
    ``shift_rank_low, shift_rank_high`` from the shift intervals at alpha / K (:func:`with_shift_interval`); with
    labels (or draws) also ``label_rank_low, label_rank_high``, the ranks of the human means from the PPI++ (active
    PPI++) intervals at alpha / K (:func:`label_rank_intervals`). With ``levels``, ``labels`` and ``transport``
    (:class:`llmrubric.scoring.transport.TransportSettings`) each labelled new system's level is checked against its
    labels, and a FAIL or INCONCLUSIVE replaces its level interval (:func:`llmrubric.scoring.levels.with_level_intervals`)."""
    from llmrubric.scoring.labels import DESCRIPTIONS

    systems, judges = system_data(predictions, question, texts, judges)
    boot = bootstrap(systems, n_boot, seed, sample_answers, keep_text_scores=band_replicates)
    board = leaderboard(systems, boot, alpha)
    comparisons = compare_systems(systems, boot, alpha)
    label_settings = {}
    ranks = {"rank": RANK_METHOD}
    if labels is not None or draws is not None:
        board = board.merge(label_intervals(systems, labels, draws, alpha, small_sample), on="system", how="left")
        board = board.merge(label_rank_intervals(systems, labels, draws, alpha, small_sample), on="system", how="left")
        method = "the active PPI++" if draws is not None else "the PPI++"
        ranks["label_rank"] = f"Bonferroni: {method} intervals at alpha / K; fewer than 2 labels: any rank"
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
        ranks["shift_rank"] = "Bonferroni: the shift intervals at alpha / K"
    if levels is not None:  # ranked by the system level (llmrubric.scoring.levels)
        board, check = level_board(board, levels, systems, labels, alpha, small_sample, transport)
        ranks["rank"] = "Bonferroni: the level intervals at alpha / K"
        label_settings.update(check)
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
        "rank_intervals": {**ranks, "alpha": alpha, "systems": len(systems)},
        **label_settings,
    }
    return LeaderboardResult(board, comparisons, boot, systems, settings)


def level_board(board, levels, systems, labels, alpha, small_sample, transport) -> tuple[pd.DataFrame, dict]:
    """``board`` ranked by level with its intervals and ranks, and the transport check's settings and verdicts."""
    from llmrubric.scoring.levels import with_level_intervals

    checked = transport if labels is not None else None
    joint = with_level_intervals(board, levels, systems, labels, alpha / len(systems), small_sample, checked)
    board = level_ranks(with_level_intervals(board, levels, systems, labels, alpha, small_sample, checked), joint)
    if checked is None:
        return board, {}
    verdicts = board.set_index("system").get("transport", pd.Series(dtype=object)).dropna()
    return board, {"transport_check": {"rule": checked.describe(), "verdicts": verdicts.to_dict()}}


def level_ranks(board: pd.DataFrame, joint: pd.DataFrame) -> pd.DataFrame:
    """``board`` with ``rank_low, rank_high`` from the level intervals of ``joint`` (the board at alpha / K)."""
    joint = joint.set_index("system").reindex(board.system)
    rank_low, rank_high = rank_intervals(joint.level_low, joint.level_high)
    return board.assign(rank_low=rank_low, rank_high=rank_high)
