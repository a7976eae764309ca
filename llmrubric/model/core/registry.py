"""The registry of model classes and the named presets users pick: one interface.

A family module registers each model class it provides (:func:`register`) when it is imported;
:mod:`llmrubric.model.families` imports the built-in ones (``import llmrubric.model`` does), so
the registry is complete wherever a model is built or loaded. A class is a model name of its own (its
default parameters); ``conf/presets.yaml`` adds the named variants (a class plus parameters, such as
``ridge_context`` or ``clmm_mean``) and the places of names in lists (``model=auto``'s default candidates,
the report's Table 1 methods): a preset is data, not code. ``model=auto``'s candidates
(:func:`names` with ``candidate=True``), ``evaluate.py``'s baselines and the report's methods
(:func:`make`), ``judges add`` and :func:`llmrubric.model.core.checkpoints.load_model` (:func:`family_of`)
look names and checkpoint formats up here; none of them names a family class.

What a name can do is declared once (:class:`Capabilities`): the class's abilities on its registration, a
name's places in ``conf/presets.yaml``. Code above the families reads :func:`capabilities` (of a name or a
fitted model) instead of probing a model's attributes, and the lists of names it needs (the default
candidates, the report's methods, the deterministic ones) are :func:`names` filtered by a capability.

Every class implements :class:`Family`; its parameters are the fields of the settings dataclasses its
registration declares (:attr:`Entry.settings`, :mod:`llmrubric.model.core.params`): ``get_params()`` returns
them, ``set_params(**params)`` changes them on an unfitted model, and :func:`make` builds any name from them.
``meta["format"]`` of its :meth:`Family.state` is
``llmrubric-<family>/<version>`` (the class's ``FORMAT``); a checkpoint of an unknown family or
version is an :class:`InputError` naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch

from llmrubric.config import conf_path, model_overrides
from llmrubric.io.errors import InputError, yaml_error
from llmrubric.io.rubric import Rubric
from llmrubric.io.rubric_arg import as_rubric
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
    """One model name: a registered class under its own name, or a preset of ``conf/presets.yaml``.

    Attributes:
        name: the config name (``model.auto.candidates``, ``baselines``, the report's methods).
        build: ``build(rubric, setup) -> unfitted model`` (the class's).
        family: the class its checkpoints restore with (``FORMAT``, ``from_state``).
        candidate: a candidate of ``model=auto`` (``Capabilities.default_candidate`` marks the default ones).
        per_source: also ``<name>/<source>``: one LLM source of several (the class's).
        same_as: a baseline that predicts what this one does on every data set: listed once, under that name.
        capabilities: what it can do (:class:`Capabilities`).
        settings: prefix → settings dataclass: the parameters of ``get_params`` (:func:`param_names`) and
            the search space (:func:`search_space`); or the class whose settings these are (an alias).
        cls: the registered class's name (a class's own name for a class).
        params: the preset's parameters, set on the built model (``"{main}"``: the rubric's main question).
        model: a preset's ``conf/model/<model>.yaml``: its settings over the run's ``model.*``.
    """

    name: str
    build: Callable[[Rubric, Setup], Family]
    family: type
    candidate: bool = False
    per_source: bool = False
    same_as: str | None = None
    capabilities: Capabilities = Capabilities()
    settings: dict | str = field(default_factory=lambda: {"": NoSettings})
    cls: str = ""
    params: dict = field(default_factory=dict)
    model: str | None = None


PRESETS = "presets.yaml"  # conf/presets.yaml: the named presets
NAME_FIELDS = ("candidate", "same_as")  # what a preset sets besides class, model and params
NAME_CAPABILITIES = ("deterministic", "needs_llm_answers", *PLACES)  # the capabilities a preset may set
PRESET_KEYS = ("class", "model", "params", *NAME_FIELDS, *NAME_CAPABILITIES)
MAIN = "{main}"  # a preset's parameter value: the rubric's main question id

_CLASSES: dict[str, Entry] = {}
_FORMATS: dict[str, type] = {}
_NAMES: dict[str, Entry] | None = None  # the classes and presets, read on first use after a registration


def register(
    name: str,
    build: Callable[[Rubric, Setup], Family],
    family: type,
    *,
    candidate: bool = False,
    per_source: bool = False,
    same_as: str | None = None,
    capabilities: Capabilities | None = None,
    settings: type | dict[str, type] | str | None = None,
) -> Entry:
    """Register a model class under ``name`` (a second registration of a name replaces the first: a module
    re-imported). ``settings``: the dataclass of its parameters, prefix → dataclass (none: no parameters), or
    the name of another class whose settings they are. ``candidate``, ``same_as`` and the places are those
    of the class's own name where ``conf/presets.yaml`` does not set them (a module dropped in ``families/``
    needs no preset).

    ``capabilities`` are checked here: a class's capabilities are the same under each of its names and
    it defines what they promise (:data:`PROMISES`); a default candidate is a candidate."""
    global _NAMES
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
    _CLASSES[name] = Entry(name, build, family, candidate, per_source, same_as, caps, settings, cls=name)
    _NAMES = None
    return _CLASSES[name]


def _check_capabilities(name: str, family: type, caps: Capabilities, candidate: bool) -> None:
    """A :class:`ValueError` where ``caps`` contradict the class, another class of the same type or a place
    another name holds."""
    lacking = [a for flag, attrs in PROMISES.items() if getattr(caps, flag) for a in attrs if not hasattr(family, a)]
    if lacking:
        raise ValueError(f"{name}: {family.__name__} declares capabilities it lacks: {lacking}")
    if caps.default_candidate and not candidate:
        raise ValueError(f"{name}: a default candidate must be registered with candidate=True")
    presets = _preset_specs()
    for flag in PLACES:
        place = getattr(caps, flag)
        taken = [
            e.name for e in _CLASSES.values() if e.name != name and place and getattr(e.capabilities, flag) == place
        ]
        taken += [n for n, spec in presets.items() if n != name and place and spec.get(flag) == place]
        if taken:
            raise ValueError(f"{name}: {flag}={place} is {taken[0]}'s")
    mine = _class_capabilities(caps)
    for other in _CLASSES.values():
        if other.name != name and other.family is family and _class_capabilities(other.capabilities) != mine:
            raise ValueError(f"{name}: {family.__name__}'s capabilities differ from those under {other.name}")


def _class_capabilities(caps: Capabilities) -> dict[str, bool]:
    return {flag: getattr(caps, flag) for flag in CLASS_CAPABILITIES}


def _preset_specs() -> dict[str, dict]:
    """``conf/presets.yaml`` as written: name → its keys (a copy of the file read once)."""
    return {name: dict(spec) for name, spec in _preset_file().items()}


@cache
def _preset_file() -> dict[str, dict]:
    """``conf/presets.yaml`` parsed (once a process: every registration checks the places it holds)."""
    import yaml

    path = conf_path(PRESETS)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:  # a user's edit of conf/presets.yaml
        raise yaml_error(e, str(path)) from None
    return {str(name): dict(spec or {}) for name, spec in data.items()}


def _preset(name: str, spec: dict, classes: dict[str, Entry]) -> Entry:
    """The entry of the preset ``name`` of ``conf/presets.yaml``; a :class:`ValueError` naming the file and
    the preset where its class, keys or parameters are not known."""
    where = f"conf/{PRESETS}: {name}"
    unknown = sorted(set(spec) - set(PRESET_KEYS))
    base = classes.get(spec.get("class"))
    if unknown or base is None:
        what = f"unknown key(s) {unknown}" if unknown else f"class {spec.get('class')!r} is not registered"
        raise ValueError(f"{where}: {what}; keys: {list(PRESET_KEYS)}, classes: {sorted(classes)}")
    if name in classes and name != base.name:
        raise ValueError(f"{where}: {name} is a registered class of its own, not a preset of {base.name}")
    settings = base.settings if isinstance(base.settings, dict) else classes[base.settings].settings
    params = dict(spec.get("params") or {})
    bad = [k for k in params if k not in params_module.param_names(settings)]
    if bad:
        raise ValueError(f"{where}: {base.name} has no parameter {bad[0]!r}")
    own = name == base.name  # the class's own name: what the preset does not set stays the registration's
    kept = {f: getattr(base.capabilities, f) for f in NAME_CAPABILITIES if own or f not in PLACES}
    caps = replace(base.capabilities, **{**kept, **{f: spec[f] for f in NAME_CAPABILITIES if f in spec}})
    candidate = bool(spec.get("candidate", base.candidate if own else False))
    same_as = spec.get("same_as", base.same_as if own else None)
    return replace(
        base, name=name, candidate=candidate, same_as=same_as, capabilities=caps, params=params, model=spec.get("model")
    )


def _entries() -> dict[str, Entry]:
    """Every name: the registered classes, then the presets (checked: one place per name in each list)."""
    global _NAMES
    if _NAMES is None:
        classes = dict(_CLASSES)
        found = {**classes, **{n: _preset(n, spec, classes) for n, spec in _preset_specs().items()}}
        for flag in PLACES:
            holders = [e.name for e in found.values() if getattr(e.capabilities, flag)]
            places = [getattr(found[n].capabilities, flag) for n in holders]
            if len(set(places)) != len(places):
                raise ValueError(f"conf/{PRESETS}: two names hold the same {flag}: {dict(zip(holders, places))}")
        outside = [e.name for e in found.values() if e.capabilities.default_candidate and not e.candidate]
        if outside:
            raise ValueError(f"conf/{PRESETS}: {outside[0]}: a default candidate must be a candidate")
        _NAMES = found
    return _NAMES


def capabilities(model_or_name: object) -> Capabilities:
    """The capabilities of a name (``<name>/<source>`` too), or of a model by its class (the
    nearest registered class of its type; a class registered under no name has none). For a model, only
    the class's capabilities are meaningful (:data:`CLASS_CAPABILITIES`)."""
    if isinstance(model_or_name, str):
        return entry(model_or_name).capabilities
    for cls in type(model_or_name).__mro__:
        found = next((e for e in _CLASSES.values() if e.family is cls), None)
        if found is not None:
            return found.capabilities
    return Capabilities()


