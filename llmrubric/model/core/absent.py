"""Predictions from any subset of feature blocks: absent blocks are marginalised with the answer model.

A block is absent for a text when the features table has no row of that (source, question) for it.
A text with every block is predicted as it always was. A text with absent blocks gets the average of
the family's predictions over :data:`DRAWS` completions of its blocks, the present ones kept and the
absent ones drawn from the family's answer model (:class:`llmrubric.model.core.answers.AnswerModel`) given
the present ones. Every family implements ``proba_completed(batch, completions)``: its predictions
for each completion of a :class:`CompletionBatch`, vectorised on its own encoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.core.answers import AnswerModel
from llmrubric.model.core.encoding import FeatureLayout, pairs_of
from llmrubric.model.core.memo import memoised
from llmrubric.model.core.registry import capabilities

DRAWS = 64  # completions averaged per text with absent blocks
SEED = 0  # of the completions' quasi-random draws: predictions are deterministic
MAX_ROWS = 262144  # completions × pairs predicted at once


@dataclass(frozen=True)
class CompletionBatch:
    """Some texts' blocks, encoded once, and the pairs to predict.

    Attributes:
        answers: the family's answer model.
        texts: (T,) text ids.
        columns: (T, C) the answer model's columns; NaN where absent.
        x: (T, probabilities + flags) the texts' blocks as the network reads them (zeros where absent).
        absent: (T, blocks) bool: the blocks to complete.
        pairs: (P) the (text, judge, round) pairs; ``pair_text`` (P,) their row in ``texts``.
    """

    answers: AnswerModel
    texts: list[str]
    columns: np.ndarray
    x: np.ndarray
    absent: np.ndarray
    pairs: pd.DataFrame
    pair_text: np.ndarray

    def hide(self, mask: np.ndarray) -> CompletionBatch:
        """The batch with the blocks of ``mask`` (T, blocks) absent too (e.g. not asked yet)."""
        absent = self.absent | np.asarray(mask, dtype=bool)
        columns = np.where(absent[:, self.answers.column_block], np.nan, self.columns)
        return replace(self, columns=columns, absent=absent)

    def take(self, rows: np.ndarray) -> CompletionBatch:
        """The texts at ``rows`` and their pairs."""
        rows = np.asarray(rows, dtype=np.int64)
        new_row = np.full(len(self.texts), -1)
        new_row[rows] = np.arange(len(rows))
        keep = np.flatnonzero(new_row[self.pair_text] >= 0)
        return CompletionBatch(
            self.answers,
            [self.texts[r] for r in rows],
            self.columns[rows],
            self.x[rows],
            self.absent[rows],
            self.pairs.iloc[keep].reset_index(drop=True),
            new_row[self.pair_text[keep]],
        )

    def pair_columns(self, completions: np.ndarray) -> np.ndarray:
        """(D, P, C) each pair's completed columns from ``completions`` (T, D, C)."""
        return completions[self.pair_text].transpose(1, 0, 2)

    def rows_proba(self, completions: np.ndarray, judges, proba_rows) -> np.ndarray:
        """(D, P, questions, max options) of a family that predicts rows of columns with judge indices:
        ``proba_rows(columns (D·P, C), judge (D·P,))`` on every pair's completed columns; ``judges``: its :class:`JudgeMap`."""
        columns = self.pair_columns(completions)
        draws, n_pairs = columns.shape[:2]
        judge = np.tile(judges.indices(self.pairs.judge_id), draws)
        out = proba_rows(columns.reshape(draws * n_pairs, -1), judge)
        return out.reshape(draws, n_pairs, *out.shape[1:])

    def network_inputs(self, completions: np.ndarray) -> np.ndarray:
        """(D, P, probabilities + flags) float32: ``x`` with every absent block filled by its
        completed column mapped to probabilities (:meth:`AnswerModel.distributions`), flag 1."""
        answers, draws = self.answers, completions.shape[1]
        x = np.repeat(self.x[:, None], draws, axis=1)
        sizes = [len(b.options) for b in answers.layout.blocks]
        starts, n_probs = np.cumsum([0, *sizes[:-1]]), sum(sizes)
        for b, k in enumerate(sizes):
            rows = np.flatnonzero(self.absent[:, b])
            if not len(rows):
                continue
            values = completions[rows][:, :, answers.column_block == b].reshape(len(rows) * draws, -1)
            probs = answers.distributions(b, values).reshape(len(rows), draws, k)
            x[rows, :, starts[b] : starts[b] + k] = probs
            x[rows, :, n_probs + b] = 1.0
        return x[self.pair_text].transpose(1, 0, 2).astype(np.float32)


