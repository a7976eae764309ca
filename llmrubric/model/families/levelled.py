"""The system level as a wrapper around any model (issue 48): ``Levelled(base)`` is ``base`` with the system level
of :mod:`llmrubric.model.core.system_level` on its main question, fitted on ``base``'s in-sample predictions.

It is fitted, saved and loaded like any model (``llmrubric-levelled/1``: the base's checkpoint and the level's,
``llmrubric train model=...`` builds it as ``levelled`` with the parameter ``base``), and it is what ``model=auto``
combines: each candidate with and without its level (``where="all"``: every system, ``"beyond"``: new systems
whose summary lies outside the training systems' range only), the inner folds' levels included
(:func:`fold_levels`). ``score texts`` and ``leaderboard build --levels`` read its levels as they read
``model=auto``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from llmrubric.config import AutoConfig, model_settings
from llmrubric.io.errors import InputError, NotApplicableError
from llmrubric.io.predictions import predicted_frame
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.checkpoints import split_tensors
from llmrubric.model.core.encoding import pairs_of, question_targets
from llmrubric.model.core.params import check_params
from llmrubric.model.core.registry import Capabilities, Setup, family_of, fit_questions, make, register
from llmrubric.model.core.system_level import LevelPrior, SystemLevel, level_table, text_system_ids

WHERE = ("all", "beyond")  # the systems whose predictions get the level


@dataclass
class LevelledSettings:
    """The wrapper's parameters (the level's priors are ``model.auto.level_*``).

    Attributes:
        base: the model name it wraps (set when built).
        where: ``all`` (every system's predictions get the level) or ``beyond`` (only new systems whose summary
            lies outside the training systems' range).
    """

    base: str = "network"
    where: str = "all"


class Levelled:
    """``base`` with the system level on its main question (module doc).

    Args:
        base: the text-level model (fitted or not).
        prior: the level's priors.
        where: ``all`` or ``beyond`` (:class:`LevelledSettings`).
        base_name: the name ``base`` was built from (its parameters).
        level: a fitted :class:`SystemLevel` of ``base`` (several wrappers of one base share it).
    """

    FORMAT = "llmrubric-levelled/1"

    def __init__(
        self, base, prior: LevelPrior | None = None, where: str = "all", base_name: str = "network", level=None
    ):
        if where not in WHERE:
            raise InputError(f"{where!r} is not one of {list(WHERE)}", setting="where")
        self.base, self.rubric, self.prior, self.where = base, base.rubric, prior or LevelPrior(), where
        self.base_name, self.level_ = base_name, level
        self.source_ = "<model>"  # the checkpoint it was loaded from (from_state)

    def get_params(self) -> dict:
        return {"base": self.base_name, "where": self.where}

    def set_params(self, **params) -> Levelled:
        """``where``; ``base`` only as it is (another base is another model: build it with ``make``)."""
        check_params(params, list(LevelledSettings.__dataclass_fields__), "levelled")
        if params.get("base", self.base_name) != self.base_name:
            raise InputError("the base is chosen when the model is built", setting="base")
        if params.get("where", self.where) not in WHERE:
            raise InputError(f"{params['where']!r} is not one of {list(WHERE)}", setting="where")
        self.where = params.get("where", self.where)
        return self

    def fit(self, tables: Tables) -> Levelled:
        """The base fitted on ``tables``, then its level (:meth:`fit_level`)."""
        fit_questions(self.base, tables)
        return self.fit_level(tables)

    def fit_level(self, tables: Tables) -> Levelled:
        """The level alone, from the fitted base's in-sample expected answers of the main question."""
        pairs, _ = question_targets(tables, self.rubric.main)
        self.level_ = SystemLevel(self.rubric, self.prior).fit(tables, self._main(self.base_proba(tables, pairs)))
        return self

    @property
    def _index(self) -> tuple[int, int]:
        return self.rubric.ids.index(self.rubric.main.id), len(self.rubric.main.options)

    def _main(self, probs: np.ndarray) -> np.ndarray:
        """The main question's expected answers of (pairs, questions, options) probabilities."""
        index, k = self._index
        return probs[:, index, :k] @ np.asarray(self.rubric.main.values, dtype=float)

    def base_proba(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        return self.base.predict_proba(tables, pairs)

    def levels(self, tables: Tables, pairs: pd.DataFrame, probs: np.ndarray | None = None) -> pd.DataFrame:
        """:meth:`SystemLevel.levels` of the systems of ``pairs`` (``probs``: the base's, computed already)."""
        probs = self.base_proba(tables, pairs) if probs is None else probs
        return self.level_.levels(tables, pairs, self._main(probs))

    def applied_main(
        self, tables: Tables, pairs: pd.DataFrame, main: np.ndarray, table: pd.DataFrame | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(the main question's (pairs, options) distributions with the level where it applies, those rows)
        from the base's ``main`` distributions (``table``: :meth:`levels` over all the texts of the systems)."""
        table = self.level_.levels(tables, pairs, main @ self.level_.values) if table is None else table
        rows = beyond_rows(tables, pairs, table) if self.where == "beyond" else np.ones(len(pairs), bool)
        out = main.copy()
        if rows.any():
            out[rows] = self.level_.apply(tables, pairs, main, table)[rows]
        return out, rows

    def applied(
        self, tables: Tables, pairs: pd.DataFrame, probs: np.ndarray, table: pd.DataFrame | None = None
    ) -> np.ndarray:
        """The base's (pairs, questions, options) ``probs`` with the level on the main question."""
        if not len(pairs):
            return probs
        index, k = self._index
        main, rows = self.applied_main(tables, pairs, probs[:, index, :k], table)
        if not rows.any():
            return probs
        out = probs.copy()
        out[:, index, :k] = main
        return out

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None, levels: dict | None = None):
        """(pairs, questions, options): the base's, with the level (``levels``: :meth:`member_levels`)."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        return self.applied(tables, pairs, self.base_proba(tables, pairs), (levels or {}).get(self.base_name))

    def predict(
        self,
        tables: Tables,
        pairs: pd.DataFrame | None = None,
        questions: list[str] | None = None,
        levels: dict | None = None,
    ) -> pd.DataFrame:
        """Predictions table of ``pairs`` (the annotated ones of ``tables``), the ``questions`` it predicts."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs.reset_index(drop=True)
        return predicted_frame(self.rubric, pairs, self.predict_proba(tables, pairs, levels), questions)

    @property
    def judges_(self):
        """The base's judges (scoring reads them)."""
        return self.base.judges_

    @property
    def layout_(self):
        """The base's feature layout (scoring checks the features against it)."""
        return self.base.layout_

    @property
    def levels_(self) -> dict:
        """base name → its fitted level (the interface of a model with levels, as ``model=auto``'s)."""
        return {self.base_name: self.level_} if self.level_ is not None else {}

    def member_levels(self, tables: Tables, pairs: pd.DataFrame) -> dict:
        """base name → :meth:`levels` of the systems of ``pairs`` (over all of them, for chunks of them)."""
        return {self.base_name: self.levels(tables, pairs)}

    def system_levels(self, tables: Tables, pairs: pd.DataFrame, levels: dict | None = None) -> pd.DataFrame:
        """Per system of ``pairs`` its level (:func:`~llmrubric.model.core.system_level.level_table`)."""
        table = (levels or self.member_levels(tables, pairs))[self.base_name]
        applied = table.beyond.to_numpy(bool) | (self.where == "all")
        return level_table(self.level_, table, applied)

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        base_meta, base_tensors = self.base.state()
        level_meta, level_tensors = self.level_.state()
        meta = {"format": self.FORMAT, "base_name": self.base_name, "where": self.where, "base": base_meta}
        meta["level"] = level_meta
        tensors = {
            **{f"base/{k}": v for k, v in base_tensors.items()},
            **{f"level/{k}": v for k, v in level_tensors.items()},
        }
        return meta, tensors

    @classmethod
    def from_state(cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"):
        base = family_of(meta["base"]["format"], source).from_state(
            rubric, meta["base"], split_tensors(tensors, "base"), source
        )
        level = SystemLevel.from_state(rubric, meta["level"], split_tensors(tensors, "level"))
        prior = LevelPrior(meta["level"]["summary"], **meta["level"]["prior"])
        self = cls(base, prior, meta["where"], meta["base_name"], level)
        self.source_ = source
        return self


def beyond_rows(tables: Tables, pairs: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Whether each pair's system is new and beyond the training systems' range (``table``: its levels)."""
    system = pairs.text_id.astype(str).map(text_system_ids(tables, pairs)).to_numpy()
    return table["beyond"].reindex(system).fillna(False).to_numpy(bool)


def fold_levels(
    models: list, splits: list[tuple], pairs: list[pd.DataFrame], probs: list, prior: LevelPrior, name: str
):
    """(out-of-fold main-question probabilities with the level, the rows of held-out systems beyond their inner
    fold's training range, seconds, error) of one candidate: each inner fold's level fitted on its training part
    from the fold model's in-sample predictions, applied to the fold model's held-out ``probs`` ((pairs, options)
    of the main question)."""
    start = time.perf_counter()
    every, beyond = [], []
    try:
        for model, (train, test), held, p in zip(models, splits, pairs, probs):
            levelled = Levelled(model, prior, "all", name).fit_level(train)
            table = levelled.level_.levels(test, held, p @ levelled.level_.values)
            every.append(levelled.applied_main(test, held, p, table)[0])
            beyond.append(beyond_rows(test, held, table))
    except NotApplicableError as e:  # too few training systems in an inner fold; anything else is a bug
        return None, None, time.perf_counter() - start, " ".join(str(e).split())[:300]
    return np.concatenate(every), np.concatenate(beyond), time.perf_counter() - start, None


def _levelled(rubric: Rubric, setup: Setup) -> Levelled:
    """The wrapper of the ``base`` parameter's model (the network by default), with ``model.auto``'s level priors."""
    name = setup.params.get("base", LevelledSettings.base)
    prior = LevelPrior.from_settings(AutoConfig(**model_settings(setup.model)["auto"]))
    base = make(name, rubric, setup.model, setup.trainer, setup.seed, setup.group, setting="base")
    return Levelled(base, prior, setup.params.get("where", LevelledSettings.where), name)


register("levelled", _levelled, Levelled, capabilities=Capabilities(system_level=True), settings=LevelledSettings)
