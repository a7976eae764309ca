"""A new judge of a trained :class:`~llmrubric.model.families.network.calibrator.NetworkCalibrator`, without
retraining (its ``add_judge``, which ``llmrubric judges add`` calls through :func:`llmrubric.model.judges.add_judge`).

:func:`with_judge` extends the calibrator's judge map by one judge and fits, in every ensemble member, the
parameters that belong to that judge alone, with the shared ones (weights, standardisation, temperatures,
ordinal blend) frozen:

- ``personalize=input``: the judge's column of the first layer's weights (its one-hot input);
- ``personalize=deltas``: its slice of the three layer deltas;
- cumulative heads (``model.head`` ordinal or combined): its cut-point deltas.

The new parameters start at zero, where the judge is predicted as an unseen judge (the shared
weights alone), and minimise the mean NLL of the judge's answers to the main question under the
member's temperature-scaled distribution (its ordinal blend, like the temperatures fitted after
training, is applied when predicting) plus ``l2`` times their squared norm, by full-batch L-BFGS.
``l2`` is a number, None (the checkpoint's ``trainer.delta_l2``, the penalty its judges were
trained with) or ``"cv"``: the value of ``l2_grid`` with the lowest NLL under ``cv_folds``-fold
cross-validation over the judge's own annotated texts (first member; nothing else is looked at).
Training fits the judges' parameters by early-stopped mini-batches among many judges; a full fit
to a few answers needs its own penalty (the per-judge deltas, thousands of parameters, overfit
5 answers at 0.01). Other questions keep the unseen-judge prediction wherever the judge's
parameters do not reach them (a cumulative head's other cut points).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pandas as pd
import torch

from llmrubric.io.errors import InputError
from llmrubric.io.integrity import check_finite_predictions
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.core.encoding import JudgeMap
from llmrubric.model.core.threads import one_thread
from llmrubric.model.families.network.cumulative import CumulativeNet
from llmrubric.model.families.network.net import CalibrationNet


def judge_parameters(net: CalibrationNet) -> dict[str, int]:
    """Name of each judge-specific tensor of ``net`` → the axis that indexes judges (or a clear error)."""
    if isinstance(net, CumulativeNet):
        return {"judge_cuts": 0}
    if net.personalize == "input":
        return {"layer1.weight": 1}
    if net.personalize == "deltas":
        return {"delta1": 0, "delta2": 0, "delta_heads": 0}
    raise InputError(
        "the checkpoint's network has no judge-specific parameters (model.personalize=none): a judge cannot be added",
        setting="model.personalize",
    )


def _extended(old: CalibrationNet, new: CalibrationNet) -> tuple[CalibrationNet, dict[str, torch.Tensor]]:
    """``new`` (built for one more judge) holding ``old``'s weights, the new judge's parameters zero;
    returns it and a 0/1 mask of the new judge's entries per judge-specific parameter."""
    state = old.state_dict()
    masks = {}
    for name, axis in judge_parameters(old).items():
        value = state[name]
        shape = list(value.shape)
        shape[axis] = 1
        state[name] = torch.cat([value, torch.zeros(shape, dtype=value.dtype)], dim=axis)
        mask = torch.zeros_like(state[name])
        mask.narrow(axis, state[name].shape[axis] - 1, 1).fill_(1.0)
        masks[name] = mask
    if old.personalize == "input" and not isinstance(old, CumulativeNet):
        state["input_mean"] = torch.cat([state["input_mean"], torch.zeros(1)])  # the new indicator is 0 in training
        state["input_scale"] = torch.cat([state["input_scale"], torch.ones(1)])  # constant there: scale 1
    fresh = new.state_dict()
    state.update({k: v for k, v in fresh.items() if v.numel() == 0})  # empty deltas of a wider input
    new.load_state_dict(state)
    return new.eval(), masks


def _nll(net: CalibrationNet, x, judge, y, main: int) -> torch.Tensor:
    """Mean NLL of the main answers ``y[:, main]`` under ``net``'s temperature-scaled distribution."""
    logp = torch.log_softmax(net(x, judge)[:, main], dim=-1)
    return -logp[torch.arange(len(y)), y[:, main]].mean()


def choose_l2(make_net, old: CalibrationNet, data, main: int, grid, folds: int, max_iter: int) -> dict:
    """``{l2: mean held-out NLL}`` of each value of ``grid``, ``folds``-fold over the texts of
    ``data`` = (x, judge, y, text ids), each fold fitted from ``old`` (a fresh net of ``make_net()``)."""
    x, judge, y, texts = data
    unique = np.array(sorted(set(texts)))
    parts = np.array_split(np.random.default_rng(0).permutation(len(unique)), min(folds, len(unique)))
    scores = {}
    for l2 in grid:
        total = 0.0
        for part in parts:
            held = torch.from_numpy(np.isin(texts, unique[part]))
            net, masks = _extended(old, make_net())
            _fit(net, masks, x[~held], judge[~held], y[~held], main, float(l2), max_iter)
            with torch.no_grad():
                total += float(_nll(net, x[held], judge[held], y[held], main)) * int(held.sum())
        scores[float(l2)] = total / len(texts)
    return scores


