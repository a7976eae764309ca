"""Oracle inputs and personalised isotonic correction (LLM-Rubric Table 1, rows a–f).

:class:`JudgeAnswers` makes per-(text, judge) feature columns from human answers to the
rubric's other questions: the judge's own answers as one-hot vectors (the Oracle) or the
average one-hot vector of the *other* judges of the same text (the Depersonalized Oracle).
A :class:`~llmrubric.model.families.network.calibrator.NetworkCalibrator` appends them to its LLM features via
``pair_features=``. :class:`PersonalIsotonic` refits each judge's point predictions of a
judge-independent model with an isotonic regression (scikit-learn); registered as
``personal_isotonic`` (on the network, by :mod:`llmrubric.model.families.network.calibrator`), it saves
and loads like every family, its base model's state inside its own.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import torch
from sklearn.isotonic import IsotonicRegression

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.checkpoints import split_tensors
from llmrubric.model.core.encoding import PAIR, pairs_of, with_round
from llmrubric.model.core.registry import family_of

log = logging.getLogger(__name__)


class JudgeAnswers:
    """Per-pair one-hot human answers to the non-main questions.

    Args:
        rubric: the questions; its main question is never used as input.
        others: False: the pair's own judge's answers; True: for each pair, the mean one-hot
            answer of the other judges who annotated the same text (zeros if none).
        questions: the input questions (default: every question but the main one).

    ``transform`` returns (pairs, dim) float32: one block per question, in rubric order,
    with one column per option; an unanswered (NA) question is a zero block.
    """

    def __init__(self, rubric: Rubric, others: bool = False, questions: list[str] | None = None):
        self.rubric, self.others = rubric, others
        ids = questions if questions is not None else [q for q in rubric.ids if q != rubric.main.id]
        unknown = [q for q in ids if q not in rubric]
        if unknown:
            raise InputError(f"oracle input question(s) {unknown} are not in the rubric {rubric.ids}")
        if rubric.main.id in ids:
            raise InputError(f"the main question {rubric.main.id} cannot be an oracle input")
        self.questions = [q for q in rubric.ids if q in ids]

    def fit(self, tables: Tables) -> JudgeAnswers:
        return self

    def settings(self) -> dict:
        """The arguments that rebuild it (``JudgeAnswers(rubric, **settings)``): it has no fitted state."""
        return {"others": self.others, "questions": list(self.questions)}

    @property
    def dim(self) -> int:
        return sum(len(self.rubric[q].options) for q in self.questions)

    def columns(self) -> list[str]:
        return [f"{'others' if self.others else 'own'}/{q}/{k}" for q in self.questions for k in self.rubric[q].keys]

    def transform(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        """(len(pairs), dim) features of ``pairs`` (text_id, judge_id[, round]) from ``tables.annotations``."""
        ann = with_round(tables.annotations)
        ann = ann[ann.question_id.isin(self.questions)]
        pairs = with_round(pairs)[PAIR].astype(str).reset_index(drop=True)
        out = np.zeros((len(pairs), self.dim), dtype=np.float32)
        offset = 0
        for qid in self.questions:
            question = self.rubric[qid]
            k = len(question.keys)
            part = ann[ann.question_id == qid]
            onehot = np.zeros((len(part), k), dtype=np.float32)
            onehot[
                np.arange(len(part)),
                part.answer.map({key: i for i, key in enumerate(question.keys)}).to_numpy(np.int64),
            ] = 1.0
            cells = pd.DataFrame(onehot, columns=range(k)).assign(
                text_id=part.text_id.astype(str).to_numpy(),
                judge_id=part.judge_id.astype(str).to_numpy(),
                round=part["round"].astype(str).to_numpy(),
            )
            if self.others:
                values = self._others(cells, pairs, k)
            else:
                values = pairs.merge(cells, on=PAIR, how="left")[list(range(k))].fillna(0.0).to_numpy(np.float32)
            out[:, offset : offset + k] = values
            offset += k
        return out

    @staticmethod
    def _others(cells: pd.DataFrame, pairs: pd.DataFrame, k: int) -> np.ndarray:
        """Mean one-hot of the annotations of the pair's text by judges other than the pair's judge."""
        cols = list(range(k))
        text_sum = cells.groupby("text_id")[cols].sum()
        text_n = cells.groupby("text_id").size()
        own_sum = cells.groupby(["text_id", "judge_id"])[cols].sum()
        own_n = cells.groupby(["text_id", "judge_id"]).size()
        t = pd.Index(pairs.text_id)
        tj = pd.MultiIndex.from_frame(pairs[["text_id", "judge_id"]])
        total = text_sum.reindex(t).fillna(0.0).to_numpy() - own_sum.reindex(tj).fillna(0.0).to_numpy()
        count = text_n.reindex(t).fillna(0).to_numpy() - own_n.reindex(tj).fillna(0).to_numpy()
        return np.divide(total, count[:, None], out=np.zeros_like(total), where=count[:, None] > 0).astype(np.float32)

    def coverage(self, tables: Tables) -> float:
        """Share of the annotated pairs whose text has at least one other judge (what ``others=True`` needs)."""
        pairs = pairs_of(tables.annotations)
        judges = pairs.groupby("text_id").judge_id.nunique()
        return float((pairs.text_id.map(judges) > 1).mean()) if len(pairs) else 0.0


class PersonalIsotonic:
    """A method whose point predictions are corrected per judge by isotonic regression.

    The regression of each judge's observed answers on the base method's point predictions
    is fitted on the training data (the base model's in-sample predictions); judges with
    fewer than ``min_pairs`` training pairs, and unseen judges, keep the base prediction.
    The predicted distribution is the base method's; only ``mean`` changes.
    """

    FORMAT = "llmrubric-personal_isotonic/1"

    def __init__(self, base, rubric: Rubric, min_pairs: int = 2):
        self.base, self.rubric, self.min_pairs = base, rubric, min_pairs
        self.question = rubric.main

    def get_params(self) -> dict:
        """The base method's parameters."""
        return self.base.get_params()

    def set_params(self, **params) -> PersonalIsotonic:
        self.base.set_params(**params)
        return self

    def _main(self, predictions: pd.DataFrame) -> pd.DataFrame:
        return with_round(predictions[predictions.question_id == self.question.id]).reset_index(drop=True)

    def fit(self, tables: Tables) -> PersonalIsotonic:
        self.base.fit(tables)
        return self.calibrate(tables)

    def calibrate(self, tables: Tables) -> PersonalIsotonic:
        """Fit the per-judge isotonic regressions of an already fitted base on its training ``tables``."""
        pred = self._main(self.base.predict(tables))
        ann = with_round(tables.annotations[tables.annotations.question_id == self.question.id])
        merged = pred.merge(ann[PAIR + ["answer"]], on=PAIR, how="inner")
        y = merged.answer.map(lambda a: self.question.values[self.question.keys.index(a)]).to_numpy(float)
        values = np.asarray(self.question.values, float)
        self.models_ = {}
        for judge, rows in merged.groupby("judge_id").indices.items():
            if len(rows) >= self.min_pairs:
                model = IsotonicRegression(y_min=values.min(), y_max=values.max(), out_of_bounds="clip")
                self.models_[judge] = model.fit(merged["mean"].to_numpy()[rows], y[rows])
        return self

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
        pred = self._main(self.base.predict(tables, pairs))
        mean = pred["mean"].to_numpy(float).copy()
        for judge, rows in pred.groupby("judge_id").indices.items():
            if judge in self.models_:
                mean[rows] = self.models_[judge].predict(mean[rows])
        return pred.assign(mean=mean)

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray:
        """The base method's distributions (only the point predictions are corrected)."""
        return self.base.predict_proba(tables, pairs)

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The base model's state and each judge's isotonic steps (thresholds and values)."""
        base_meta, base_tensors = self.base.state()
        judges = list(self.models_)
        meta = {"format": self.FORMAT, "min_pairs": self.min_pairs, "judges": judges, "base": base_meta}
        tensors = {f"base/{k}": v for k, v in base_tensors.items()}
        for i, judge in enumerate(judges):
            model = self.models_[judge]
            tensors[f"isotonic/{i}.x"] = torch.from_numpy(np.asarray(model.X_thresholds_, dtype=np.float64))
            tensors[f"isotonic/{i}.y"] = torch.from_numpy(np.asarray(model.y_thresholds_, dtype=np.float64))
        return meta, tensors

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> PersonalIsotonic:
        """Each judge's isotonic regression refitted on its own steps (an isotonic sequence is its own fit)."""
        base = family_of(meta["base"]["format"], source).from_state(
            rubric, meta["base"], split_tensors(tensors, "base"), source
        )
        self = cls(base, rubric, meta["min_pairs"])
        values = np.asarray(self.question.values, float)
        self.models_ = {}
        for i, judge in enumerate(meta["judges"]):
            model = IsotonicRegression(y_min=values.min(), y_max=values.max(), out_of_bounds="clip")
            steps = split_tensors(tensors, "isotonic")
            self.models_[judge] = model.fit(steps[f"{i}.x"].numpy(), steps[f"{i}.y"].numpy())
        return self