def with_capability(flag: str) -> list[str]:
    """The names declaring capability ``flag``: in :func:`names`' order, or by their place for
    ``default_candidate`` and ``report_default`` (the lists do not depend on the order modules load in)."""
    if flag not in Capabilities.__dataclass_fields__:
        raise ValueError(f"unknown capability {flag!r}")
    entries = _entries()
    found = [n for n in names() if getattr(entries[n].capabilities, flag)]
    return sorted(found, key=lambda n: getattr(entries[n].capabilities, flag)) if flag in PLACES else found


def names(candidate: bool | None = None) -> list[str]:
    """The names: the registered classes in registration order, then the presets in ``conf/presets.yaml``'s
    (only ``model=auto``'s candidates with ``candidate=True``)."""
    return [n for n, e in _entries().items() if candidate is None or e.candidate == candidate]


def classes() -> list[str]:
    """The registered classes' names, in registration order."""
    return list(_CLASSES)


def entry(name: str, setting: str | None = None) -> Entry:
    """The entry of ``name`` or ``<name>/<source>`` (a per-source baseline); an unknown name is an
    :class:`InputError` naming ``setting`` and listing the known names."""
    base, _, source = name.partition("/")
    found = _entries().get(base)
    if found is None or (source and not found.per_source):
        what = "unknown model family or method" if found is None else f"{base} has no per-source variant:"
        raise InputError(f"{what} {name!r}; known: {names()}", setting=setting)
    return found


