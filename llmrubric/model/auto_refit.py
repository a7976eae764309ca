"""``model=auto``'s refit on all the training data once the inner folds have chosen the weights: the weighted
members (those the network's folds trained already taken as they are), the system level of each member with a
levelled part, the ``model.auto.cover`` member for questions no weighted member predicts, and the other
questions' interval calibrations. Each step reads and sets a fitting :class:`~llmrubric.model.auto.AutoCalibrator`
(``model``)."""

from __future__ import annotations

import logging

import numpy as np

from llmrubric.io.tables import Tables
from llmrubric.model.core.question_oof import other_conformals, predicted_questions
from llmrubric.model.core.registry import capabilities, fit_questions, make
from llmrubric.model.core.system_level import Part
from llmrubric.model.families.levelled import Levelled

log = logging.getLogger("llmrubric.model.auto")


def fit_members(model, tables: Tables, weighted: list[str]) -> dict:
    """The weighted candidates fitted on all of ``tables`` (those refitted already, with the network's folds or
    while the inner CV's workers fitted, are taken as they are)."""
    members = {n: model._refitted.get(n) or model._candidate(n) for n in weighted}
    together = [n for n in weighted if capabilities(members[n]).joint_fit and n not in model._refitted]
    if together:
        members[together[0]].fit_many([members[n] for n in together], [tables] * len(together))
    for name in weighted:
        if not capabilities(members[name]).joint_fit and name not in model._refitted:
            fit_questions(members[name], tables)
    return members


def fit_levels(model, tables: Tables) -> dict:
    """The system level of every member of a weighted part with one, fitted on the member's in-sample
    predictions (:meth:`Levelled.fit_level`); its parts with the level on every system and beyond the
    training range only share it."""
    if not model.level_record_.get("compared"):
        model.level_record_["levels"] = {}
        return {}
    levels = {}
    for name in dict.fromkeys(model.parts_[n].member for n in model.weights_ if model.parts_[n].where):
        levels[name] = Levelled(model.members_[name], model.level_prior, base_name=name).fit_level(tables).level_
    model.level_record_["levels"] = {n: level.state()[0] for n, level in levels.items()}
    return levels


def cover(model, tables: Tables) -> None:
    """Questions with annotations that no weighted member predicts (a categorical question when
    only ordinal families have weight) get ``model.auto.cover`` as a member of weight 0: it predicts
    exactly those questions."""
    answered = [q for q in model.rubric.ids if q in set(tables.annotations.question_id)]
    covered = {
        q for m in model.members_.values() for q in (m.questions_ if capabilities(m).questions else model.rubric.ids)
    }
    uncovered = [q for q in answered if q not in covered]
    name = model.settings.cover
    if uncovered and name not in model.members_:
        log.info("model=auto: %s predicted by %s (no weighted candidate predicts them)", uncovered, name)
        model.members_[name] = fit_questions(
            make(name, model.rubric, seed=model.seed), tables, [model.rubric.main.id, *uncovered]
        )
        model.weights_[name], model.parts_[name] = 0.0, Part(name)


def question_conformals(model, tables: Tables, splits: list[tuple]) -> dict:
    """The interval calibration of each answered question but the main one: the weighted members' fixed mixture
    out of the inner folds (:mod:`llmrubric.model.core.question_oof`). ``model.auto.intervals=all``: from the
    out-of-fold predictions the inner CV made already, a question that a weighted member's fold models predict
    (the network's heads) calibrated on the mixture of those members, the members fitted on each fold again only
    for a question that none of them predicts; ``refit``: every weighted member whose fold models do not predict
    a question fitted on each fold again for it (the very mixture that predicts)."""
    answered = set(tables.annotations.question_id)
    others = [q for q in model.rubric.ids if q in answered and q != model.rubric.main.id]
    if model.settings.intervals == "main" or not others:
        return {}

    def predicts(m) -> set[str]:
        return set(predicted_questions(m, model.rubric)) & set(others)

    reused = {m: model._folds[m] for m in model._members() if model._folds.get(m)}
    reused = {m: folds for m, folds in reused.items() if predicts(model.members_[m]) <= predicts(folds[0])}
    made = {q for folds in reused.values() for q in predicts(folds[0])} if model.settings.intervals == "all" else set()

    def fold_model(name: str, k: int, questions: list[str]):
        """Member ``name``'s inner-CV model of fold ``k`` where it predicts every question it is asked, else the
        member fitted on the fold's training texts for those no reused fold model predicts (None: none left)."""
        if name in reused:
            return reused[name][k]
        missing = [q for q in questions if q not in made]
        return fit_questions(model._fold_candidate(name), splits[k][0], missing) if missing else None

    def mixture(base: dict) -> np.ndarray:
        return model._mixture({n: base[model.parts_[n].member] for n in model.weights_})

    members = {m: model.members_[m] for m in model._members()}
    return other_conformals(model.rubric, others, members, splits, fold_model, mixture)
