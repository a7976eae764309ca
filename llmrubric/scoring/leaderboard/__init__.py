"""System leaderboards from calibrated predictions, with uncertainty (LLM-Rubric Appendix A).

A system's score is the mean over its texts of the judge-free score ŷ(T) = mean over the
trusted judges A of the expected answer ŷ^a(T). Its 95 % interval comes from a bootstrap
that, in every replicate, resamples the judges A (shared by all systems, so that
differences are paired by judge), resamples each system's texts, and replaces each
ŷ^a(T) by an answer drawn from the predicted distribution p̂_a(y | T). The same replicates
give intervals on differences between systems, the ranks each system can hold (joint over all systems)
and the density bands of the plot.

Also: paired tests between systems (by ``query_id`` where texts share queries, else
unpaired), classical, PPI and PPI++ intervals of system means and of their differences when
some texts have human labels (:mod:`llmrubric.scoring.labels`, through ``ppi_py``; active
PPI++ when the labelled texts were drawn by ``llmrubric label suggest``) and the ranks of the
human means they allow, rank correlations between leaderboards, and shift intervals that
widen each score by the errors a leave-one-system-out run measured on held-out systems
(:func:`shift_half_width`, :mod:`llmrubric.evaluation.transfer`).

One module per job: ``systems`` (predictions → per-system arrays, checked), ``resampling`` (the
bootstrap, percentile and simultaneous max-t intervals), ``ranking`` (the order of the systems, their intervals
and rank intervals, :func:`leaderboard`), ``comparisons`` (tests between systems), ``human`` (human answers as labels and
scores), ``labelled`` (label-based intervals), ``shift`` (shift intervals), ``correlation`` (rank
correlation of two leaderboards), ``reading`` and ``writing`` (the files), ``plots`` (the density
plot) and ``board`` (:func:`build`, all of it for one question). Every name is importable from
``llmrubric.scoring.leaderboard``.
"""

from llmrubric.scoring.leaderboard.board import LeaderboardResult, build
from llmrubric.scoring.leaderboard.comparisons import compare_systems, holm
from llmrubric.scoring.leaderboard.correlation import rank_correlation
from llmrubric.scoring.leaderboard.human import (
    check_labelled_texts,
    human_labels,
    human_labels_by_round,
    human_leaderboard,
)
from llmrubric.scoring.leaderboard.labelled import (
    check_sampling,
    label_differences,
    label_intervals,
    label_rank_intervals,
)
from llmrubric.scoring.leaderboard.plots import density_plot
from llmrubric.scoring.leaderboard.ranking import leaderboard
from llmrubric.scoring.leaderboard.reading import (
    read_leaderboard,
    read_predictions,
    read_shift_errors,
    read_system_values,
)
from llmrubric.scoring.leaderboard.resampling import MEMORY_CELLS, bootstrap, interval, simultaneous_intervals
from llmrubric.scoring.leaderboard.shift import rms, shift_half_width, with_shift_interval
from llmrubric.scoring.leaderboard.systems import SUM_TOLERANCE, SystemData, check_distributions, system_data
from llmrubric.scoring.leaderboard.writing import LABEL_HEADS, markdown, rank_range, write

__all__ = [
    "LABEL_HEADS",
    "MEMORY_CELLS",
    "SUM_TOLERANCE",
    "LeaderboardResult",
    "SystemData",
    "bootstrap",
    "build",
    "check_distributions",
    "check_labelled_texts",
    "check_sampling",
    "compare_systems",
    "density_plot",
    "holm",
    "human_labels",
    "human_labels_by_round",
    "human_leaderboard",
    "interval",
    "label_differences",
    "label_intervals",
    "label_rank_intervals",
    "leaderboard",
    "markdown",
    "rank_correlation",
    "rank_range",
    "read_leaderboard",
    "read_predictions",
    "read_shift_errors",
    "read_system_values",
    "rms",
    "shift_half_width",
    "simultaneous_intervals",
    "system_data",
    "with_shift_interval",
    "write",
]
