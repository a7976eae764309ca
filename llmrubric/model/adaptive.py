"""The adaptive rubric (issue 34; LLM-Rubric, Limitations and Appendix B, "Dynamic feature selection").

For one text whose asked blocks gave the columns ``x_O``, the target is ŷ0, the main question's
expected answer averaged over the target judges. Its variance given ``x_O`` comes from the blocks
not asked yet; asking block b is expected to remove ``Var(E[ŷ0 | x_O, x_b])`` of it (the law of total
variance). :class:`Selector` estimates that for every unasked block at once from ``draws`` joint
completions of the unasked columns drawn by the fitted model's answer model
(:class:`llmrubric.model.answers.AnswerModel`): ŷ0 of each completion, regressed per text on the
drawn columns of each block (and their squares) over the draws; the explained variance, adjusted
for the regressors, is the block's expected reduction. The next block is the one with the largest
reduction per unit cost; a text stops at ``budget`` blocks, when the best reduction per unit cost is
below ``min_gain``, or when nothing is left to ask (:class:`llmrubric.config.AdaptiveConfig`).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from llmrubric.config import AdaptiveConfig
from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_range
from llmrubric.model.absent import batch_for_texts
from llmrubric.model.columns import block_columns

COSTS = ("calls", "tokens")


def adaptive_settings(settings: dict | AdaptiveConfig | None = None, prefix: str = "adaptive") -> dict:
    """:class:`AdaptiveConfig`'s defaults under ``settings``, checked; a bad value names ``<prefix>.<key>``."""
    given = asdict(settings) if isinstance(settings, AdaptiveConfig) else dict(settings or {})
    unknown = sorted(set(given) - set(asdict(AdaptiveConfig())))
    if unknown:
        raise InputError(f"unknown adaptive setting(s) {unknown}", setting=f"{prefix}.{unknown[0]}")
    s = {**asdict(AdaptiveConfig()), **given}
    if s["budget"] is not None:
        s["budget"] = check_range(f"{prefix}.budget", s["budget"], 1, integer=True)
    s["min_gain"] = check_range(f"{prefix}.min_gain", s["min_gain"], 0)
    s["draws"] = check_range(f"{prefix}.draws", s["draws"], 4, integer=True)
    if s["cost"] not in COSTS:
        raise InputError(f"{s['cost']!r} is not one of {list(COSTS)}", setting=f"{prefix}.cost")
    return s


