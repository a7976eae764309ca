"""What an adaptive rubric costs and gives, simulated on texts whose every block is known (issue 34).

Blocks are revealed in an order per text (the selector's, one fixed order for all texts, or a random
one); after c calls a text's other blocks are absent and its predictions are the model's marginal
over them (:mod:`llmrubric.model.core.absent`). :func:`plan` is what ``llmrubric rubric plan`` prints:
for each budget, the blocks asked and the expected quality, from the features alone (and, given
annotations, the main question's pair NLL and Pearson).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.evaluation.significance import pair_nll, pearson_rows
from llmrubric.io.tables import Tables
from llmrubric.model.adaptive import Reveal, Selector, reveal_orders
from llmrubric.model.core.absent import DRAWS, MAX_ROWS, SEED, CompletionBatch, batch_of
from llmrubric.model.core.encoding import pairs_of, with_round


def masked_proba(model, batch: CompletionBatch, hidden: np.ndarray, draws: int = DRAWS) -> np.ndarray:
    """(pairs, questions, options) ``model``'s predictions of ``batch``'s pairs with the blocks ``hidden``
    (texts, blocks) absent: the mean over ``draws`` completions (a text with no absent block: its own inputs)."""
    batch = batch.hide(hidden)
    per_text = max(1, MAX_ROWS // (draws * max(1, int(np.bincount(batch.pair_text).max()))))
    out = None
    for lo in range(0, len(batch.texts), per_text):
        rows = np.arange(lo, min(lo + per_text, len(batch.texts)))
        sub = batch.take(rows)
        mean = model.proba_completed(sub, batch.answers.sample(sub.columns, draws, SEED)).mean(axis=0)
        if out is None:
            out = np.full((len(batch.pairs), *mean.shape[1:]), np.nan)
        out[np.isin(batch.pair_text, rows)] = mean
    return out


def prefix_hidden(order: np.ndarray, calls: np.ndarray | int, n_blocks: int) -> np.ndarray:
    """(texts, blocks) True for every block not among the first ``calls`` of each text's ``order``."""
    calls = np.broadcast_to(np.asarray(calls), (len(order),))
    hidden = np.ones((len(order), n_blocks), dtype=bool)
    for step in range(order.shape[1]):
        rows = np.flatnonzero((step < calls) & (order[:, step] >= 0))
        hidden[rows, order[rows, step]] = False
    return hidden