def batch_of(model, tables: Tables, pairs: pd.DataFrame | None = None) -> CompletionBatch:
    """The :class:`CompletionBatch` of ``pairs`` (default: the annotated pairs of ``tables``) for ``model``."""
    answers = answer_model(model)
    pairs = (pairs_of(tables.annotations) if pairs is None else pairs).reset_index(drop=True)
    texts = sorted(pairs.text_id.unique())
    missing = sorted(set(texts) - set(tables.features.text_id.unique()))
    if missing:
        raise InputError(
            f"{len(missing)} texts have no features (first: {missing[0]!r})",
            file=source_of(tables.features),
            column="text_id",
        )
    x = answers.layout.matrix(tables.features, texts, absent_ok=True)
    n_probs = x.shape[1] - answers.n_blocks
    return CompletionBatch(
        answers,
        texts,
        answers.columns(tables.features, texts),
        x,
        x[:, n_probs:] == 0,
        pairs,
        pd.Index(texts).get_indexer(pairs.text_id),
    )


def answer_model(model) -> AnswerModel:
    """``model``'s answer model (capability ``absent_blocks``); an :class:`InputError` when it has none."""
    if not capabilities(model).absent_blocks:
        raise InputError(f"a {type(model).__name__} does not predict texts lacking feature blocks")
    if model.answers_ is None:
        raise InputError(
            "this model has no answer model (saved before absent blocks were marginalised); retrain it",
            file=model.source_,
        )
    return model.answers_


def partial_texts(answers: AnswerModel, features: pd.DataFrame, texts: list[str]) -> list[str]:
    """The ``texts`` that lack a row of some block of ``answers.layout``."""
    return list(_partial_texts(answers.layout, features, texts))


@memoised
def _partial_texts(layout: FeatureLayout, features: pd.DataFrame, texts: list[str]) -> tuple[str, ...]:
    """:func:`partial_texts` of a layout (within a fit, every model of one layout asks it of the same tables)."""
    rows = features[features.text_id.isin(texts)][["text_id", "source", "question_id"]].drop_duplicates()
    names = pd.MultiIndex.from_tuples([(b.source, b.question_id) for b in layout.blocks])
    rows = rows[names.get_indexer(pd.MultiIndex.from_frame(rows[["source", "question_id"]])) >= 0]
    counts = rows.groupby("text_id").size()
    return tuple(t for t in texts if counts.get(t, 0) < len(layout.blocks))


def marginal_proba(
    model,
    tables: Tables,
    pairs: pd.DataFrame,
    whole: Callable[[pd.DataFrame], np.ndarray] | None = None,
    completed: Callable[[CompletionBatch, np.ndarray], np.ndarray] | None = None,
) -> np.ndarray | None:
    """``model``'s predictions (pairs, ...) of ``pairs`` when some of their texts lack blocks, else None.

    Pairs of texts with every block get ``whole(pairs)`` (default ``model.predict_proba(tables,
    pairs)``: the family's own path), the others the mean over :data:`DRAWS` completions of
    ``completed(batch, completions)`` (default ``model.proba_completed``). A model without an answer
    model (an old checkpoint) gives None: it keeps its old filling."""
    answers = model.answers_  # a family of capability absent_blocks calls this
    if answers is None:
        return None
    pairs = pairs.reset_index(drop=True)
    partial = partial_texts(answers, tables.features, sorted(pairs.text_id.unique()))
    if not partial:
        return None
    whole = whole or (lambda p: model.predict_proba(tables, p))
    completed = completed or model.proba_completed
    is_partial = pairs.text_id.isin(partial).to_numpy()
    batch = batch_of(model, tables, pairs[is_partial])
    marginal = None
    chunks = np.cumsum(np.bincount(batch.pair_text, minlength=len(batch.texts)) * DRAWS) // MAX_ROWS
    for chunk in np.unique(chunks):
        texts = np.flatnonzero(chunks == chunk)
        sub = batch.take(texts)
        mean = completed(sub, answers.sample(sub.columns, DRAWS, SEED)).mean(axis=0)
        if marginal is None:
            marginal = np.full((len(batch.pairs), *mean.shape[1:]), np.nan)
        marginal[np.isin(batch.pair_text, texts)] = mean
    out = np.full((len(pairs), *marginal.shape[1:]), np.nan)
    out[is_partial] = marginal
    if not is_partial.all():
        out[~is_partial] = whole(pairs[~is_partial])
    return out
