"""The adaptive rubric (issue 34; LLM-Rubric, Limitations and Appendix B, "Dynamic feature selection").

For one text whose asked blocks gave the columns ``x_O``, the target is ŷ0, the main question's
expected answer averaged over the target judges. Its variance given ``x_O`` comes from the blocks
not asked yet; asking block b is expected to remove ``Var(E[ŷ0 | x_O, x_b])`` of it (the law of total
variance). :class:`Selector` estimates that for every unasked block at once from ``draws`` joint
completions of the unasked columns drawn by the fitted model's answer model
(:class:`llmrubric.model.core.answers.AnswerModel`): ŷ0 of each completion, regressed per text on the
drawn columns of each block (and their squares) over the draws; the explained variance, adjusted
for the regressors, is the block's expected reduction. The next block is the one with the largest
reduction per unit cost; a text stops at ``budget`` blocks, when the best reduction per unit cost is
below ``min_gain``, or when nothing is left to ask (:class:`llmrubric.config.AdaptiveConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from llmrubric.config import AdaptiveConfig
from llmrubric.config.extract import adaptive_settings
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables
from llmrubric.model.core.absent import MAX_ROWS, CompletionBatch, answer_model, batch_of
from llmrubric.model.core.columns import block_columns


class Selector:
    """Chooses each text's next block for a fitted model that carries an answer model (``answers_``).

    The state of a set of texts is a :class:`llmrubric.model.core.absent.CompletionBatch` whose pairs are
    each text with every target judge (``settings["judges"]``, default every judge of the model) and
    whose absent blocks are those not asked: :meth:`empty` (nothing asked; extraction) or
    :meth:`batch_of` (a features table, for simulations that hide blocks with ``batch.hide``).
    """

    def __init__(self, model, settings: dict | AdaptiveConfig | None = None):
        self.settings = adaptive_settings(settings)
        self.model, self.answers = model, answer_model(model)
        self.rubric, self.blocks = model.rubric, tuple(self.answers.layout.blocks)
        self.column_block = np.asarray(self.answers.column_block)
        self.block_columns = [np.flatnonzero(self.column_block == b) for b in range(len(self.blocks))]
        sizes = [len(b.options) for b in self.blocks]
        self.block_starts = np.cumsum([0, *sizes[:-1]])
        known = [str(j) for j in model.judges_.judges]
        judges = [str(j) for j in self.settings["judges"] or known]
        unknown = [j for j in judges if j not in known]
        if unknown:
            raise InputError(
                f"judge(s) {unknown} are not in the calibrator (it knows {known})", setting="adaptive.judges"
            )
        self.judges = judges
        main = self.rubric.main
        if not main.ordered:
            raise InputError(
                f"the main question {main.id} is categorical: it has no score to select for", setting="--calibrator"
            )
        self.q_index, self.values = self.rubric.ids.index(main.id), np.asarray(main.values, dtype=float)

    def pairs(self, text_ids: list[str]) -> pd.DataFrame:
        """Every text with every target judge."""
        return pd.DataFrame(
            {
                "text_id": np.repeat(np.asarray(text_ids, dtype=object), len(self.judges)),
                "judge_id": np.tile(np.asarray(self.judges, dtype=object), len(text_ids)),
                "system_id": None,
                "round": "1",
            }
        )

    def empty(self, text_ids: list[str]) -> CompletionBatch:
        """The state of ``text_ids`` with nothing asked."""
        n, n_blocks = len(text_ids), len(self.blocks)
        dim = int(self.block_starts[-1]) + len(self.blocks[-1].options) + n_blocks
        pairs = self.pairs(text_ids)
        return CompletionBatch(
            self.answers,
            list(text_ids),
            np.full((n, len(self.column_block)), np.nan),
            np.zeros((n, dim), dtype=np.float32),
            np.ones((n, n_blocks), dtype=bool),
            pairs,
            np.repeat(np.arange(n), len(self.judges)),
        )

    def batch_of(self, tables: Tables) -> CompletionBatch:
        """The state of every text of ``tables.features`` with every block it has."""
        return batch_of(self.model, tables, self.pairs(sorted(tables.features.text_id.unique())))

    def observe(self, batch: CompletionBatch, row: int, block: int, probs: dict) -> CompletionBatch:
        """``batch`` with ``block`` of text ``row`` answered with the option probabilities ``probs``."""
        b = self.blocks[block]
        p = np.array([float(probs[o]) for o in b.options])
        x, columns, absent = batch.x.copy(), batch.columns.copy(), batch.absent.copy()
        start = self.block_starts[block]
        x[row, start : start + len(p)] = p
        x[row, x.shape[1] - len(self.blocks) + block] = 1.0
        columns[row, self.block_columns[block]] = block_columns(b, p[None], self.rubric)[0]
        absent[row, block] = False
        return replace(batch, x=x, columns=columns, absent=absent)

    def target(self, batch: CompletionBatch, completions: np.ndarray) -> np.ndarray:
        """(texts, draws) ŷ0 of each completion (texts, draws, columns): the target judges' mean expected answer."""
        per_text = max(1, MAX_ROWS // (completions.shape[1] * len(self.judges)))
        out = np.empty(completions.shape[:2])
        k = len(self.values)
        for lo in range(0, len(batch.texts), per_text):
            rows = np.arange(lo, min(lo + per_text, len(batch.texts)))
            sub = batch.take(rows)
            probs = self.model.proba_completed(sub, completions[rows])  # (draws, pairs, questions, options)
            means = probs[:, :, self.q_index, :k] @ self.values  # (draws, pairs)
            counts = np.bincount(sub.pair_text, minlength=len(rows))
            sums = np.zeros((means.shape[0], len(rows)))
            np.add.at(sums.T, sub.pair_text, means.T)
            out[rows] = (sums / counts).T
        return out

    def gains(self, batch: CompletionBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(texts, blocks) expected reduction of Var(ŷ0) by asking each block (0 where asked), and (texts,)
        the mean and variance of ŷ0 given the asked blocks (over the answer model's completions)."""
        completions = self.answers.sample(batch.columns, self.settings["draws"], seed=self.settings["seed"])
        f = self.target(batch, completions)
        return explained_variance(f, completions, self.block_columns), f.mean(axis=1), f.var(axis=1, ddof=1)

    def choose(
        self, batch: CompletionBatch, askable: np.ndarray, asked: np.ndarray, costs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each text's next block (-1: stop) and its expected reduction per unit cost (the best one's when stopping)."""
        best, ratio = best_blocks(self.gains(batch)[0], askable, costs)
        stop = (best < 0) | (ratio < self.settings["min_gain"])
        if self.settings["budget"] is not None:
            stop |= asked >= self.settings["budget"]
        return np.where(stop, -1, best), ratio

    def stop_reason(self, asked: int, ratio: float, askable: np.ndarray) -> str:
        budget = self.settings["budget"]
        if not askable.any():
            return "every askable block asked"
        if budget is not None and asked >= budget:
            return f"budget of {budget} calls reached"
        return f"expected reduction per unit cost {ratio:.3g} below min_gain {self.settings['min_gain']:g}"


def best_blocks(gain: np.ndarray, askable: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(texts,) the askable block with the largest ``gain / costs`` (-1 where none is askable) and that ratio (0 there)."""
    ratio = np.where(askable, gain / costs, -np.inf)
    best = ratio.argmax(axis=1)
    best_ratio = ratio[np.arange(len(best)), best]
    none = ~askable.any(axis=1)
    return np.where(none, -1, best), np.where(none, 0.0, best_ratio)


def explained_variance(f: np.ndarray, completions: np.ndarray, block_columns: list[np.ndarray]) -> np.ndarray:
    """(texts, blocks) variance of ``f`` (texts, draws) explained by a least-squares fit on each block's
    drawn columns and their squares, adjusted for the number of regressors (never below 0)."""
    n_texts, draws = f.shape
    total = f.var(axis=1, ddof=1)
    centred = f - f.mean(axis=1, keepdims=True)
    out = np.zeros((n_texts, len(block_columns)))
    for b, cols in enumerate(block_columns):
        x = completions[:, :, cols]
        design = np.concatenate([x, x**2], axis=2)
        design = design - design.mean(axis=1, keepdims=True)
        scale = design.std(axis=1, keepdims=True)
        design = np.divide(design, scale, out=np.zeros_like(design), where=scale > 1e-12)
        coef = np.linalg.pinv(design) @ centred[:, :, None]  # (texts, regressors, 1)
        fitted = (design @ coef)[:, :, 0]
        r2 = np.divide(fitted.var(axis=1, ddof=1), total, out=np.zeros(n_texts), where=total > 0)
        p = design.shape[2]
        adjusted = 1 - (1 - r2) * (draws - 1) / max(draws - p - 1, 1)
        out[:, b] = np.clip(adjusted, 0, 1) * total
    return out


@dataclass
class Reveal:
    """A simulated greedy selection on texts with known answers (:func:`reveal_orders`).

    Attributes:
        order: (texts, steps) the block asked at each step, -1 after a text's last.
        ratio: (texts, steps) the best expected reduction per unit cost when each step was chosen: the
            stop rule with ``min_gain`` g stops before the first step whose ratio is below g.
        score: (texts, steps + 1) ŷ0 given the first s blocks (the mean over the completions).
        variance: (texts, steps + 1) Var(ŷ0) given the first s blocks.
        askable: (texts,) the blocks each text could ask.
    """

    order: np.ndarray
    ratio: np.ndarray
    score: np.ndarray
    variance: np.ndarray
    askable: np.ndarray

    def calls(self, min_gain: float) -> np.ndarray:
        """(texts,) blocks each text asks under the stop rule ``min_gain`` (within the simulated steps)."""
        below = (self.ratio < min_gain) | (self.order < 0)
        return np.where(below.any(axis=1), below.argmax(axis=1), self.order.shape[1])


def reveal_orders(selector: Selector, full: CompletionBatch, costs: np.ndarray | None = None) -> Reveal:
    """Simulate the greedy selection on the texts of ``full`` (a batch with every block they have; the
    askable blocks are those not absent in it), whatever ``min_gain``: to ``budget`` blocks or every
    askable block."""
    askable = ~full.absent
    steps = int(askable.sum(axis=1).max())
    if selector.settings["budget"] is not None:
        steps = min(steps, selector.settings["budget"])
    costs = np.ones(askable.shape) if costs is None else costs
    revealed = np.zeros(askable.shape, dtype=bool)
    order, ratio = np.full((len(askable), steps), -1), np.zeros((len(askable), steps))
    score, variance = np.zeros((len(askable), steps + 1)), np.zeros((len(askable), steps + 1))
    for step in range(steps + 1):
        gain, score[:, step], variance[:, step] = selector.gains(full.hide(~revealed))
        if step == steps:
            break
        order[:, step], ratio[:, step] = best_blocks(gain, askable & ~revealed, costs)
        rows = np.flatnonzero(order[:, step] >= 0)
        revealed[rows, order[rows, step]] = True
    return Reveal(order, ratio, score, variance, askable.sum(axis=1))
