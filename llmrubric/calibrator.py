"""LLM-Rubric as an estimator: fit on canonical tables, predict every judge's distributions, save/load.

Checkpoints are single safetensors files: the network weights plus JSON metadata holding
the rubric, judge map, feature layout and hyperparameters (no pickles).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llmrubric.data import Encoded, FeatureLayout, JudgeMap, encode
from llmrubric.errors import InputError
from llmrubric.model import CalibrationNet
from llmrubric.module import TrainConfig, predict_proba, train_network
from llmrubric.predictions import predictions_frame
from llmrubric.rubric import Rubric
from llmrubric.schemas import Tables, atomic_path
from llmrubric.splits import holdout_texts
from llmrubric.stacked import train_stacked

log = logging.getLogger(__name__)
FORMAT = "llmrubric-calibrator/2"
MODEL_KEYS = ("h1", "h2", "personalize", "inputs", "input_dropout", "ensemble")


class Calibrator:
    """The calibration network with the data plumbing around it.

    Args:
        rubric: questions and answer scales; its main question is finetuned.
        model: network settings (``h1, h2, personalize, inputs, input_dropout``; see :class:`CalibrationNet`)
            and ``ensemble``: the number of networks (seeds ``seed, seed + 1, …``, each with its
            own early-stopping split) whose average distribution is the prediction.
        trainer: :class:`TrainConfig` fields.
        seed: seeds initialisation, the early-stopping split and the batch order.
        feature_questions: use only the feature blocks of these questions (e.g. ``[Q0]``).
        drop_questions: leave out the feature blocks of these questions (ablations).
        pair_features: optional per-(text, judge) input columns appended to x, an object with
            ``fit(tables)``, ``dim`` and ``transform(tables, pairs) -> (pairs, dim)`` (the
            oracle studies' :class:`llmrubric.oracles.JudgeAnswers`); such a model is not saved.
        llm_features: False keeps only the ``pair_features`` as input (the oracle without LLM probabilities).
    """

    name = "llm_rubric"

    def __init__(
        self,
        rubric: Rubric,
        model: dict | None = None,
        trainer: dict | TrainConfig | None = None,
        seed: int = 0,
        feature_questions: list[str] | None = None,
        drop_questions: list[str] | None = None,
        pair_features=None,
        llm_features: bool = True,
    ):
        self.rubric = rubric
        self.model = {"h1": 25, "h2": 25, "personalize": "deltas", "inputs": "probabilities", "input_dropout": 0.0, "ensemble": 1, **(model or {})}
        unknown = sorted(set(self.model) - set(MODEL_KEYS))
        if unknown:
            raise InputError(f"unknown model setting(s) {unknown}; known: {list(MODEL_KEYS)}")
        self.trainer = trainer if isinstance(trainer, TrainConfig) else TrainConfig.from_dict(trainer)
        self.seed = seed
        self.feature_questions, self.drop_questions = feature_questions, drop_questions
        if not llm_features and pair_features is None:
            raise InputError("llm_features=False needs pair_features as the input")
        self.pair_features, self.llm_features = pair_features, llm_features

    def _net(self) -> CalibrationNet:
        extra = self.pair_features.dim if self.pair_features is not None else 0
        return CalibrationNet(
            self.layout_.values if self.llm_features else [],
            len(self.judges_.judges),
            [len(q.options) for q in self.rubric.questions],
            extra_dim=extra,
            **{k: v for k, v in self.model.items() if k != "ensemble"},
        )

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(int(self.model["ensemble"]))]

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

    def _split(self, data: Encoded, seed: int) -> tuple[Encoded, Encoded | None]:
        """Training rows and the early-stopping rows (``val_fraction`` of the texts, drawn with ``seed``)."""
        if self.trainer.val_fraction <= 0:
            return data, None
        _, val_texts = holdout_texts(data.pairs.text_id, self.trainer.val_fraction, seed)
        is_val = data.pairs.text_id.isin(val_texts).to_numpy()
        return data.take(np.flatnonzero(~is_val)), data.take(np.flatnonzero(is_val))

    def fit(self, tables: Tables) -> Calibrator:
        """Train on ``tables``; a fraction of its texts is held out for early stopping."""
        return fit_together([self], [tables])[0]

    def _members(self, tables: Tables, judges: JudgeMap | None = None) -> tuple[list[CalibrationNet], list[Encoded], list[Encoded | None]]:
        """Set layout and judge map (``judges`` or those of ``tables``); untrained members with their data."""
        layout = FeatureLayout.from_features(tables.features, self.rubric)
        if self.feature_questions is not None or self.drop_questions:
            layout = layout.restrict(self.feature_questions, self.drop_questions)
        self.layout_, self.judges_ = layout, judges or JudgeMap.from_annotations(tables.annotations)
        if self.pair_features is not None:
            self.pair_features.fit(tables)
        data = self.encode(tables)
        trains, vals, nets = [], [], []
        for seed in self.seeds:
            train, val = self._split(data, seed)
            torch.manual_seed(seed)
            net = self._net()
            net.standardize_inputs(train.x, train.judge)
            trains.append(train), vals.append(val), nets.append(net)
        return nets, trains, vals

    def encode(self, tables: Tables, pairs: pd.DataFrame | None = None) -> Encoded:
        data = encode(tables, self.rubric, self.layout_, self.judges_, pairs)
        if self.pair_features is None:
            return data
        extra = torch.from_numpy(np.asarray(self.pair_features.transform(tables, data.pairs), dtype=np.float32))
        x = torch.cat([data.x, extra], dim=1) if self.llm_features else extra
        return Encoded(x, data.judge, data.y, data.pairs)

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> tuple[Encoded, np.ndarray]:
        """Encoded pairs and their probabilities (pairs, questions, max options)."""
        data = self.encode(tables, pairs)
        return data, torch.stack([predict_proba(net, data) for net in self.nets_]).mean(dim=0).numpy()

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None, questions: list[str] | None = None) -> pd.DataFrame:
        """Predictions table for the annotated pairs of ``tables`` (or ``pairs``), all questions by default."""
        data, probs = self.predict_proba(tables, pairs)
        ids = questions or self.rubric.ids
        index = [self.rubric.ids.index(q) for q in ids]
        return predictions_frame(data.pairs, [self.rubric[q] for q in ids], probs[:, index])

    def save(self, path: str | Path) -> Path:
        """Write one safetensors file with weights and everything needed to predict."""
        if self.pair_features is not None:
            raise InputError("a calibrator with pair features (an oracle study model) cannot be saved", file=str(path))
        meta = {
            "format": FORMAT,
            "rubric": self.rubric.to_dict(),
            "main_question": self.rubric.main.id,
            "judges": list(self.judges_.judges),
            "layout": self.layout_.to_dict(),
            "model": self.model,
            "trainer": vars(self.trainer),
            "seed": self.seed,
            "summaries": self.summaries_,
        }
        tensors = {f"{m}.{k}": v.detach().contiguous() for m, net in enumerate(self.nets_) for k, v in net.state_dict().items()}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"llmrubric": json.dumps(meta)})
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> Calibrator:
        path = Path(path)
        if not path.is_file():
            raise InputError("checkpoint not found", file=str(path))
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("llmrubric", "{}"))
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:
            raise InputError(f"not a readable safetensors checkpoint: {e}", file=str(path)) from e
        if meta.get("format") != FORMAT:
            raise InputError(f"not an llmrubric calibrator checkpoint (format {meta.get('format')!r})", file=str(path))
        rubric = Rubric.from_dict(meta["rubric"], str(path)).with_main(meta["main_question"])
        self = cls(rubric, meta["model"], meta["trainer"], meta["seed"])
        self.layout_ = FeatureLayout.from_dict(meta["layout"])
        self.judges_ = JudgeMap(tuple(meta["judges"]))
        self.summaries_ = meta.get("summaries", [])
        self.nets_ = []
        for m in range(len(self.seeds)):
            net = self._net()
            net.load_state_dict({k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".", 1)[0] == str(m)})
            self.nets_.append(net.eval())
        return self


def fit_together(calibrators: list[Calibrator], tables: list[Tables], judges: JudgeMap | None = None, on_epoch=None) -> list[Calibrator]:
    """Fit each calibrator on its tables; with the stacked engine all their members train as one program.

    The calibrators must share network and trainer settings (e.g. the fold models of one
    configuration). ``judges`` fixes one judge map for all (needed to stack models whose
    training sets see different judges); ``on_epoch(phase, epoch, val_nll)`` is called
    after every epoch of the stacked program (see :func:`train_stacked`).
    """
    first = calibrators[0]
    if any(c.model != first.model or vars(c.trainer) != vars(first.trainer) for c in calibrators):
        raise ValueError("fit_together needs calibrators with the same model and trainer settings")
    prepared = [c._members(t, judges) for c, t in zip(calibrators, tables)]
    main = first.rubric.ids.index(first.rubric.main.id)
    nets = [n for p in prepared for n in p[0]]
    trains = [d for p in prepared for d in p[1]]
    vals = [d for p in prepared for d in p[2]]
    seeds = [s for c in calibrators for s in c.seeds]
    if first.trainer.engine == "stacked":
        summaries = train_stacked(nets, trains, vals, main, first.trainer, seeds, on_epoch=on_epoch)
    else:
        summaries = [train_network(n, t, v, main, first.trainer, s) for n, t, v, s in zip(nets, trains, vals, seeds)]
    offset = 0
    for c in calibrators:
        k = len(c.seeds)
        c.nets_, c.summaries_ = nets[offset : offset + k], summaries[offset : offset + k]
        offset += k
    return calibrators
