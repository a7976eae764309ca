"""Family parameters: the settings dataclasses a registered name reads, and the helpers of every
family's ``get_params`` / ``set_params`` (scikit-learn's semantics: ``set_params`` on an unfitted model
returns it; ``get_params`` round-trips through ``registry.make(name, rubric, params=...)``).

A name's settings (:attr:`llmrubric.model.core.registry.Entry.settings`) map a prefix to a dataclass:
``{"": MixedSettings}`` gives the parameters ``inputs`` and ``rounds``; the network's
``{"model": ModelConfig, "trainer": TrainConfig, "": NetworkInputs}`` gives ``model.h1``, ``trainer.lr``,
``drop_questions`` and so on. A settings dataclass may declare a search space (:func:`space_of`), sampled
by an Optuna trial with :func:`sample_space`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

import optuna

from llmrubric.io.errors import InputError


@dataclass
class NoSettings:
    """The settings of a family without any: what it does is its name's."""


def param_names(settings: dict[str, type]) -> list[str]:
    """The parameters of ``settings`` (prefix → dataclass): each field, ``<prefix>.<field>`` under a prefix."""
    return [f"{prefix}.{f.name}" if prefix else f.name for prefix, cls in settings.items() for f in fields(cls)]


def check_params(params: dict, known: Iterable[str], owner: str) -> None:
    """An :class:`InputError` naming the first key of ``params`` that is not one of ``known``."""
    known = list(known)
    unknown = [k for k in params if k not in known]
    if unknown:
        raise InputError(f"{owner} has no setting {unknown[0]!r}; known: {known}", setting=unknown[0])


def replaced(settings, params: dict, owner: str):
    """A copy of the dataclass ``settings`` with ``params`` (its field names) changed."""
    check_params(params, [f.name for f in fields(settings)], owner)
    return type(settings)(**{**copy.deepcopy(asdict(settings)), **params})


def reconfigured(model, configure, *args):
    """``model`` after ``configure(*args)``, or with its attributes as they were where that raises."""
    before = dict(vars(model))
    try:
        configure(*args)
    except Exception:
        vars(model).clear()
        vars(model).update(before)
        raise
    return model


def prefixed(prefix: str, values: dict) -> dict:
    """``values`` with their keys under ``prefix``."""
    return {f"{prefix}.{k}": copy.deepcopy(v) for k, v in values.items()}


def under(prefix: str, params: dict) -> dict:
    """The entries of ``params`` under ``prefix``, without it."""
    return {k[len(prefix) + 1 :]: v for k, v in params.items() if k.startswith(f"{prefix}.")}


def space_of(settings: dict[str, type], base: dict | None = None) -> dict:
    """The search space of ``settings``: each dataclass's ``search_space(base)`` (``base``: the parameters
    the search starts from, under that dataclass's prefix), its keys under the prefix; empty when none
    declares one. A space is a dict ``{parameter: {type: categorical|int|float, ...}}`` as ``search.space``."""
    out = {}
    for prefix, cls in settings.items():
        declared = getattr(cls, "search_space", None)
        if declared is None:
            continue
        mine = under(prefix, base or {}) if prefix else {k: v for k, v in (base or {}).items() if "." not in k}
        out.update({f"{prefix}.{k}" if prefix else k: v for k, v in declared(mine).items()})
    return out


def sample_space(trial, space: dict) -> dict:
    """The parameters an Optuna ``trial`` draws from ``space`` (:func:`space_of`); a bad type or bound
    is an :class:`InputError` naming the key."""
    params = {}
    for key, spec in space.items():
        kind = spec.get("type")
        try:
            if kind == "categorical":
                value = trial.suggest_categorical(key, list(spec["choices"]))
            elif kind == "int":
                value = trial.suggest_int(
                    key, spec["low"], spec["high"], step=spec.get("step", 1), log=spec.get("log", False)
                )
            elif kind == "float":
                value = trial.suggest_float(key, spec["low"], spec["high"], log=spec.get("log", False))
            else:
                raise InputError(f"unknown type {kind!r} (categorical, int, float)")
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"search space {key!r}: {e}") from e
        params[key] = value
    return params


def quiet_study(sampler) -> optuna.Study:
    """An in-memory study to minimise with ``sampler``, created without Optuna's "new study created" line."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.create_study(direction="minimize", sampler=sampler)
    finally:
        optuna.logging.set_verbosity(verbosity)
