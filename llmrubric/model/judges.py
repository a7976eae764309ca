"""A new judge from a few annotations, without retraining: fit only that judge's own parameters.

:func:`add_judge` dispatches on the registry's capabilities: a family that ``llmrubric judges add``
takes (capability ``add_judge``) adds the judge by its own ``add_judge`` method (the network's fits the
judge's parameters in every ensemble member, the shared ones frozen:
:mod:`llmrubric.model.families.network.judges`). A ``model=auto`` checkpoint gets the judge in every
member: its networks by that method, the mixed model's judge effects as their posterior mode under
the fitted prior, ridge regression's judge coefficient from the residuals
(:meth:`llmrubric.model.families.mixed.MixedOrdinal.add_judge`,
:meth:`llmrubric.model.families.baselines.RidgeJudge.add_judge`).
"""

from __future__ import annotations

import copy
import time

import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.core.encoding import JudgeMap
from llmrubric.model.core.registry import capabilities


def add_judge(
    calibrator,
    tables: Tables,
    judge_id: str,
    min_annotations: int = 5,
    l2: float | str | None = "cv",
    max_iter: int = 200,
    l2_grid: tuple = (0.001, 0.01, 0.1, 1.0, 10.0),
    cv_folds: int = 5,
):
    """A copy of ``calibrator`` that knows judge ``judge_id``, fitted from that judge's annotations in
    ``tables`` (with the features of the annotated texts); see the module doc.

    A model of ``members_`` (``model=auto``) gets it in each member. Errors (:class:`InputError`): a
    family without the capability ``add_judge``, and the family's own (the network's: a network without
    judge parameters, a judge the checkpoint already knows, fewer than ``min_annotations`` answers of the
    main question)."""
    caps = capabilities(calibrator)
    if not caps.add_judge:
        raise InputError(f"judges can be added to llmrubric calibrators only, not to a {type(calibrator).__name__}")
    if caps.members:
        return _add_to_members(calibrator, tables, judge_id, min_annotations, l2, max_iter, l2_grid, cv_folds)
    return calibrator.add_judge(tables, judge_id, min_annotations, l2, max_iter, l2_grid, cv_folds)


def _add_to_members(model, tables: Tables, judge_id: str, min_annotations: int, *network_args):
    """``model=auto``: the judge added to every member (the networks by :func:`add_judge`, a family with
    its own ``add_judge(tables, judge_id)``, the mixed model and ridge regression, by it), the weights unchanged."""
    tables = model.read(tables)  # counted blocks as the members were fitted on them
    judge_id = str(judge_id)
    ann = tables.annotations
    if judge_id in model.judges_.judges:
        rows = ann.index[(ann.judge_id.astype(str) == judge_id).to_numpy()]
        raise InputError(
            f"judge {judge_id!r} is already in the checkpoint (it knows {list(model.judges_.judges)})",
            file=source_of(ann),
            row=int(rows[0]) if len(rows) else None,
            column="judge_id",
        )
    main = model.rubric.main.id
    answers = int(((ann.judge_id.astype(str) == judge_id) & (ann.question_id == main)).sum())
    if answers < min_annotations:
        raise InputError(
            f"judge {judge_id!r} has {answers} answers of the main question {main}; at least {min_annotations} "
            "are needed (judges.min_annotations)",
            file=source_of(ann),
            column="judge_id",
        )
    started = time.perf_counter()
    new = copy.copy(model)
    new.members_ = {
        name: member.add_judge(tables, judge_id)
        if capabilities(member).member_judge
        else add_judge(member, tables, judge_id, min_annotations, *network_args)
        for name, member in model.members_.items()
    }
    new.judges_ = JudgeMap((*model.judges_.judges, judge_id))
    record = {"judge": judge_id, "answers": answers, "seconds": time.perf_counter() - started}
    networks = [m for m in new.members_.values() if not capabilities(m).member_judge]  # those added_judge fitted
    if networks:
        record["l2"] = added_record(networks[0])["l2"]
    new.added_judges_ = [*model.added_judges_, record]
    return new


def added_record(model) -> dict:
    """The record of the judge added last (answers, penalty, seconds)."""
    if capabilities(model).members:
        return model.added_judges_[-1]
    return model.summaries_[0]["added_judges"][-1]


def annotated_judge(annotations: pd.DataFrame, judge_id: str | None) -> str:
    """The judge to add: ``judge_id``, or the one judge of ``annotations`` (else an error naming the column)."""
    judges = sorted(annotations.judge_id.astype(str).unique())
    if judge_id is not None:
        if str(judge_id) not in judges:
            raise InputError(
                f"judge {judge_id!r} has no annotations (judges: {judges})",
                file=source_of(annotations),
                column="judge_id",
            )
        return str(judge_id)
    if len(judges) != 1:
        raise InputError(
            f"the annotations hold {len(judges)} judges {judges[:10]}; name the one to add with --judge",
            file=source_of(annotations),
            column="judge_id",
        )
    return judges[0]