class Selector:
    """Chooses each text's next block for a fitted model that carries an answer model (``answers_``).

    Columns are those of :func:`llmrubric.model.columns.text_columns` in the model's layout, NaN where
    a block is not asked. ``judges``: the target judges (default: every judge of the model).
    """

    def __init__(self, model, settings: dict | AdaptiveConfig | None = None):
        if getattr(model, "answers_", None) is None:
            raise InputError("the calibrator has no answer model (train it again with this version)", setting="--calibrator")
        self.settings = adaptive_settings(settings)
        self.model, self.answers = model, model.answers_
        self.rubric, self.blocks = model.rubric, tuple(model.layout_.blocks)
        self.column_block = np.asarray(self.answers.column_block)
        self.block_columns = [np.flatnonzero(self.column_block == b) for b in range(len(self.blocks))]
        known = [str(j) for j in model.judges_.judges]
        judges = [str(j) for j in self.settings["judges"] or known]
        unknown = [j for j in judges if j not in known]
        if unknown:
            raise InputError(f"judge(s) {unknown} are not in the calibrator (it knows {known})", setting="adaptive.judges")
        self.judges = judges
        main = self.rubric.main
        if not main.ordered:
            raise InputError(f"the main question {main.id} is categorical: it has no score to select for", setting="--calibrator")
        self.q_index, self.values = self.rubric.ids.index(main.id), np.asarray(main.values, dtype=float)

    def empty_columns(self, n_texts: int) -> np.ndarray:
        return np.full((n_texts, len(self.column_block)), np.nan)

    def observe(self, row: np.ndarray, block: int, probs: dict) -> np.ndarray:
        """``row`` (one text's columns) with ``block``'s columns set from its option probabilities ``probs``."""
        b = self.blocks[block]
        p = np.array([[float(probs[o]) for o in b.options]])
        out = row.copy()
        out[self.block_columns[block]] = block_columns(b, p, self.rubric)[0]
        return out

    def target(self, completions: np.ndarray) -> np.ndarray:
        """(texts, draws) ŷ0 of each completion (texts, draws, columns): the target judges' mean expected answer."""
        n_texts = completions.shape[0]
        batch = batch_for_texts(self.model, n_texts, self.judges)
        probs = self.model.proba_completed(batch, completions)  # (draws, pairs, questions, options)
        k = len(self.values)
        means = probs[:, :, self.q_index, :k] @ self.values  # (draws, pairs)
        by_text = means.reshape(means.shape[0], n_texts, len(self.judges)).mean(axis=2)
        return by_text.T

    def gains(self, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(texts, blocks) expected reduction of Var(ŷ0) by asking each block (0 where asked) and (texts,)
        Var(ŷ0) given the asked blocks."""
        completions = self.answers.sample(columns, self.settings["draws"], seed=self.settings["seed"])
        f = self.target(completions)
        return explained_variance(f, completions, self.block_columns), f.var(axis=1, ddof=1)

    def choose(
        self, columns: np.ndarray, askable: np.ndarray, asked: np.ndarray, costs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each text's next block (-1: stop) and its expected reduction per unit cost (the best one's when stopping)."""
        gain, _ = self.gains(columns)
        ratio = np.where(askable, gain / costs, -np.inf)
        best = ratio.argmax(axis=1)
        best_ratio = ratio[np.arange(len(best)), best]
        budget = self.settings["budget"]
        stop = ~askable.any(axis=1) | (best_ratio < self.settings["min_gain"])
        if budget is not None:
            stop |= asked >= budget
        return np.where(stop, -1, best), np.where(np.isfinite(best_ratio), best_ratio, 0.0)

    def stop_reason(self, asked: int, ratio: float, askable: np.ndarray) -> str:
        budget = self.settings["budget"]
        if not askable.any():
            return "every askable block asked"
        if budget is not None and asked >= budget:
            return f"budget of {budget} calls reached"
        return f"expected reduction per unit cost {ratio:.3g} below min_gain {self.settings['min_gain']:g}"


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


def reveal_orders(selector: Selector, truth: np.ndarray, askable: np.ndarray, costs: np.ndarray | None = None):
    """Simulate the greedy selection on texts whose every askable block's columns ``truth`` holds:
    (texts, steps) block asked at each step (-1 after the last) and (texts, steps) the best expected
    reduction per unit cost when each step was chosen (the stop rule with ``min_gain`` g stops before the
    first step whose ratio is below g). Runs to ``budget`` blocks, or every askable block; ignores ``min_gain``."""
    settings = {**selector.settings, "min_gain": 0.0}
    steps = int(askable.sum(axis=1).max()) if settings["budget"] is None else settings["budget"]
    costs = np.ones(askable.shape) if costs is None else costs
    columns, left = selector.empty_columns(len(truth)), askable.copy()
    order = np.full((len(truth), steps), -1)
    ratios = np.zeros((len(truth), steps))
    saved, selector.settings = selector.settings, settings
    try:
        for step in range(steps):
            choice, ratio = selector.choose(columns, left, np.full(len(truth), step), costs)
            for row in np.flatnonzero(choice >= 0):
                b = choice[row]
                cols = selector.block_columns[b]
                columns[row, cols] = truth[row, cols]
                left[row, b] = False
            order[:, step], ratios[:, step] = choice, np.where(choice >= 0, ratio, 0.0)
    finally:
        selector.settings = saved
    return order, ratios