class MainQuestion:
    """The main question's answers of a batch's pairs, to score predictions of them."""

    def __init__(self, model, tables: Tables, batch: CompletionBatch):
        main = model.rubric.main
        self.q_index, self.values = model.rubric.ids.index(main.id), np.asarray(main.values, dtype=float)
        ann = with_round(tables.annotations[tables.annotations.question_id == main.id])
        key = ["text_id", "judge_id", "round"]
        answers = batch.pairs[key].astype(str).merge(ann.astype({k: str for k in key}), on=key, how="left")
        self.index = np.array([main.index_of(a) if pd.notna(a) else -1 for a in answers.answer])
        self.labelled = self.index >= 0
        self.pair_text = batch.pair_text

    def per_pair(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(labelled pairs,) NLL and expected answer of the main question."""
        p = probs[self.labelled, self.q_index, : len(self.values)]
        return pair_nll(p, self.index[self.labelled]), p @ self.values

    def figures(self, probs: np.ndarray) -> dict:
        nll, expected = self.per_pair(probs)
        answers = self.values[self.index[self.labelled]]
        return {"pair_nll": float(nll.mean()), "pair_pearson": float(pearson_rows(expected, answers))}

    def nll_by_text(self, probs: np.ndarray, n_texts: int) -> np.ndarray:
        """(texts,) mean NLL of each text's labelled pairs (NaN for a text without any)."""
        nll, _ = self.per_pair(probs)
        rows = self.pair_text[self.labelled]
        sums, counts = np.bincount(rows, nll, n_texts), np.bincount(rows, minlength=n_texts)
        return np.divide(sums, counts, out=np.full(n_texts, np.nan), where=counts > 0)


def greedy_fixed_order(model, tables: Tables, draws: int = 16) -> list[int]:
    """One order of the blocks for every text: each step adds the block whose reveal gives the lowest
    main-question pair NLL on ``tables`` (the training texts), the rest marginalised over ``draws`` completions."""
    batch = batch_of(model, tables, pairs_of(tables.annotations))
    main = MainQuestion(model, tables, batch)
    n_blocks = batch.absent.shape[1]
    order: list[int] = []
    while len(order) < n_blocks:
        nll = {}
        for b in (b for b in range(n_blocks) if b not in order):
            hidden = np.ones((len(batch.texts), n_blocks), dtype=bool)
            hidden[:, [*order, b]] = False
            nll[b] = main.figures(masked_proba(model, batch, hidden, draws))["pair_nll"]
        order.append(min(nll, key=nll.get))
    return order


def plan(selector: Selector, tables: Tables, budgets: list[int] | None = None) -> dict:
    """For each budget (default 1 to every block) the blocks the selector asks and the expected quality
    of ŷ0 from the features alone; with annotations in ``tables``, the main question's pair figures too;
    and the stop rule of the selector's settings."""
    full = selector.batch_of(tables)
    reveal = reveal_orders(selector, full)
    steps = reveal.order.shape[1]
    budgets = sorted(set(budgets or range(1, steps + 1)))
    scored = _Scorer(selector.model, tables, full) if len(tables.annotations) else None
    rows = [_plan_row(selector, reveal, np.minimum(c, steps), f"budget {c}", scored) for c in budgets]
    stop = reveal.calls(selector.settings["min_gain"])
    if selector.settings["budget"] is not None:
        stop = np.minimum(stop, selector.settings["budget"])
    rows.append(_plan_row(selector, reveal, stop, f"stop rule (min_gain {selector.settings['min_gain']:g})", scored))
    return {"texts": len(full.texts), "blocks": [b.name for b in selector.blocks], "rows": rows}


class _Scorer:
    """Pair figures of the main question after some calls per text (labelled pairs only)."""

    def __init__(self, model, tables: Tables, full: CompletionBatch):
        self.model, self.full = model, full
        labelled = batch_of(model, tables, pairs_of(tables.annotations))
        self.batch = labelled
        self.text_row = pd.Index(full.texts).get_indexer(labelled.texts)
        self.main = MainQuestion(model, tables, labelled)

    def figures(self, order: np.ndarray, calls: np.ndarray) -> dict:
        hidden = prefix_hidden(order[self.text_row], calls[self.text_row], self.batch.absent.shape[1])
        return self.main.figures(masked_proba(self.model, self.batch, hidden))


def _plan_row(selector: Selector, reveal: Reveal, calls: np.ndarray, name: str, scored: _Scorer | None) -> dict:
    """One row of :func:`plan`: calls, blocks asked, expected sd of ŷ0 and its agreement with ŷ0 of every block."""
    calls = np.broadcast_to(np.asarray(calls), (len(reveal.order),))
    rows = np.arange(len(calls))
    asked = [reveal.order[r, : calls[r]] for r in rows]
    counts = np.bincount(np.concatenate(asked + [np.zeros(0, dtype=int)]).astype(int), minlength=len(selector.blocks))
    score, final = reveal.score[rows, calls], reveal.score[:, -1]
    row = {
        "rule": name,
        "mean_calls": float(calls.mean()),
        "share_of_calls": float(calls.sum() / max(1, reveal.askable.sum())),
        "asked": {selector.blocks[b].name: int(n) for b, n in enumerate(counts) if n},
        "expected_sd": float(np.sqrt(reveal.variance[rows, calls].mean())),
        "rmse_to_all_blocks": float(np.sqrt(np.mean((score - final) ** 2))),
        "pearson_to_all_blocks": float(pearson_rows(score, final)),
    }
    if scored is not None:
        row.update(scored.figures(reveal.order, calls))
    return row
