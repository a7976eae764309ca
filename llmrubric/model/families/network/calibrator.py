"""LLM-Rubric as an estimator: fit on canonical tables, predict every judge's distributions, save/load.

Checkpoints are single safetensors files: the network weights plus JSON metadata holding
the rubric, judge map, feature layout and hyperparameters (no pickles).
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from llmrubric.config import ModelConfig, TrainConfig, model_settings
from llmrubric.data.splits import holdout_texts
from llmrubric.io.errors import InputError, TrainingDiverged
from llmrubric.io.guards import check_range
from llmrubric.io.integrity import check_finite_predictions, texts_fingerprint
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Rubric
from llmrubric.io.rubric_arg import as_rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.absent import CompletionBatch, marginal_proba
from llmrubric.model.core.answers import AnswerModel
from llmrubric.model.core.checkpoints import load_model, write_checkpoint
from llmrubric.model.core.context import text_systems
from llmrubric.model.core.encoding import Encoded, FeatureLayout, JudgeMap, encode, pairs_of
from llmrubric.model.core.label_rule import LabelRule
from llmrubric.model.core.params import check_params, param_names, prefixed, reconfigured, under
from llmrubric.model.core.registry import Capabilities, Setup, register
from llmrubric.model.core.samples import check_sample_prior
from llmrubric.model.core.threads import one_thread
from llmrubric.model.families.network.checkpoint import FORMAT, check_format, network_state, restored
from llmrubric.model.families.network.cumulative import HEADS, CumulativeNet, train_cumulative
from llmrubric.model.families.network.engine import structure, train_stacked
from llmrubric.model.families.network.judges import judge_predictor, with_judge
from llmrubric.model.families.network.net import INPUTS, PERSONALIZATION, CalibrationNet
from llmrubric.model.families.network.ordinal import fit_ordinal_weight
from llmrubric.model.families.network.temperature import fit_temperature
from llmrubric.model.families.oracles import JudgeAnswers, PersonalIsotonic

log = logging.getLogger(__name__)
MODEL_KEYS = tuple(f.name for f in fields(ModelConfig))
NOT_NETWORK_KEYS = (
    "ensemble",
    "head",
    "monotone",
    "family",
    "auto",
    "linear",
    "label_rule",
    "sample_prior",
)  # settings that are no network argument


ORACLES = (None, "own", "others")


@dataclass
class NetworkInputs:
    """What the network reads besides the feature blocks' answers (the ablations and oracle studies).

    Attributes:
        feature_questions: only the feature blocks of these questions (e.g. ``[Q0]``); None: all.
        drop_questions: the feature blocks of these questions left out.
        oracle: ``own`` (the judge's own answers to the other questions as extra inputs), ``others``
            (the other judges' mean answers) or None (:class:`llmrubric.model.families.oracles.JudgeAnswers`).
        llm_features: False keeps only the oracle's inputs.
    """

    feature_questions: list[str] | None = None
    drop_questions: list[str] | None = None
    oracle: str | None = None
    llm_features: bool = True


SETTINGS = {"model": ModelConfig, "trainer": TrainConfig, "": NetworkInputs}  # the network's parameters


def check_model(model: dict) -> None:
    """Network settings in range (converted in place), each error naming ``model.<key>``."""
    for key in ("h1", "h2", "ensemble"):
        model[key] = check_range(f"model.{key}", model[key], 1, integer=True)
    model["input_dropout"] = check_range("model.input_dropout", model["input_dropout"], 0, 1, open_high=True)
    model["sample_prior"] = check_sample_prior(model["sample_prior"])
    if model["inputs"] not in INPUTS:
        raise InputError(f"{model['inputs']!r} is not one of {list(INPUTS)}", setting="model.inputs")
    if model["personalize"] not in (*PERSONALIZATION, True, False):
        raise InputError(f"{model['personalize']!r} is not one of {list(PERSONALIZATION)}", setting="model.personalize")


class NetworkCalibrator:
    """The calibration network with the data plumbing around it.

    ``NetworkCalibrator(rubric).fit(tables)`` is ``model=network`` (and the ``network`` candidate of
    ``model=auto``, the shipped default, :class:`llmrubric.model.auto.AutoCalibrator`): every setting not
    given takes its default from :class:`llmrubric.config.ModelConfig` and :class:`TrainConfig`,
    as ``conf/`` does; the paper's network is ``NetworkCalibrator(rubric, group("model", "paper"))``
    (:func:`llmrubric.config.group`).

    Args:
        rubric: questions and answer scales (a :class:`Rubric` or a rubric YAML's path); its main question is finetuned.
        model: a :class:`ModelConfig` or a dict of some of its fields (the rest default): network
            settings (``h1, h2, personalize, inputs, input_dropout``; see :class:`CalibrationNet`),
            ``ensemble``: the number of networks (seeds spawned from ``seed``: :attr:`seeds`, each with its
            own early-stopping split) whose average distribution is the prediction, and ``head``:
            ``softmax`` (the network's heads), or ``ordinal`` / ``combined`` with ``monotone``
            (:mod:`llmrubric.model.families.network.cumulative`: cumulative-link heads on a learned score).
        trainer: :class:`TrainConfig` fields.
        seed: seeds initialisation, the early-stopping split and the batch order.
        group: what the model is fitted for, ``text`` or ``system`` (new systems: the protocol's, or
            ``model=auto``'s inner folds by system); ``trainer.val_group=auto`` holds out systems then.
        feature_questions: use only the feature blocks of these questions (e.g. ``[Q0]``).
        drop_questions: leave out the feature blocks of these questions (ablations).
        pair_features: optional per-(text, judge) input columns appended to x, an object with
            ``fit(tables)``, ``dim`` and ``transform(tables, pairs) -> (pairs, dim)`` (the
            oracle studies' :class:`llmrubric.model.families.oracles.JudgeAnswers`, saved as its settings; no other kind is saved).
        llm_features: False keeps only the ``pair_features`` as input (the oracle without LLM probabilities).
    """

    name = "llm_rubric"
    family = "network"  # the registry name of the family fitted (checkpoints and metrics.json say it)
    FORMAT = FORMAT

    def __init__(
        self,
        rubric: Rubric | str | Path,
        model: dict | ModelConfig | None = None,
        trainer: dict | TrainConfig | None = None,
        seed: int = 0,
        feature_questions: list[str] | None = None,
        drop_questions: list[str] | None = None,
        pair_features=None,
        llm_features: bool = True,
        group: str = "text",
    ):
        self.rubric, self.group, self.seed = as_rubric(rubric), group, seed
        self._configure(model, trainer, feature_questions, drop_questions, pair_features, llm_features)
        self.nets_: list[CalibrationNet] = []  # the trained ensemble (empty until fitted or loaded)
        self.answers_: AnswerModel | None = None  # fitted by fit (None in an old checkpoint, or with pair features)
        self.label_rule_: LabelRule | None = None  # set by train.py from its in-sample predictions
        self.source_ = "<model>"  # the checkpoint it was loaded from

    def _configure(self, model, trainer, feature_questions, drop_questions, pair_features, llm_features) -> None:
        """Set and check the settings (those of :meth:`__init__`), each error naming the setting."""
        self.model = checked_settings(model_settings(model), self.rubric)
        self.trainer = trainer if isinstance(trainer, TrainConfig) else TrainConfig.from_dict(trainer)
        self.feature_questions, self.drop_questions = feature_questions, drop_questions
        if not llm_features and pair_features is None:
            raise InputError("llm_features=False needs pair_features as the input", setting="llm_features")
        self.pair_features, self.llm_features = pair_features, llm_features

    def get_params(self) -> dict:
        """``model.<key>`` (:class:`ModelConfig`), ``trainer.<key>`` (:class:`TrainConfig`) and the inputs
        (:class:`NetworkInputs`; ``oracle``: None for pair features other than the oracles' own)."""
        oracle = None
        if isinstance(self.pair_features, JudgeAnswers):
            oracle = "others" if self.pair_features.others else "own"
        inputs = NetworkInputs(
            copy.deepcopy(self.feature_questions), copy.deepcopy(self.drop_questions), oracle, self.llm_features
        )
        return {**prefixed("model", self.model), **prefixed("trainer", vars(self.trainer)), **asdict(inputs)}

    def set_params(self, **params) -> NetworkCalibrator:
        """Change parameters of :meth:`get_params` (checked as by the constructor); the rest are kept."""
        check_params(params, param_names(SETTINGS), self.family)
        inputs = {k: v for k, v in params.items() if "." not in k}
        pair_features = self.pair_features
        if "oracle" in inputs:
            oracle = inputs["oracle"]
            if oracle not in ORACLES:
                raise InputError(f"{oracle!r} is not one of {list(ORACLES)}", setting="oracle")
            pair_features = JudgeAnswers(self.rubric, others=oracle == "others") if oracle else None
        return reconfigured(
            self,
            self._configure,
            {**self.model, **under("model", params)},
            {**vars(self.trainer), **under("trainer", params)},
            inputs.get("feature_questions", self.feature_questions),
            inputs.get("drop_questions", self.drop_questions),
            pair_features,
            inputs.get("llm_features", self.llm_features),
        )

    def new_net(self) -> CalibrationNet:
        """An untrained network of this calibrator's layout, judges and settings."""
        extra = self.pair_features.dim if self.pair_features is not None else 0
        args = (
            self._block_values() if self.llm_features else [],
            len(self.judges_.judges),
            [len(q.options) for q in self.rubric.questions],
        )
        settings = {k: v for k, v in self.model.items() if k not in NOT_NETWORK_KEYS}
        if self.model["head"] == "softmax":
            return CalibrationNet(*args, extra_dim=extra, **settings)
        blocks = [b.question_id for b in self.layout_.blocks] if self.llm_features else []
        return CumulativeNet(
            *args,
            head=self.model["head"],
            block_questions=blocks,
            question_ids=self.rubric.ids,
            monotone=bool(self.model.get("monotone", False)),
            extra_dim=extra,
            **settings,
        )

    def _block_values(self) -> list[list[float]]:
        """Option values of each feature block (:attr:`Block.values`); NaN for a block of a
        categorical rubric question (one that is not ``ordered``)."""
        categorical = lambda b: b.question_id in self.rubric and not self.rubric[b.question_id].ordered
        return [[math.nan] * len(b.options) if categorical(b) else b.values for b in self.layout_.blocks]

    @property
    def seeds(self) -> list[int]:
        """The members' seeds, independent streams spawned from ``seed`` (numpy's ``SeedSequence``):
        calibrators with different seeds share no member's initialisation, split, batch order or masks."""
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) or self.seed < 0:
            raise InputError(f"{self.seed!r} is not a non-negative integer", setting="seed")
        children = np.random.SeedSequence(int(self.seed)).spawn(int(self.model["ensemble"]))
        return [int(child.generate_state(1)[0]) for child in children]

    @property
    def net_(self) -> CalibrationNet:
        """The network of a single-member calibrator."""
        if len(self.nets_) != 1:
            raise AttributeError(f"an ensemble of {len(self.nets_)} networks has no single net_; use nets_")
        return self.nets_[0]

    @property
    def val_nll_(self) -> float:
        """Best held-out NLL of the last phase, averaged over members (nan without a validation split)."""
        values = [(s.get("finetune") or s.get("pretrain") or {}).get("val_nll") for s in self.summaries_]
        values = [v for v in values if v is not None]
        return float(np.mean(values)) if values else float("nan")

    def fit(self, tables: Tables) -> NetworkCalibrator:
        """Train on ``tables``; a fraction of its texts is held out for early stopping."""
        return fit_together([self], [tables])[0]

    @staticmethod
    def fit_many(
        calibrators: list,
        tables: list[Tables],
        judges: JudgeMap | None = None,
        progress=None,
        on_epoch=None,
        tolerate_divergence: bool = False,
    ) -> list:
        """Several calibrators fitted on their tables as one training program (:func:`fit_together`, which
        describes ``on_epoch``, pruning, and ``tolerate_divergence``)."""
        return fit_together(calibrators, tables, judges, on_epoch, tolerate_divergence, progress)

    def add_judge(
        self,
        tables: Tables,
        judge_id: str,
        min_annotations: int = 5,
        l2: float | str | None = "cv",
        max_iter: int = 200,
        l2_grid: tuple = (0.001, 0.01, 0.1, 1.0, 10.0),
        cv_folds: int = 5,
    ) -> NetworkCalibrator:
        """A copy that knows judge ``judge_id``, its own parameters fitted to its annotations in ``tables``, the
        shared ones frozen (:func:`llmrubric.model.families.network.judges.with_judge`)."""
        return with_judge(self, tables, judge_id, min_annotations, l2, max_iter, l2_grid, cv_folds)

    def judge_predictor(self, judges: list[str]):
        """A function x (texts, dim) → probabilities (texts, judges, questions, max options) of ``judges``
        (:func:`~llmrubric.model.families.network.judges.judge_predictor`: each judge folded into the weights)."""
        return judge_predictor(self, judges)

    def _members(self, tables: Tables, judges: JudgeMap | None = None, data: Encoded | None = None):
        """Set layout and judge map (``judges`` or those of ``tables``); untrained members with their
        training and early-stopping data, and the encoded ``tables`` (``data`` when given: ``tables``
        already encoded with this layout and judge map)."""
        layout = FeatureLayout.from_features(tables.features, self.rubric, self.model["sample_prior"])
        if self.feature_questions is not None or self.drop_questions:
            layout = layout.restrict(self.feature_questions, self.drop_questions)
        self.layout_, self.judges_ = layout, judges or JudgeMap.from_annotations(tables.annotations)
        self.answers_ = (
            None if self.pair_features is not None else AnswerModel.fit(tables.features, layout, self.rubric)
        )
        if self.pair_features is not None:
            self.pair_features.fit(tables)
        data = data if data is not None else self.encode(tables)
        systems = text_systems(tables)
        trains, vals, nets = [], [], []
        for seed in self.seeds:
            train, val = validation_split(data, seed, systems, self.trainer, self.group)
            torch.manual_seed(seed)
            net = self.new_net()
            net.standardize_inputs(train.x, train.judge)
            trains.append(train), vals.append(val), nets.append(net)
        return nets, trains, vals, data

    def encode(self, tables: Tables, pairs: pd.DataFrame | None = None) -> Encoded:
        absent_ok = self.answers_ is not None
        data = encode(tables, self.rubric, self.layout_, self.judges_, pairs, absent_ok)
        if self.pair_features is None:
            return data
        extra = torch.from_numpy(np.asarray(self.pair_features.transform(tables, data.pairs), dtype=np.float32))
        x = torch.cat([data.x, extra], dim=1) if self.llm_features else extra
        return Encoded(x, data.judge, data.y, data.pairs)

    def predict_proba(self, data: Tables | Encoded, pairs: pd.DataFrame | None = None) -> np.ndarray:
        """Probabilities (pairs, questions, max options; padded options 0), the members' average, of the
        annotated pairs of tables ``data`` (or its ``pairs``), or of pairs already encoded by :meth:`encode`.
        Texts of ``data`` with absent blocks are marginalised (:mod:`llmrubric.model.core.absent`)."""
        if not isinstance(data, Encoded):
            pairs = pairs_of(data.annotations) if pairs is None else pairs
            marginal = marginal_proba(self, data, pairs)
            if marginal is not None:
                return marginal
            data = self.encode(data, pairs)
        with one_thread():
            probs = torch.stack([net.probabilities(data.x, data.judge) for net in self.nets_]).mean(dim=0).numpy()
        check_finite_predictions(probs, self.source_)
        return probs

    def predict(
        self,
        tables: Tables,
        pairs: pd.DataFrame | None = None,
        questions: list[str] | None = None,
        data: Encoded | None = None,
    ) -> pd.DataFrame:
        """Predictions table for the annotated pairs of ``tables`` (or ``pairs``, or the already
        encoded ``data``), all questions by default."""
        marginal = None
        if data is None:
            pairs = pairs_of(tables.annotations) if pairs is None else pairs
            marginal = marginal_proba(self, tables, pairs)
            data = self.encode(tables, pairs)
        probs = self.predict_proba(data) if marginal is None else marginal
        ids = questions or self.rubric.ids
        index = [self.rubric.ids.index(q) for q in ids]
        return predictions_frame(data.pairs, [self.rubric[q] for q in ids], probs[:, index])

    def proba_completed(self, batch: CompletionBatch, completions: np.ndarray) -> np.ndarray:
        """(draws, pairs, questions, max options): the members' average for each completion
        (:class:`llmrubric.model.core.absent.CompletionBatch`), one pass over every (completion, pair)."""
        x = torch.from_numpy(batch.network_inputs(completions))
        draws, n_pairs = x.shape[:2]
        judge = torch.from_numpy(self.judges_.indices(batch.pairs.judge_id)).repeat(draws)
        with one_thread():
            rows = x.reshape(draws * n_pairs, -1)
            probs = torch.stack([net.probabilities(rows, judge) for net in self.nets_]).mean(dim=0).numpy()
        return probs.reshape(draws, n_pairs, *probs.shape[1:])

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """Metadata (rubric, judge map, layout, settings, training summaries, an oracle's inputs) and
        the members' weights (:func:`~llmrubric.model.families.network.checkpoint.network_state`)."""
        return network_state(self)

    def save(self, path: str | Path) -> Path:
        """Write one safetensors file with weights and everything needed to predict."""
        return write_checkpoint(path, *self.state())

    @classmethod
    def load(cls, path: str | Path) -> NetworkCalibrator:
        return load_model(path)

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> NetworkCalibrator:
        """The calibrator of :meth:`state`'s metadata and tensors (``source`` names them in errors)."""
        check_format(meta, source)
        trainer = {k: v for k, v in meta["trainer"].items() if k != "engine"}  # the choice of engine is gone
        oracle = meta.get("pair_features")
        pair_features = JudgeAnswers(rubric, **oracle) if oracle is not None else None
        self = cls(
            rubric, meta["model"], trainer, meta["seed"], None, None, pair_features, meta.get("llm_features", True)
        )
        return restored(self, meta, tensors, source)


PROGRAMS = {"stacked": train_stacked, "lbfgs": train_cumulative}  # how a network class trains: its ``program``


def _program(net: CalibrationNet, trainer: TrainConfig) -> tuple:
    """The training program a member joins: the stacked networks of one structure and accelerator
    train as one stack; the L-BFGS heads, each with its own optimiser, in one program."""
    if net.program == "stacked":
        return (net.program, *structure(net), trainer.accelerator)
    return (net.program,)


def checked_settings(settings: dict, rubric: Rubric) -> dict:
    """The network's ``model.*`` ``settings``, checked alone and against ``rubric`` (each error naming the setting)."""
    unknown = sorted(set(settings) - set(MODEL_KEYS))
    if unknown:
        raise InputError(
            f"unknown model setting(s) {unknown}; known: {list(MODEL_KEYS)}", setting=f"model.{unknown[0]}"
        )
    check_model(settings)
    if settings["family"] != "network":
        raise InputError(
            f"model.family={settings['family']} is not the network; build it with llmrubric.model.auto_settings.build_model",
            setting="model.family",
        )
    head = settings["head"]
    if head not in HEADS:
        raise InputError(f"model.head must be one of {list(HEADS)}, not {head!r}", setting="model.head")
    if head != "softmax" and (settings["personalize"] not in ("none", False) or settings["inputs"] == "probabilities"):
        raise InputError(
            f"model.head={head} personalizes by judge cut points and scores expected answers: it needs model.personalize=none "
            f"and model.inputs=expected or both (got {settings['personalize']!r}, {settings['inputs']!r})",
            setting="model.head",
        )
    unordered = [q.id for q in rubric.questions if not q.ordered]
    if head != "softmax" and unordered:
        raise InputError(
            f"model.head={head} needs ordered answer scales; question(s) {unordered} are categorical",
            file=rubric.source,
            setting="model.head",
        )
    return settings


def validation_split(
    data: Encoded, seed: int, systems: pd.Series, trainer: TrainConfig, group: str
) -> tuple[Encoded, Encoded | None]:
    """Training rows and the early-stopping rows (drawn with ``seed``): ``trainer.val_fraction`` of the
    texts, or the texts of that fraction of the systems (``systems``: text id → system id) where
    every text has one: under ``trainer.val_group=system`` when that is at least one system,
    under ``auto`` when ``group`` (the calibrator's) is ``system`` and it is at least ``trainer.val_min_systems``
    (one held-out system is one draw of the shift between systems); else by text."""
    if trainer.val_fraction <= 0:
        return data, None
    texts = groups = data.pairs.text_id.astype(str)
    minimum = {"system": 1, "auto": trainer.val_min_systems if group == "system" else None}
    need = minimum.get(trainer.val_group)
    if need is not None:
        by_system = texts.map(systems)
        if by_system.notna().all() and round(by_system.nunique() * trainer.val_fraction) >= need:
            groups = by_system
    _, held = holdout_texts(groups, trainer.val_fraction, seed)
    is_val = groups.isin(held).to_numpy()
    return data.take(np.flatnonzero(~is_val)), data.take(np.flatnonzero(is_val))


def fit_together(
    calibrators: list[NetworkCalibrator],
    tables: list[Tables],
    judges: JudgeMap | None = None,
    on_epoch=None,
    tolerate_divergence: bool = False,
    progress=None,
) -> list[NetworkCalibrator]:
    """Fit each calibrator on its tables; all their members train as one stacked program
    (:func:`llmrubric.model.families.network.engine.train_stacked`; one per network structure, e.g. two when some
    are personalized by judge deltas and others not, or when their training sets see different
    numbers of judges).

    Calibrators may differ in hidden sizes, input dropout, ensemble size and trainer numbers
    (e.g. the fold models of several search trials). ``judges`` fixes one judge map for all
    (needed to stack models whose training sets see different judges). ``on_epoch(phase,
    epoch, main_nll)``, with ``main_nll`` a dict {calibrator index: its members' held-out NLL
    of the main question this epoch (nan where stopped)}, is called after every epoch of a
    stacked program and may return calibrator indices to stop now (pruning). A calibrator whose training loss
    turned non-finite raises :class:`TrainingDiverged`, or with ``tolerate_divergence`` gets
    ``diverged_`` set to the reason. ``pruned_`` tells whether a calibrator was stopped.
    ``progress`` (a tqdm bar, optional) advances once per epoch of each stacked program.
    Each member joins the training program its class names (:data:`PROGRAMS`): the stacked networks
    above, or with a cumulative head (``model.head`` ordinal or combined) full-batch L-BFGS
    (:func:`llmrubric.model.families.network.cumulative.train_cumulative`); both run the same epoch loop
    (:func:`llmrubric.model.families.network.engine.run_phase`), pruning included.
    With ``trainer.temperature_scaling``, each member of a calibrator that finished then gets
    its per-question temperatures from its early-stopping split (:mod:`llmrubric.model.families.network.temperature`),
    and with ``trainer.ordinal_blend`` its per-question ordinal weights (:mod:`llmrubric.model.families.network.ordinal`).
    All of it runs on one torch thread: the tensors are small and more threads only contend.
    """
    with one_thread():
        return _fit_together(calibrators, tables, judges, on_epoch, tolerate_divergence, progress)


def _fit_together(calibrators, tables, judges, on_epoch, tolerate_divergence, progress) -> list[NetworkCalibrator]:
    cache: dict[tuple, Encoded] = {}
    members = []
    for i, (c, t) in enumerate(zip(calibrators, tables)):
        c.train_texts_ = texts_fingerprint(t.text_ids)
        key = (id(t), tuple(c.feature_questions or ()), c.feature_questions is None, tuple(c.drop_questions or ()))
        shareable = c.pair_features is None and judges is not None
        nets, trains, vals, data = c._members(t, judges, cache.get(key) if shareable else None)
        if shareable:
            cache[key] = data
        members += [(i, n, tr, v, s) for n, tr, v, s in zip(nets, trains, vals, c.seeds)]
    main = calibrators[0].rubric.ids.index(calibrators[0].rubric.main.id)
    summaries: list[dict] = [{}] * len(members)
    programs: dict[tuple, list[int]] = {}
    for m, (i, net, *_) in enumerate(members):
        programs.setdefault(_program(net, calibrators[i].trainer), []).append(m)
    for program, group in programs.items():
        owner = torch.tensor([members[m][0] for m in group])
        nets, trains, vals, seeds = ([members[m][k] for m in group] for k in (1, 2, 3, 4))
        configs = [calibrators[members[m][0]].trainer for m in group]

        def member_epoch(phase, epoch, val_nll, owner=owner):
            if on_epoch is None:
                return None
            stop = on_epoch(phase, epoch, {int(i): val_nll[owner == i] for i in owner.unique()})
            return torch.tensor([int(i) in set(stop or ()) for i in owner])

        result = PROGRAMS[program[0]](nets, trains, vals, main, configs, seeds, progress, member_epoch)
        for m, summary in zip(group, result):
            summaries[m] = summary
    for i, c in enumerate(calibrators):
        mine = [m for m, member in enumerate(members) if member[0] == i]
        c.nets_, c.summaries_ = [members[m][1] for m in mine], [summaries[m] for m in mine]
        stops = [
            (phase, s["stopped"], s["epochs"]) for m in mine for phase, s in summaries[m].items() if "stopped" in s
        ]
        c.pruned_ = any(reason == "pruned" for _, reason, _ in stops)
        diverged = [f"{phase} epoch {epochs}" for phase, reason, epochs in stops if reason == "diverged"]
        c.diverged_ = f"non-finite training loss ({', '.join(diverged)}; lr {c.trainer.lr:g})" if diverged else None
        if c.diverged_ and not tolerate_divergence:
            raise TrainingDiverged(f"training diverged: {c.diverged_}; lower trainer.lr")
        if c.pruned_ or c.diverged_:
            continue
        for m in mine:
            net, val = members[m][1], members[m][3]
            if val is None or not len(val):
                continue
            if c.trainer.temperature_scaling:
                summaries[m]["temperature"] = fit_temperature(net, val)
            if c.trainer.ordinal_blend:
                summaries[m]["ordinal_weight"] = fit_ordinal_weight(net, val, [q.ordered for q in c.rubric.questions])
    return calibrators


def _network(rubric: Rubric, setup: Setup) -> NetworkCalibrator:
    """The network of the ``model.*`` settings (its presets set parameters on it: ``conf/presets.yaml``)."""
    return NetworkCalibrator(rubric, {**setup.model, "family": "network"}, setup.trainer, setup.seed, group=setup.group)


NETWORK = dict(joint_fit=True, absent_blocks=True, add_judge=True, judge_scoring=True)  # the class's capabilities
register("network", _network, NetworkCalibrator, capabilities=Capabilities(**NETWORK), settings=SETTINGS)


def _personal_isotonic(rubric: Rubric, setup: Setup) -> PersonalIsotonic:
    """The network (``model.*`` settings) with its point predictions corrected per judge."""
    return PersonalIsotonic(_network(rubric, setup), rubric)


register(
    "personal_isotonic",
    _personal_isotonic,
    PersonalIsotonic,
    capabilities=Capabilities(corrects=True),
    settings=SETTINGS,
)