def _fit(net: CalibrationNet, masks: dict, x, judge, y, main: int, l2: float, max_iter: int) -> dict:
    """Fit the masked entries of ``net``'s judge parameters (everything else frozen); returns the losses."""
    params = dict(net.named_parameters())
    for p in params.values():
        p.requires_grad_(False)
    trainable, hooks = [], []
    for name, mask in masks.items():
        p = params[name]
        p.requires_grad_(True)
        hooks.append(p.register_hook(lambda g, mask=mask: g * mask))
        trainable.append(p)
    optimizer = torch.optim.LBFGS(trainable, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def nll() -> torch.Tensor:
        return _nll(net, x, judge, y, main)

    def closure():
        optimizer.zero_grad()
        loss = nll() + l2 * sum(((params[n] * m) ** 2).sum() for n, m in masks.items())
        loss.backward()
        return loss

    with torch.no_grad():
        start = float(nll())
    optimizer.step(closure)
    for hook in hooks:
        hook.remove()
    for p in params.values():
        p.requires_grad_(False)
    with torch.no_grad():
        return {"nll_unseen": start, "nll_fitted": float(nll())}


def with_judge(
    calibrator, tables: Tables, judge_id: str, min_annotations: int, l2, max_iter: int, l2_grid: tuple, cv_folds: int
):
    """A copy of the trained ``calibrator`` that knows judge ``judge_id``, fitted from that judge's annotations
    in ``tables`` (with the features of the annotated texts); see the module doc and :func:`judge_answers` for
    the errors, and an ``l2`` that is not a number, None or ``"cv"``."""
    judge_id = str(judge_id)
    mine = judge_answers(calibrator, tables, judge_id, min_annotations)
    if l2 is not None and l2 != "cv" and not isinstance(l2, (int, float)):
        raise InputError(f"{l2!r} is not a number, null or cv", setting="judges.l2")
    started = time.perf_counter()
    new = copy.copy(calibrator)
    new.judges_ = JudgeMap((*calibrator.judges_.judges, judge_id))
    data = new.encode(Tables(mine, tables.features, tables.texts))
    main_index = calibrator.rubric.ids.index(calibrator.rubric.main.id)
    rows = (data.y[:, main_index] >= 0).nonzero().squeeze(1)
    x, judge, y = data.x[rows], data.judge[rows], data.y[rows]
    nets, fits, cv = [], [], None
    with one_thread():
        if l2 == "cv":
            texts = data.pairs.text_id.to_numpy()[rows.numpy()]
            cv = choose_l2(
                new.new_net, calibrator.nets_[0], (x, judge, y, texts), main_index, l2_grid, cv_folds, max_iter
            )
            l2 = min(cv, key=cv.get)
        l2 = calibrator.trainer.delta_l2 if l2 is None else float(l2)
        for old in calibrator.nets_:
            net, masks = _extended(old, new.new_net())
            fits.append(_fit(net, masks, x, judge, y, main_index, l2, max_iter))
            nets.append(net.eval())
    seconds = time.perf_counter() - started
    new.nets_ = nets
    record = {"judge": judge_id, "answers": int(len(rows)), "l2": l2, "l2_cv": cv, "seconds": seconds}
    new.summaries_ = [
        {**s, "added_judges": [*s.get("added_judges", []), {**record, **fit}]}
        for s, fit in zip(calibrator.summaries_ or [{}] * len(nets), fits)
    ]
    return new


def judge_answers(calibrator, tables: Tables, judge_id: str, min_annotations: int) -> pd.DataFrame:
    """The annotations of the main question by ``judge_id``, a judge new to ``calibrator``. Errors
    (:class:`InputError`): an untrained calibrator or one with pair features, a network without judge
    parameters, a judge the checkpoint already knows, fewer than ``min_annotations`` answers."""
    if not calibrator.nets_:
        raise InputError("the calibrator is not trained: fit or load it before adding a judge")
    if calibrator.pair_features is not None:
        raise InputError("judges cannot be added to a calibrator with pair features (an oracle study model)")
    kinds = judge_parameters(calibrator.nets_[0])
    ann = tables.annotations
    src = source_of(ann)
    if judge_id in calibrator.judges_.judges:
        rows = ann.index[(ann.judge_id == judge_id).to_numpy()]
        raise InputError(
            f"judge {judge_id!r} is already in the checkpoint (it knows {list(calibrator.judges_.judges)})",
            file=src,
            row=int(rows[0]) if len(rows) else None,
            column="judge_id",
        )
    main = calibrator.rubric.main.id
    mine = ann[(ann.judge_id == judge_id) & (ann.question_id == main)]
    state = calibrator.nets_[0].state_dict()
    n_params = sum(state[name].numel() // state[name].shape[axis] for name, axis in kinds.items())
    if len(mine) < min_annotations:
        raise InputError(
            f"judge {judge_id!r} has {len(mine)} answers of the main question {main}; fitting its {n_params} "
            f"parameters per network needs at least {min_annotations} (judges.min_annotations)",
            file=src,
            column="judge_id",
        )
    return mine


def judge_predictor(model, judges: list[str]):
    """A function x (texts, dim) → probabilities (texts, judges, questions, max options) of ``judges`` by the
    fitted network ``model``.

    Personalization is per (text, judge) pair, which dominates the cost of scoring many pairs.
    For a fixed judge it folds into the shared weights (:meth:`CalibrationNet.for_judge`), so
    each judge gets plain copies of the ensemble's networks that run on the texts alone.
    """
    index = [model.judges_.judges.index(judge) for judge in judges]
    members = [[net.for_judge(a) for a in index] for net in model.nets_]

    @torch.no_grad()
    def predict(x: np.ndarray) -> np.ndarray:
        xt = torch.from_numpy(x)
        dummy = torch.full((len(x),), -1, dtype=torch.long)
        with one_thread():
            per_judge = [torch.stack([m.probabilities(xt, dummy) for m in nets], dim=1) for nets in members]
        probs = torch.stack(per_judge).mean(dim=0).numpy().astype(np.float64)
        check_finite_predictions(probs, model.source_)
        return probs

    return predict
