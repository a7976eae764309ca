"""``model=auto``: the candidates combined on the user's own training data by inner cross-validation (docs/models.md).

Each candidate (``model.auto.candidates``: the default ones of ``conf/presets.yaml``) is fitted on the inner folds
of the training data, grouped by text or by system as the model will be used, and scored by the out-of-fold
likelihood of the main question's answers (:mod:`llmrubric.model.core.inner_cv`); with
``model.auto.level_min_systems`` (5) labelled training systems each is also scored wrapped in its system level
(:class:`~llmrubric.model.families.levelled.Levelled`, a :class:`~llmrubric.model.core.system_level.Part` with
``where``). The rule (:mod:`llmrubric.model.core.combine`: ``bb_stack`` by default, ``select``, ``stack``,
``bb_select``, ``auto``) weighs the parts; the weighted ones are refitted on all the training data
(:mod:`llmrubric.model.auto_refit`) and every question's prediction is their weighted mixture
(:mod:`llmrubric.model.mixture`). A candidate that does not apply (a declared
:class:`~llmrubric.io.errors.NotApplicableError`, or one identical to another on these data) is recorded with
its reason; any other error stops the run. ``model.auto.tune_trials`` N > 0 first tunes each candidate with a
search space by N Optuna trials on the same inner folds. Inner folds never see the texts (or systems) they
score, and the outer test data are never seen at all.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from llmrubric.config import AutoConfig, ModelConfig, TrainConfig, model_settings
from llmrubric.io.errors import InputError, NotApplicableError
from llmrubric.io.integrity import texts_fingerprint
from llmrubric.io.rubric import Rubric
from llmrubric.io.rubric_arg import as_rubric
from llmrubric.io.tables import Tables
from llmrubric.model.auto_checkpoint import FORMAT, auto_state, check_format, restored
from llmrubric.model.auto_refit import cover, fit_levels, fit_members, question_conformals
from llmrubric.model.auto_settings import candidate, check_auto, fold_model, resolved_candidates
from llmrubric.model.core.checkpoints import load_model, write_checkpoint
from llmrubric.model.core.combine import combine, rule_scores
from llmrubric.model.core.conformal import Conformal
from llmrubric.model.core.encoding import FeatureLayout, JudgeMap
from llmrubric.model.core.inner_cv import InnerFolds, decision, held_out, point_figures, reason, tune
from llmrubric.model.core.label_rule import main_rule
from llmrubric.model.core.memo import one_encoding
from llmrubric.model.core.parallel_folds import FoldFits, pool_workers, start_early
from llmrubric.model.core.params import (
    check_params,
    param_names,
    prefixed,
    reconfigured,
    under,
)
from llmrubric.model.core.registry import (
    Capabilities,
    Setup,
    capabilities,
    make,
    register,
)
from llmrubric.model.core.samples import check_sample_prior
from llmrubric.model.core.system_level import LevelPrior, Part, level_plan
from llmrubric.model.families.levelled import fold_levels
from llmrubric.model.mixture import WeightedMixture

log = logging.getLogger(__name__)
SETTINGS = {"model": ModelConfig, "trainer": TrainConfig}  # model=auto's parameters
MIN_WEIGHT = 1e-3  # stacking weights below this are dropped (and the rest renormalised)


class NotApplicable(str):
    """The reason a candidate does not apply to the data (not a failure: logged at info level)."""


class AutoCalibrator(WeightedMixture):
    """The estimator of ``model=auto`` (module doc); fit, predict, save and load like :class:`NetworkCalibrator`.

    Args:
        rubric: questions and scales (a :class:`Rubric` or a rubric YAML's path).
        model: ``model.*`` settings (:class:`llmrubric.config.ModelConfig`); ``model.auto`` holds
            the candidates, rule, grouping and inner folds, the rest are the network candidate's.
        trainer: optimisation settings of the network candidates.
        seed: seeds the inner folds and every candidate.
        group: inner folds by ``text`` or ``system`` where ``model.auto.group`` is ``auto``.
    """

    name = "llm_rubric"
    family = "auto"  # the registry name of the family fitted (checkpoints and metrics.json say it)
    FORMAT = FORMAT

    def __init__(self, rubric: Rubric | str | Path, model=None, trainer=None, seed: int = 0, group: str = "text"):
        self.rubric, self.seed, self.group_for = as_rubric(rubric), seed, group
        self.source_, self.added_judges_ = "<model>", []  # the checkpoint it was loaded from, the judges added
        self.tuned_ = {}  # candidate → its tuning (fit)
        self.conformals_: dict[str, Conformal] = {}  # question id → its interval calibration, the main one first
        self._configure(model, trainer)

    def _configure(self, model, trainer) -> None:
        """Set and check the settings, each error naming the setting; note the candidates that do not apply."""
        self.model = {**model_settings(model), "family": "auto"}
        try:
            self.settings = AutoConfig(**self.model["auto"])
            self.settings.candidates = resolved_candidates(self.settings.candidates)
        except TypeError as e:
            raise InputError(f"unknown model.auto setting: {e}", setting="model.auto") from None
        self.trainer = trainer if isinstance(trainer, TrainConfig) else TrainConfig.from_dict(trainer)
        check_auto(self.settings)
        self.model["sample_prior"] = check_sample_prior(self.model["sample_prior"])
        self.level_prior = LevelPrior.from_settings(self.settings)
        self.group = self.group_for if self.settings.group == "auto" else self.settings.group
        if self.group not in ("text", "system"):
            raise InputError(f"{self.group!r} is not text or system", setting="model.auto.group")
        self.unusable_ = {}
        for name in self.settings.candidates:
            try:
                candidate(name, self.rubric, self.model, self.trainer, self.seed)
            except InputError as e:
                if e.setting:  # a setting of the user's is wrong: say so, whatever the candidate
                    raise
                self.unusable_[name] = str(e)
        self._usable = [n for n in self.settings.candidates if n not in self.unusable_]  # in their order
        if not self._usable:
            raise InputError(f"no candidate applies: {self.unusable_}", setting="model.auto.candidates")

    def get_params(self) -> dict:
        """``model.<key>`` (:class:`llmrubric.config.ModelConfig`, ``model.auto`` its :class:`AutoConfig`; the
        rest the network candidate's) and ``trainer.<key>`` (:class:`TrainConfig`)."""
        return {**prefixed("model", self.model), **prefixed("trainer", vars(self.trainer))}

    def set_params(self, **params) -> AutoCalibrator:
        """Change parameters of :meth:`get_params` (checked as by the constructor); the rest are kept."""
        check_params(params, param_names(SETTINGS), self.family)
        model, trainer = {**self.model, **under("model", params)}, {**vars(self.trainer), **under("trainer", params)}
        return reconfigured(self, self._configure, model, trainer)

    def fit(self, tables: Tables) -> AutoCalibrator:
        """Inner CV of every candidate, the weights, the weighted ones refitted on ``tables``; each phase timed.
        The tables are read once (:mod:`llmrubric.model.core.memo`): every candidate, level and interval reads
        their encoding."""
        with one_encoding():
            self.fallback_, self._refitted, self.tuned_, self._folds = None, {}, {}, {}
            start_early(self.settings.workers, len(tables.annotations), len(self._usable))  # imports meanwhile
            tables = self._read_counted(tables)
            self.level_record_ = level_plan(
                self.rubric, tables, self.settings.system_level, self.level_prior, self.settings.level_min_systems
            )
            folds = InnerFolds.of(
                tables, self.rubric.main, self.group, self.settings.folds, self.seed, self.settings.group == "system"
            )
            self.group, self.fallback_ = folds.group, folds.fallback
            clock = [time.perf_counter()]
            self.tuned_ = self._tuned(folds) if self.settings.tune_trials else {}
            clock.append(time.perf_counter())
            likelihood, oof = self._score_candidates(folds, tables)
            self._weigh(folds, likelihood, oof)
            clock.append(time.perf_counter())
            self.members_ = fit_members(self, tables, self._members())
            self.levels_ = fit_levels(self, tables)
            self._refitted = {}
            cover(self, tables)
            clock.append(time.perf_counter())
            self.conformals_.update(question_conformals(self, tables, folds.splits))
            self._folds = {}
            clock.append(time.perf_counter())
            self.decision_["seconds"] = self._phase_seconds(clock)
            self.decision_.update(self.workers_)
            self.judges_ = JudgeMap.from_annotations(tables.annotations)
            self.train_texts_ = texts_fingerprint(tables.text_ids)
            return self

    def _score_candidates(self, folds: InnerFolds, tables: Tables) -> tuple[dict, dict]:
        """Every part's out-of-fold likelihood of the main question's answers and its probabilities (those that
        apply), each part's figures in :attr:`table_`."""
        self.table_, self.parts_, likelihood, oof = {}, {}, {}, {}
        for part, probs, seconds, error in self._inner_predictions(folds, tables):
            name = part.label
            self.parts_[name] = part
            if error is not None:
                self.table_[name] = {"not_applicable": str(error), "seconds": seconds}
                log.info("model=auto: candidate %s not applicable: %s", name, error)
                continue
            p = folds.likelihood(probs)
            likelihood[name], oof[name] = p, probs
            self.table_[name] = {
                "nll": float(-np.log(p).mean()),
                **point_figures(probs, folds.answers, self.rubric.main),
                "seconds": seconds,
            }
        for name, record in self.tuned_.items():
            self.table_[name]["tuned"] = record
        if not likelihood:
            reasons = "; ".join(f"{n}: {r['not_applicable']}" for n, r in self.table_.items())
            raise InputError(f"model=auto: no candidate applies ({reasons})", setting="model.auto.candidates")
        return likelihood, oof

    def _weigh(self, folds: InnerFolds, likelihood: dict, oof: dict) -> None:
        """The rule's weights of the parts from their out-of-fold ``likelihood``, the mixture's out-of-fold
        figures, its label rule and the main question's interval calibration, and the decision record."""
        main, answers, fold_of = self.rubric.main, folds.answers, folds.fold_of
        chosen = [n for n in likelihood if self.parts_[n].where == "all" or self.level_record_["setting"] != "on"]
        if not chosen:
            raise InputError(
                f"model.auto.system_level=on but no candidate with the level fitted ({self.table_})",
                setting="model.auto.system_level",
            )
        matrix = np.stack([likelihood[n] for n in chosen], axis=1)
        self.rule_cv_ = rule_scores(matrix, fold_of) if self.settings.rule == "auto" else None
        self.rule_ = self.rule_cv_["chosen"] if self.rule_cv_ else self.settings.rule
        fitted, stable = combine(matrix, self.rule_, fold_of, chosen, self.settings.bb_draws, self.seed)
        self.weights_ = {n: float(w) for n, w in zip(chosen, fitted) if w >= MIN_WEIGHT}
        total = sum(self.weights_.values())
        self.weights_ = {n: w / total for n, w in self.weights_.items()}
        mixture = sum(w * likelihood[n] for n, w in self.weights_.items())
        self.inner_nll_ = float(-np.log(mixture).mean())
        mixed = sum(w * oof[n] for n, w in self.weights_.items())
        self.label_rule_ = main_rule(main, mixed, answers, fold_of, self.model, "out-of-fold")
        self.label_oof_ = (mixed, answers, fold_of)  # what the rule was chosen on (not saved)
        self.conformals_ = {main.id: Conformal.fit(main, mixed, answers, folds.text_ids(), folds.judge_ids())}
        for name in self.table_:
            self.table_[name]["weight"] = self.weights_.get(name, 0.0)
            if name in likelihood:
                nll = -np.log(likelihood[name])
                self.table_[name]["fold_nll"] = [float(nll[fold_of == k].mean()) for k in range(len(folds.splits))]
        self.decision_ = decision(self.table_, self.weights_, self.rule_, self.rule_cv_, self.parts_)
        if stable is not None:
            self.decision_["stability"] = stable
        log.info("model=auto (%s, inner folds by %s): weights %s", self.rule_, self.group, self.weights_)

    def _read_counted(self, tables: Tables) -> Tables:
        """Set the layout (with ``model.sample_prior`` where ``tables`` hold counted blocks) and return ``tables`` as
        every candidate reads them: counted blocks smoothed once (:mod:`llmrubric.model.core.samples`)."""
        self.layout_ = FeatureLayout.from_features(tables.features, self.rubric, self.model["sample_prior"])
        return self.read(tables)

    @staticmethod
    def _phase_seconds(clock: list[float]) -> dict[str, float]:
        """Wall seconds of each phase of :meth:`fit` from its ``clock`` readings (docs/models.md: ``decision.seconds``)."""
        phases = ("tuning", "inner_cv", "refit", "other_questions_intervals")
        return {name: end - start for name, start, end in zip(phases, clock, clock[1:])}

    def _inner_predictions(self, folds: InnerFolds, tables: Tables):
        """(part, out-of-fold main-question probabilities (pairs, options), seconds, error) of every candidate
        alone and, where the level is compared, with its level (:class:`Part`); the network's refit on all of
        ``tables`` is trained with its folds (:attr:`_refitted`). The fold models are fitted in this process or
        over ``model.auto.workers`` processes (:mod:`llmrubric.model.core.parallel_folds`)."""
        with self._fold_fits(folds, tables) as fits:
            for name in self.settings.candidates:
                if name not in fits.jobs:
                    yield Part(name), None, 0.0, NotApplicable(self.unusable_.get(name) or self._twins[name])
                    continue
                outcome = fits.result(name)
                models, error, seconds, start = outcome.models, outcome.error, outcome.seconds, time.perf_counter()
                try:
                    if error is not None:
                        raise error
                    if capabilities(name).joint_fit:
                        self._refitted[name] = models.pop()
                    held = held_out(models, folds, self.rubric)
                    probs = np.concatenate(held)
                except NotApplicableError as e:  # declared by the family; any other error stops the run
                    yield Part(name), None, seconds + time.perf_counter() - start, NotApplicable(reason(e))
                    continue
                if self.settings.intervals != "main":  # the other questions' calibration reuses them
                    self._folds[name] = models
                yield Part(name), probs, seconds + time.perf_counter() - start, None
                if self.level_record_["compared"]:
                    yield from self._levelled_predictions(name, models, folds, held, probs)
            early = fits.collect_refits()  # before the pool shuts down, which would cancel refits not yet started
        self._refitted.update(early)
        self.workers_ = {
            "workers": fits.workers,
            "worker_cpu_seconds": fits.worker_cpu_seconds,
            "refitted_early": list(early),
        }

    def _fold_fits(self, folds: InnerFolds, tables: Tables) -> FoldFits:
        """The fold models of every usable candidate that is not identical to another (:attr:`_twins`: why), to
        fit on the inner folds' training tables (and on all of ``tables`` where the family fits jointly), over
        :func:`~llmrubric.model.core.parallel_folds.pool_workers` processes."""
        workers = pool_workers(self.settings.workers, len(tables.annotations), len(self._usable))
        fits, self._twins = FoldFits(folds.trains + [tables], self.rubric.main.id, workers), {}
        judges = JudgeMap.from_annotations(tables.annotations)
        for name in self._usable:
            joint = capabilities(name).joint_fit  # the refit on all of ``tables`` joins the folds' one program
            models = [self._fold_candidate(name) for _ in folds.splits] + ([self._candidate(name)] if joint else [])
            twin = self._twin(name, models[0], folds.trains[0])
            if twin:
                self._twins[name] = twin
            else:
                fits.add(name, models, list(range(len(models))), judges if joint else None)
                if not joint:
                    fits.add_refit(name, self._candidate(name))
        return fits

    def _levelled_predictions(self, name: str, models: list, folds: InnerFolds, held: list, probs: np.ndarray):
        """The parts of candidate ``name`` with its level on every system and on those beyond the range only."""
        every, beyond = Part(name, "all"), Part(name, "beyond")
        levelled, rows, seconds, error = fold_levels(models, folds.splits, folds.pairs, held, self.level_prior, name)
        if error is not None:
            yield every, None, seconds, NotApplicable(error)
            yield beyond, None, 0.0, NotApplicable(f"as {every.label}: {error}")
        elif rows.any():  # the level for systems beyond the training range only
            yield every, levelled, seconds, None
            yield beyond, np.where(rows[:, None], levelled, probs), seconds, None
        else:
            yield every, levelled, seconds, None
            why = "no held-out system of an inner fold lies beyond its training systems' range: it equals the candidate"
            yield beyond, None, 0.0, NotApplicable(why)

    def _tuned(self, folds: InnerFolds) -> dict:
        """Each usable candidate with a search space tuned on ``folds`` (:func:`~llmrubric.model.core.inner_cv.tune`;
        one identical to another candidate is left out)."""
        twin = lambda name, model: bool(self._twin(name, model, folds.trains[0]))  # noqa: E731
        return tune(self._usable, self._fold_candidate, twin, folds, self.rubric, self.settings.tune_trials, self.seed)

    def _candidate(self, name: str, params: dict | None = None):
        """Unfitted candidate ``name`` with ``params`` (by default its tuned ones, if any)."""
        params = self.tuned_.get(name, {}).get("params") if params is None else params
        return candidate(name, self.rubric, self.model, self.trainer, self.seed, self.group, params)

    def _fold_candidate(self, name: str, params: dict | None = None):
        """Unfitted candidate ``name`` for an inner fold (:func:`~llmrubric.model.auto_settings.fold_model`)."""
        return fold_model(self._candidate(name, params), self.settings.fold_ensemble)

    def _twin(self, name: str, model, train: Tables) -> str | None:
        """Why candidate ``name`` (``model``) does not apply: it is identical to another candidate on ``train``."""
        twin, why = (model.same_as(train) if capabilities(model).twins else None) or (None, None)
        if twin is not None and twin != name and twin in self.settings.candidates:
            return f"identical to {twin}: {why}"
        return None

    @property
    def conformal_(self) -> Conformal | None:
        """The main question's interval calibration (None: fitted without inner folds)."""
        return self.conformals_.get(self.rubric.main.id)

    @property
    def val_nll_(self) -> float:
        """The inner-CV NLL of the main question of the chosen mixture (its weights fitted on the same
        out-of-fold predictions, so slightly optimistic under ``rule=stack``)."""
        return self.inner_nll_

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        return auto_state(self)

    def choice(self) -> dict:
        """What the inner cross-validation chose: weights, grouping, fallback and every candidate's figures."""
        return {
            "weights": self.weights_,
            "inner_folds_by": self.group,
            "fallback": self.fallback_,
            "system_level": self.level_record_,
            "inner_cv": self.table_,
            "decision": self.decision_,
            "label_rule": self.label_rule_.to_dict() if self.label_rule_ is not None else None,
        }

    def save(self, path):
        return write_checkpoint(path, *self.state())

    @classmethod
    def load(cls, path) -> AutoCalibrator:
        return load_model(path)

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> AutoCalibrator:
        check_format(meta, source)
        self = cls(rubric, meta["model"], meta["trainer"], meta["seed"], meta["group"])
        return restored(self, meta, tensors, source)


def _auto(rubric: Rubric, setup: Setup) -> AutoCalibrator:
    return AutoCalibrator(rubric, setup.model, setup.trainer, setup.seed, setup.group)


def _configured(rubric: Rubric, setup: Setup):
    """``llm_rubric``, Table 1's model: that of ``model.family`` (the network when not given; the
    parameter ``model.family`` wins)."""
    family = "auto" if setup.params.get("model.family", setup.model.get("family")) == "auto" else "network"
    return make(family, rubric, setup.model, setup.trainer, setup.seed, setup.group)


AUTO = dict(absent_blocks=True, add_judge=True, members=True, system_level=True)  # the class's capabilities
register("auto", _auto, AutoCalibrator, capabilities=Capabilities(**AUTO), settings=SETTINGS)
register("llm_rubric", _configured, AutoCalibrator, capabilities=Capabilities(**AUTO), settings="network")