def name_with(cls: str, **params) -> str | None:
    """The first name of class ``cls`` whose preset sets exactly ``params`` (None: no such name)."""
    return next((n for n, e in _entries().items() if e.cls == cls and e.params == params), None)


def preset_params(name: str, rubric: Rubric) -> dict:
    """The parameters the preset ``name`` sets (``"{main}"`` resolved to ``rubric``'s main question)."""

    def resolved(value):
        if isinstance(value, list):
            return [resolved(v) for v in value]
        return rubric.main.id if value == MAIN else value

    return {k: resolved(v) for k, v in entry(name).params.items()}


def make(
    name: str,
    rubric: Rubric | str | Path,
    model: dict | None = None,
    trainer=None,
    seed: int = 0,
    group: str = "text",
    setting: str | None = None,
    *,
    params: dict | None = None,
) -> Family:
    """The unfitted model of ``name`` (or ``<name>/<source>``): its class built from the composed config's
    ``model.*`` (with a preset's ``conf/model/<model>.yaml`` over them) and ``trainer.*`` sections (``model``,
    ``trainer``: the defaults where not given), then the preset's parameters and ``params``
    (:func:`param_names`) set on it (:meth:`Family.set_params`): ``params`` win over all.
    ``make(name, rubric, params=m.get_params())`` builds a model equal to ``m``."""
    found = entry(name, setting)
    rubric = as_rubric(rubric)
    source = name.partition("/")[2] or None
    model = {**(model or {}), **(model_overrides(found.model) if found.model else {})}
    params = {**preset_params(name.partition("/")[0], rubric), **(params or {})}
    built = found.build(rubric, Setup(model, trainer, seed, group, source, params))
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
