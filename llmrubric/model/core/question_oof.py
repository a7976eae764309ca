"""Out-of-fold predictions of the questions other than the main one by a mixture whose weights are fixed: what
the conformal intervals of those questions are calibrated on (:mod:`llmrubric.model.core.conformal`).

The weights are chosen on the main question alone; the other questions are predicted by the same members with
the same weights (renormalised over the members that predict a question). Their out-of-fold predictions are those
the inner CV made already where a weighted member's fold models predict the question (the network's heads): the
mixture of those members; only a question that no such fold model predicts has the weighted members fitted on
each fold's training texts again (``fold_model``: :func:`llmrubric.model.auto_refit.question_conformals`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from llmrubric.model.core.conformal import Conformal
from llmrubric.model.core.encoding import PAIR, question_targets
from llmrubric.model.core.registry import capabilities

Fitted = Callable[[str, int, list[str]], object]  # (member, fold, questions) → a fold model predicting them, or None


def predicted_questions(model, rubric) -> list[str]:
    """The questions a fitted ``model`` predicts."""
    return list(model.questions_) if capabilities(model).questions else list(rubric.ids)


def other_conformals(rubric, questions: list[str], members: dict, splits: list[tuple], fold_model: Fitted, mixture):
    """Question id → :class:`Conformal` of each of ``questions`` (not the main one) that a held-out fold answers,
    from out-of-fold predictions: ``members`` the final fitted members by name (what each predicts),
    ``fold_model(name, k, questions)`` member ``name``'s model of fold ``k`` for ``questions`` (None: none),
    ``mixture(probs by name)`` the fixed-weight mixture of (pairs, questions, options) probabilities."""
    parts: dict[str, list] = {q: [] for q in questions}
    for k, (_, test) in enumerate(splits):
        targets = {q: question_targets(test, rubric[q]) for q in questions}
        targets = {q: (p[a >= 0].reset_index(drop=True), a[a >= 0]) for q, (p, a) in targets.items() if (a >= 0).any()}
        if not targets:
            continue
        wanted = {name: [q for q in targets if q in predicted_questions(m, rubric)] for name, m in members.items()}
        models = {name: fold_model(name, k, qs) for name, qs in wanted.items() if qs}
        models = {name: m for name, m in models.items() if m is not None}
        held = pd.concat([p for p, _ in targets.values()]).drop_duplicates(PAIR).reset_index(drop=True)
        probs = {n: m.predict_proba(test, held) for n, m in models.items()}  # each held-out pair once
        blank = np.full_like(next(iter(probs.values())), np.nan)  # a member predicting none of these questions
        probs = mixture({n: probs.get(n, blank) for n in members})
        rows_of = pd.MultiIndex.from_frame(held[PAIR])
        for q, (pairs, answers) in targets.items():
            index, options = rubric.ids.index(q), len(rubric[q].options)
            rows = rows_of.get_indexer(pd.MultiIndex.from_frame(pairs[PAIR]))
            parts[q].append((probs[rows, index, :options], answers, pairs))
    out = {}
    for q, folds in parts.items():
        if not folds:
            continue
        probs, answers = np.concatenate([f[0] for f in folds]), np.concatenate([f[1] for f in folds])
        pairs = pd.concat([f[2] for f in folds], ignore_index=True)
        out[q] = Conformal.fit(rubric[q], probs, answers, pairs.text_id.astype(str), pairs.judge_id.astype(str))
    return out
