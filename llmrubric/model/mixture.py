"""Prediction by a fitted weighted mixture of parts (``model=auto``'s): each question's mixture of the parts that
predict it, a part being a member alone or wrapped in its system level (:class:`~llmrubric.model.families.levelled.Levelled`),
and the completion of absent blocks."""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.io.integrity import check_finite_predictions
from llmrubric.io.predictions import predicted_frame
from llmrubric.io.tables import Tables
from llmrubric.model.core.encoding import pairs_of
from llmrubric.model.core.registry import capabilities
from llmrubric.model.core.samples import smoothed_tables
from llmrubric.model.core.system_level import Part, level_table
from llmrubric.model.families.levelled import Levelled


class WeightedMixture:
    """What a fitted mixture predicts from ``members_`` (fitted families by name), ``parts_`` (label →
    :class:`~llmrubric.model.core.system_level.Part`: a member alone or with its system level), ``weights_`` (part
    label → weight; weight 0: a member predicting only the questions no weighted part does), ``levels_`` (member →
    its fitted system level), ``rubric`` and ``source_`` (where it was loaded from, for errors)."""

    @property
    def summaries_(self) -> list[dict]:
        """The training histories of the first member that keeps them (the network's), else []."""
        return next((m.summaries_ for m in self.members_.values() if getattr(m, "summaries_", None)), [])

    def predict_proba(
        self, tables: Tables, pairs: pd.DataFrame | None = None, levels: dict | None = None
    ) -> np.ndarray:
        """(pairs, questions, max options): each question's weighted mixture of the members that
        predict it (weights renormalised over them); NaN for a question none predicts. ``levels``:
        :meth:`member_levels` of all the texts of the systems, when ``pairs`` are a chunk of them."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        tables = self.read(tables)
        base = {m: self.members_[m].predict_proba(tables, pairs) for m in self._members()}
        return self._mixture(self.part_probs(base, tables, pairs, levels))

    def read(self, tables: Tables) -> Tables:
        """``tables`` as the members were fitted on them: counted blocks smoothed by ``layout_.sample_prior``
        where it is set (:mod:`llmrubric.model.core.samples`)."""
        layout = getattr(self, "layout_", None)
        return tables if layout is None or layout.sample_prior is None else smoothed_tables(tables, layout.sample_prior)

    def _members(self) -> list[str]:
        """The members of the weighted parts, each once."""
        return list(dict.fromkeys(self.parts_[n].member for n in self.weights_))

    def levelled(self, part: Part) -> Levelled:
        """The member of ``part`` wrapped in its fitted system level (``part.where``)."""
        return Levelled(
            self.members_[part.member], where=part.where, base_name=part.member, level=self.levels_[part.member]
        )

    def part_probs(self, base: dict, tables: Tables, pairs: pd.DataFrame, levels: dict | None = None) -> dict:
        """Part label → (pairs, questions, options) probabilities of every weighted part, from each member's
        ``base`` probabilities (``levels``: :meth:`member_levels` of all the texts of the systems)."""
        out = {}
        for name in self.weights_:
            part = self.parts_[name]
            probs = base[part.member]
            if part.where is not None and part.member in self.levels_:
                probs = self.levelled(part).applied(tables, pairs, probs, (levels or {}).get(part.member))
            out[name] = probs
        return out

    @property
    def answers_(self):
        """The answer model of the members (all fitted on the same features); None for an old checkpoint
        or when a member cannot predict completions (a family without ``absent_blocks``)."""
        members = list(self.members_.values())
        if not all(capabilities(m).absent_blocks for m in members):
            return None
        return next((m.answers_ for m in members if m.answers_ is not None), None)

    def proba_completed(self, batch, completions: np.ndarray) -> np.ndarray:
        """(draws, pairs, questions, max options): the members' mixture for each completion
        (:mod:`llmrubric.model.core.absent`; every member has the layout of ``batch``)."""
        probs = {n: self.members_[self.parts_[n].member].proba_completed(batch, completions) for n in self.weights_}
        draws, n_pairs = completions.shape[1], len(batch.pairs)
        flat = self._mixture({n: p.reshape(draws * n_pairs, *p.shape[2:]) for n, p in probs.items()})
        return flat.reshape(draws, n_pairs, *flat.shape[1:])

    def _mixture(self, probs: dict[str, np.ndarray]) -> np.ndarray:
        """Each question's weighted mixture of the members' ``probs`` (rows, questions, max options)."""
        known = {
            n: np.isfinite(p).all(axis=(0, 2)) if len(p) else ~np.isnan(p).all(axis=(0, 2)) for n, p in probs.items()
        }
        share = {n: w * known[n] for n, w in self.weights_.items() if w > 0}
        uncovered = sum(share.values()) == 0
        share.update({n: uncovered * known[n] for n, w in self.weights_.items() if w == 0})  # the cover members
        total = sum(np.where(known[n][None, :, None], probs[n], 0.0) * share[n][None, :, None] for n in share)
        weight = sum(share.values())
        with np.errstate(invalid="ignore", divide="ignore"):
            out = total / np.where(weight > 0, weight, np.nan)[None, :, None]
        check_finite_predictions(out[:, weight > 0], self.source_)
        return out

    def member_levels(self, tables: Tables, pairs: pd.DataFrame) -> dict:
        """member → :meth:`SystemLevel.levels` of the systems of ``pairs`` (over all of them: pass it
        to :meth:`predict_proba` for chunks of these texts, :func:`llmrubric.scoring.scores.score_texts`)."""
        main_index, k = self.rubric.ids.index(self.rubric.main.id), len(self.rubric.main.options)
        values = np.asarray(self.rubric.main.values, dtype=float)
        out, tables = {}, self.read(tables)
        for name, level in self.levels_.items():
            expected = self.members_[name].predict_proba(tables, pairs)[:, main_index, :k] @ values
            out[name] = level.levels(tables, pairs, expected)
        return out

    def system_levels(self, tables: Tables, pairs: pd.DataFrame, levels: dict | None = None) -> pd.DataFrame | None:
        """Per system of ``pairs`` the main question's level (``level``, ``level_sd``, ``level_df``,
        ``known``, ``applied``: whether the predictions use it, ``x``, ``beyond``: a new system whose summary ``x``
        lies outside the training systems' range, ``centre``, ``sigma_within``) of
        the weighted member with a level (None without one); ``levels``: :meth:`member_levels` computed already."""
        if not self.levels_:
            return None
        tables_ = levels if levels is not None else self.member_levels(tables, pairs)
        weight = {(p.member, p.where): self.weights_[n] for n, p in self.parts_.items() if n in self.weights_}
        name = max(self.levels_, key=lambda m: (weight.get((m, "all"), 0.0), weight.get((m, "beyond"), 0.0)))
        table = tables_[name]
        applied = (table.beyond.to_numpy(bool) & (weight.get((name, "beyond"), 0.0) > 0)) | (
            weight.get((name, "all"), 0.0) > 0
        )
        return level_table(self.levels_[name], table, applied)

    def predict(
        self,
        tables: Tables,
        pairs: pd.DataFrame | None = None,
        questions: list[str] | None = None,
        levels: dict | None = None,
    ) -> pd.DataFrame:
        """Predictions table of the annotated pairs of ``tables`` (or ``pairs``), every predicted
        question (``levels``: as for :meth:`predict_proba`)."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs.reset_index(drop=True)
        return predicted_frame(self.rubric, pairs, self.predict_proba(tables, pairs, levels), questions)
