"""The registry of model families: every family and baseline under its config name, one interface.

A family module registers each name it provides (:func:`register`) when it is imported;
:mod:`llmrubric.model.families` imports the built-in ones (``import llmrubric.model`` does), so
the registry is complete wherever a model is built or loaded. ``model=auto``'s candidates
(:func:`names` with ``candidate=True``), ``evaluate.py``'s baselines and the report's methods
(:func:`make`), ``judges add`` and :func:`llmrubric.model.core.checkpoints.load_model` (:func:`family_of`)
look names and checkpoint formats up here; none of them names a family class.

What a name can do is declared once, on its entry (:class:`Capabilities`): code above the families
reads :func:`capabilities` (of a name or a fitted model) instead of probing a model's attributes, and
the lists of names it needs (the default candidates, the report's methods, the deterministic ones)
are :func:`names` filtered by a capability.

Every family implements :class:`Family`; its parameters are the fields of the settings dataclasses its
entry declares (:attr:`Entry.settings`, :mod:`llmrubric.model.core.params`): ``get_params()`` returns them,
``set_params(**params)`` changes them on an unfitted model, and :func:`make` builds any name from them.
``meta["format"]`` of its :meth:`Family.state` is
``llmrubric-<family>/<version>`` (the class's ``FORMAT``); a checkpoint of an unknown family or
version is an :class:`InputError` naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core import params as params_module
from llmrubric.model.core.params import NoSettings


@runtime_checkable
class Family(Protocol):
    """The interface of every registered model family (:mod:`llmrubric.model.core.checkpoints` describes the
    arrays); families may take further optional arguments after these."""

    FORMAT: str  # "llmrubric-<family>/<version>": meta["format"] of state()

    def fit(self, tables: Tables) -> Family: ...

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray: ...

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame: ...

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]: ...

    def get_params(self) -> dict: ...

    def set_params(self, **params) -> Family: ...

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> Family: ...


@dataclass(frozen=True)
class Setup:
    """What :func:`make` passes a family's ``build``: the ``model.*`` settings (a dict), the trainer's,
    the seed, ``model.auto.group=auto``'s resolution (``text`` or ``system``), the LLM source
    of a per-source baseline (``expected_llm/<source>``), and the parameters :func:`make` sets on what
    ``build`` returns (a build may read them to choose a class)."""

    model: dict = field(default_factory=dict)
    trainer: Any = None
    seed: int = 0
    group: str = "text"
    source: str | None = None
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Capabilities:
    """What a registered name can do beyond :class:`Family`; each flag promises the attributes it names.

    Of the class (every name registered with one class declares the same):
        joint_fit: ``fit_many(models, tables, judges=None, progress=None)``: models of the class trained as one program.
        questions: ``fit(tables, questions)`` fits the questions given; ``questions_``: those it predicts.
        twins: ``same_as(tables) -> (name, why) | None``: a candidate identical to another on these data.
        absent_blocks: predicts texts lacking feature blocks, marginalised over its answer model
            ``answers_`` (None in an old checkpoint) with ``proba_completed(batch, completions)``.
        add_judge: ``llmrubric judges add`` takes its checkpoint (:func:`llmrubric.model.judges.add_judge`): its own
            ``add_judge(tables, judge_id, min_annotations, l2, max_iter, l2_grid, cv_folds)``, or with ``members``
            each member's.
        member_judge: its own ``add_judge(tables, judge_id)`` (a judge added to a ``model=auto`` member).
        judge_scoring: ``judge_predictor(judges)``: a function of the texts' inputs x (texts, dim) → each judge's
            probabilities (texts, judges, questions, options), the judges folded into the weights (fast scoring).
        members: ``members_`` (fitted families by name) and ``choice()``: a combination chosen by inner CV.
        system_level: ``levels_``: fitted system levels, ``member_levels`` and ``system_levels``.
        corrects: ``base`` and ``calibrate(tables)``: a correction fitted on a fitted base model.

    Of the name:
        deterministic: draws nothing at random (one seed suffices).
        needs_llm_answers: needs an LLM's answers to the main question in the features.
        default_candidate: its place (1, 2, …) among ``model=auto``'s default candidates; 0: not one.
        report_default: its place (1, 2, …) among the report's Table 1 methods by default; 0: not one.
    """

    joint_fit: bool = False
    questions: bool = False
    twins: bool = False
    absent_blocks: bool = False
    add_judge: bool = False
    member_judge: bool = False
    judge_scoring: bool = False
    members: bool = False
    system_level: bool = False
    corrects: bool = False
    deterministic: bool = False
    needs_llm_answers: bool = False
    default_candidate: int = 0
    report_default: int = 0


CLASS_CAPABILITIES = (
    "joint_fit",
    "questions",
    "twins",
    "absent_blocks",
    "add_judge",
    "member_judge",
    "judge_scoring",
    "members",
    "system_level",
    "corrects",
)
PROMISES = {
    "joint_fit": ("fit_many",),
    "twins": ("same_as",),
    "absent_blocks": ("proba_completed",),
    "member_judge": ("add_judge",),
    "judge_scoring": ("judge_predictor",),
    "members": ("choice",),
    "system_level": ("member_levels", "system_levels"),
    "corrects": ("calibrate",),
}  # the methods a class declaring the capability defines (attributes set by fit are not checked here)
PLACES = ("default_candidate", "report_default")  # the capabilities that are a place in a list


@dataclass(frozen=True)
class Entry:
    """One registered name.

    Attributes:
        name: the config name (``model.auto.candidates``, ``baselines``, the report's methods).
        build: ``build(rubric, setup) -> unfitted family``.
        family: the class its checkpoints restore with (``FORMAT``, ``from_state``).
        candidate: a candidate of ``model=auto`` (``Capabilities.default_candidate`` marks the default ones).
        per_source: also ``<name>/<source>``: one LLM source of several.
        same_as: a baseline that predicts what this one does on every data set: listed once, under that name.
        capabilities: what it can do (:class:`Capabilities`).
        settings: prefix → settings dataclass: the parameters of ``get_params`` (:func:`param_names`) and
            the search space (:func:`search_space`); or the name whose settings these are (an alias).
    """

    name: str
    build: Callable[[Rubric, Setup], Family]
    family: type
    candidate: bool = False
    per_source: bool = False
    same_as: str | None = None
    capabilities: Capabilities = Capabilities()
    settings: dict | str = field(default_factory=lambda: {"": NoSettings})


_ENTRIES: dict[str, Entry] = {}
_FORMATS: dict[str, type] = {}


def register(
    name: str,
    build: Callable[[Rubric, Setup], Family],
    family: type,
    *,
    candidate: bool = False,
    per_source: bool = False,
    same_as: str | None = None,
    capabilities: Capabilities | None = None,
    settings: type | dict[str, type] | None = None,
) -> Entry:
    """Register ``name`` (a second registration of a name replaces the first: a module re-imported).
    ``settings``: the dataclass of its parameters, prefix → dataclass (none: no parameters), or the
    name of another entry whose settings they are.

    ``capabilities`` are checked here: a class's capabilities are the same under each of its names and
    it defines what they promise (:data:`PROMISES`); a default candidate is a candidate."""
    kind, _, version = family.FORMAT.partition("/")
    if not kind.startswith("llmrubric-") or not version.isdigit():
        raise ValueError(f"{family.__name__}.FORMAT must be 'llmrubric-<family>/<version>', not {family.FORMAT!r}")
    known = _FORMATS.get(kind)
    if known is not None and known.__qualname__ != family.__qualname__:
        raise ValueError(f"format {kind} is {known.__name__}'s, not {family.__name__}'s")
    caps = capabilities or Capabilities()
    _check_capabilities(name, family, caps, candidate)
    _FORMATS[kind] = family
    settings = settings if isinstance(settings, (dict, str)) else {"": settings or NoSettings}
    _ENTRIES[name] = Entry(name, build, family, candidate, per_source, same_as, caps, settings)
    return _ENTRIES[name]


def _check_capabilities(name: str, family: type, caps: Capabilities, candidate: bool) -> None:
    """A :class:`ValueError` where ``caps`` contradict the class or another name of it."""
    lacking = [a for flag, attrs in PROMISES.items() if getattr(caps, flag) for a in attrs if not hasattr(family, a)]
    if lacking:
        raise ValueError(f"{name}: {family.__name__} declares capabilities it lacks: {lacking}")
    if caps.default_candidate and not candidate:
        raise ValueError(f"{name}: a default candidate must be registered with candidate=True")
    for flag in PLACES:
        place = getattr(caps, flag)
        taken = [
            e.name for e in _ENTRIES.values() if e.name != name and place and getattr(e.capabilities, flag) == place
        ]
        if taken:
            raise ValueError(f"{name}: {flag}={place} is {taken[0]}'s")
    mine = _class_capabilities(caps)
    for other in _ENTRIES.values():
        if other.name != name and other.family is family and _class_capabilities(other.capabilities) != mine:
            raise ValueError(f"{name}: {family.__name__}'s capabilities differ from those under {other.name}")


def _class_capabilities(caps: Capabilities) -> dict[str, bool]:
    return {flag: getattr(caps, flag) for flag in CLASS_CAPABILITIES}


def capabilities(model_or_name: object) -> Capabilities:
    """The capabilities of a registered name (``<name>/<source>`` too), or of a model by its class (the
    nearest registered class of its type; a class registered under no name has none). For a model, only
    the class's capabilities are meaningful (:data:`CLASS_CAPABILITIES`)."""
    if isinstance(model_or_name, str):
        return entry(model_or_name).capabilities
    for cls in type(model_or_name).__mro__:
        found = next((e for e in _ENTRIES.values() if e.family is cls), None)
        if found is not None:
            return found.capabilities
    return Capabilities()


def with_capability(flag: str) -> list[str]:
    """The registered names declaring capability ``flag``: in registration order, or by their place for
    ``default_candidate`` and ``report_default`` (the lists do not depend on the order modules load in)."""
    if flag not in Capabilities.__dataclass_fields__:
        raise ValueError(f"unknown capability {flag!r}")
    found = [n for n in names() if getattr(_ENTRIES[n].capabilities, flag)]
    return sorted(found, key=lambda n: getattr(_ENTRIES[n].capabilities, flag)) if flag in PLACES else found


def names(candidate: bool | None = None) -> list[str]:
    """The registered names in registration order (only ``model=auto``'s candidates with ``candidate=True``)."""
    return [n for n, e in _ENTRIES.items() if candidate is None or e.candidate == candidate]


def entry(name: str, setting: str | None = None) -> Entry:
    """The entry of ``name`` or ``<name>/<source>`` (a per-source baseline); an unknown name is an
    :class:`InputError` naming ``setting`` and listing the known names."""
    base, _, source = name.partition("/")
    found = _ENTRIES.get(base)
    if found is None or (source and not found.per_source):
        what = "unknown model family or method" if found is None else f"{base} has no per-source variant:"
        raise InputError(f"{what} {name!r}; known: {names()}", setting=setting)
    return found


def make(
    name: str,
    rubric: Rubric,
    model: dict | None = None,
    trainer=None,
    seed: int = 0,
    group: str = "text",
    setting: str | None = None,
    *,
    params: dict | None = None,
) -> Family:
    """The unfitted family of ``name`` (or ``<name>/<source>``): built from the composed config's
    ``model.*`` and ``trainer.*`` sections (``model``, ``trainer``: the defaults where not given), then
    ``params`` (:func:`param_names`) set on it (:meth:`Family.set_params`): they win over both.
    ``make(name, rubric, params=m.get_params())`` builds a model equal to ``m``."""
    found = entry(name, setting)
    source = name.partition("/")[2] or None
    params = dict(params or {})
    built = found.build(rubric, Setup(dict(model or {}), trainer, seed, group, source, params))
    return built.set_params(**params) if params else built


def settings_of(name: str) -> dict[str, type]:
    """Prefix → settings dataclass of ``name`` (an alias's: those of the name it gives)."""
    settings = entry(name).settings
    return settings_of(settings) if isinstance(settings, str) else settings


def param_names(name: str) -> list[str]:
    """The parameters of ``name`` (its models' ``get_params`` has these, or some of them for a name
    that builds one of several classes, such as ``llm_rubric``)."""
    return params_module.param_names(settings_of(name))


def search_space(name: str, base: dict | None = None) -> dict:
    """The search space ``name``'s settings declare (empty: none), for a search starting from the
    parameters ``base`` (:func:`llmrubric.model.core.params.space_of`)."""
    return params_module.space_of(settings_of(name), base)


def family_of(format_: str, source: str = "<checkpoint>") -> type:
    """The class that restores checkpoints of ``format_`` (``llmrubric-<family>/<version>``)."""
    kind, _, version = str(format_).partition("/")
    family = _FORMATS.get(kind)
    if family is None:
        raise InputError(f"unknown model family {kind!r} (format {format_!r}); known: {sorted(_FORMATS)}", file=source)
    if family.FORMAT != format_:
        raise InputError(f"format {format_!r} is not this llmrubric's {family.FORMAT!r}: retrain it", file=source)
    return family


def fit_questions(model: Family, tables: Tables, questions: list[str] | None = None) -> Family:
    """``model`` fitted on ``tables``: on ``questions`` only where its family fits some questions
    (capability ``questions``: ``fit(tables, questions)``), else on every question it predicts."""
    return model.fit(tables, questions) if capabilities(model).questions else model.fit(tables)


def formats() -> dict[str, type]:
    """Checkpoint format kind → family class."""
    return dict(_FORMATS)
