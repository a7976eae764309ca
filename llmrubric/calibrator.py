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

log = logging.getLogger(__name__)
FORMAT = "llmrubric-calibrator/1"
MODEL_KEYS = ("h1", "h2", "personalize", "input_dropout")


class Calibrator:
    """The calibration network with the data plumbing around it.

    Args:
        rubric: questions and answer scales; its main question is finetuned.
        model: network settings (``h1, h2, personalize, input_dropout``).
        trainer: :class:`TrainConfig` fields.
        seed: seeds initialisation, the early-stopping split and the batch order.
        feature_questions: use only the feature blocks of these questions (e.g. ``[Q0]``).
        drop_questions: leave out the feature blocks of these questions (ablations).
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
    ):
        self.rubric = rubric
        self.model = {"h1": 25, "h2": 25, "personalize": True, "input_dropout": 0.0, **(model or {})}
        unknown = sorted(set(self.model) - set(MODEL_KEYS))
        if unknown:
            raise InputError(f"unknown model setting(s) {unknown}; known: {list(MODEL_KEYS)}")
        self.trainer = trainer if isinstance(trainer, TrainConfig) else TrainConfig.from_dict(trainer)
        self.seed = seed
        self.feature_questions, self.drop_questions = feature_questions, drop_questions

    def _net(self) -> CalibrationNet:
        return CalibrationNet(
            self.layout_.dim, len(self.judges_.judges), [len(q.options) for q in self.rubric.questions], **self.model
        )

    def fit(self, tables: Tables) -> Calibrator:
        """Train on ``tables``; a fraction of its texts is held out for early stopping."""
        layout = FeatureLayout.from_features(tables.features, self.rubric)
        if self.feature_questions is not None or self.drop_questions:
            layout = layout.restrict(self.feature_questions, self.drop_questions)
        self.layout_, self.judges_ = layout, JudgeMap.from_annotations(tables.annotations)
        data = encode(tables, self.rubric, layout, self.judges_)
        val = None
        if self.trainer.val_fraction > 0:
            _, val_texts = holdout_texts(data.pairs.text_id, self.trainer.val_fraction, self.seed)
            is_val = data.pairs.text_id.isin(val_texts).to_numpy()
            data, val = data.take(np.flatnonzero(~is_val)), data.take(np.flatnonzero(is_val))
        torch.manual_seed(self.seed)
        self.net_ = self._net()
        self.net_.standardize_inputs(data.x)
        main = self.rubric.ids.index(self.rubric.main.id)
        self.summary_ = train_network(self.net_, data, val, main, self.trainer, self.seed)
        return self

    def encode(self, tables: Tables, pairs: pd.DataFrame | None = None) -> Encoded:
        return encode(tables, self.rubric, self.layout_, self.judges_, pairs)

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> tuple[Encoded, np.ndarray]:
        """Encoded pairs and their probabilities (pairs, questions, max options)."""
        data = self.encode(tables, pairs)
        return data, predict_proba(self.net_, data).numpy()

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None, questions: list[str] | None = None) -> pd.DataFrame:
        """Predictions table for the annotated pairs of ``tables`` (or ``pairs``), all questions by default."""
        data, probs = self.predict_proba(tables, pairs)
        ids = questions or self.rubric.ids
        index = [self.rubric.ids.index(q) for q in ids]
        return predictions_frame(data.pairs, [self.rubric[q] for q in ids], probs[:, index])

    def save(self, path: str | Path) -> Path:
        """Write one safetensors file with weights and everything needed to predict."""
        meta = {
            "format": FORMAT,
            "rubric": self.rubric.to_dict(),
            "main_question": self.rubric.main.id,
            "judges": list(self.judges_.judges),
            "layout": self.layout_.to_dict(),
            "model": self.model,
            "trainer": vars(self.trainer),
            "seed": self.seed,
            "summary": self.summary_,
        }
        tensors = {k: v.detach().contiguous() for k, v in self.net_.state_dict().items()}
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
        self.summary_ = meta.get("summary", {})
        self.net_ = self._net()
        self.net_.load_state_dict(tensors)
        self.net_.eval()
        return self
