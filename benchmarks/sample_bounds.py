"""How many samples any adaptive stop could save on a set (issue 58), from its logprob blocks alone: the bound that
``benchmarks/samples.py`` sets beside the measured stops.

Sampling block ``b`` n_b times leaves a squared error of about spread_b² / n_b in its features. Fixed k leaves
sum spread² / k; the allocation that leaves the same error for the fewest answers is Neyman's, n_b ~ spread_b, and it
saves ``1 - mean(spread)² / mean(spread²)`` of fixed k's answers. No rule that sees one block at a time does better
(it does not know the spreads; it must estimate them from its own answers). Where the score weighs blocks
unequally (weight w_b: how much the main question's calibrated answer moves with the block's expected answer),
n_b ~ w_b spread_b saves ``1 - mean(w spread)² / mean((w spread)²)``: what a stop that knows the calibrator could
save. The weights here are a ridge of the main question's mean human answer on every block's expected answer, fitted
on all texts: a figure to report, not one that decides anything.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.extract.tolerance_weights import block_spreads, ridge_weights
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables

__all__ = ["block_spreads", "bounds", "neyman_saving", "score_weights"]


def neyman_saving(spread: np.ndarray) -> float:
    """The share of fixed k's answers that n_b ~ spread_b saves at the same summed squared error."""
    spread = np.asarray(spread, dtype=float)
    return float(1.0 - spread.mean() ** 2 / (spread**2).mean())


def score_weights(blocks: pd.DataFrame, tables: Tables, rubric: Rubric) -> pd.Series:
    """Per (source, question): |d main answer / d expected answer| of a ridge of the main question's mean human
    answer on the blocks' expected answers, not normalised (:func:`llmrubric.extract.tolerance_weights.ridge_weights`)."""
    return ridge_weights(blocks, tables, rubric)


def bounds(tables: Tables, rubric: Rubric) -> dict:
    """The set's two bounds on the samples an adaptive stop saves at equal error (module doc), and how sure its
    judges are: the median share of a block's likeliest option."""
    features = tables.features.reset_index(drop=True)
    blocks = block_spreads(features)
    prob = features.groupby(["text_id", "source", "question_id"], sort=False)["prob"]
    top = (prob.max() / prob.sum())[prob.size() > 1]
    out = {
        "blocks": len(blocks),
        "median_top_share": float(top.median()),
        "per_block_rule": neyman_saving(blocks["spread"]),
    }
    if blocks["expected"].notna().any():
        weights = score_weights(blocks, tables, rubric)
        w = blocks.set_index(["source", "question_id"]).index.map(lambda k: weights.get(k, 0.0))
        out["weighted_by_the_score"] = neyman_saving(np.asarray(w, dtype=float) * blocks["spread"].to_numpy())
    return out
