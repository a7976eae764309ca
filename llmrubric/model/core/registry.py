"""The registry of model families: every family and baseline under its config name, one interface.

A family module registers each name it provides (:func:`register`) when it is imported;
:mod:`llmrubric.model.families` imports the built-in ones (``import llmrubric.model`` does), so
the registry is complete wherever a model is built or loaded. ``model=auto``'s candidates
(:func:`names` with ``candidate=True``), ``evaluate.py``'s baselines and the report's methods
(:func:`make`), ``judges add`` and :func:`llmrubric.model.core.checkpoints.load_model` (:func:`family_of`)
look names and checkpoint formats up here; none of them names a family class.

Every family implements :class:`Family`. ``meta["format"]`` of its :meth:`Family.state` is
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


@runtime_checkable
class Family(Protocol):
    """The interface of every registered model family (:mod:`llmrubric.model.core.checkpoints` describes the
    arrays); families may take further optional arguments after these."""

    FORMAT: str  # "llmrubric-<family>/<version>": meta["format"] of state()

    def fit(self, tables: Tables) -> Family: ...

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray: ...

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame: ...

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]: ...

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> Family: ...


@dataclass(frozen=True)
class Setup:
    """What :func:`make` passes a family's ``build``: the ``model.*`` settings (a dict), the trainer's,
    the seed, ``model.auto.group=auto``'s resolution (``text`` or ``system``), and the LLM source
    of a per-source baseline (``expected_llm/<source>``)."""

    model: dict = field(default_factory=dict)
    trainer: Any = None
    seed: int = 0
    group: str = "text"
    source: str | None = None


@dataclass(frozen=True)
class Entry:
    """One registered name.

    Attributes:
        name: the config name (``model.auto.candidates``, ``baselines``, the report's methods).
        build: ``build(rubric, setup) -> unfitted family``.
        family: the class its checkpoints restore with (``FORMAT``, ``from_state``).
        candidate: a candidate of ``model=auto`` (:data:`llmrubric.config.AUTO_CANDIDATES` are the default ones).
        per_source: also ``<name>/<source>``: one LLM source of several.
        same_as: a baseline that predicts what this one does on every data set: listed once, under that name.
    """

    name: str
    build: Callable[[Rubric, Setup], Family]
    family: type
    candidate: bool = False
    per_source: bool = False
    same_as: str | None = None


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
) -> Entry:
    """Register ``name`` (a second registration of a name replaces the first: a module re-imported)."""
    kind, _, version = family.FORMAT.partition("/")
    if not kind.startswith("llmrubric-") or not version.isdigit():
        raise ValueError(f"{family.__name__}.FORMAT must be 'llmrubric-<family>/<version>', not {family.FORMAT!r}")
    known = _FORMATS.get(kind)
    if known is not None and known.__qualname__ != family.__qualname__:
        raise ValueError(f"format {kind} is {known.__name__}'s, not {family.__name__}'s")
    _FORMATS[kind] = family
    _ENTRIES[name] = Entry(name, build, family, candidate, per_source, same_as)
    return _ENTRIES[name]


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
) -> Family:
    """The unfitted family of ``name`` (or ``<name>/<source>``)."""
    found = entry(name, setting)
    source = name.partition("/")[2] or None
    return found.build(rubric, Setup(dict(model or {}), trainer, seed, group, source))


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
    (``fits_questions``: ``fit(tables, questions)``), else on every question it predicts."""
    return model.fit(tables, questions) if getattr(model, "fits_questions", False) else model.fit(tables)


def formats() -> dict[str, type]:
    """Checkpoint format kind → family class."""
    return dict(_FORMATS)
