"""Baselines of LLM-Rubric Table 1 with the calibrator's interface: ``fit(tables)``, ``predict(tables)``.

Each predicts the main question's distribution for every annotated (text, judge) pair and
a point value (``mean``): random draws from a uniform distribution; the LLM's own
distribution normalised over the options, decoded by argmax or expectation; the training
marginal; and ridge regression on the expected LLM answers plus judge indicators with a
discretised normal around its prediction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.linear_model import RidgeCV

from llmrubric.calibrator import Calibrator
from llmrubric.data import FeatureLayout, JudgeMap, pairs_of
from llmrubric.errors import InputError
from llmrubric.predictions import predictions_frame
from llmrubric.rubric import Rubric
from llmrubric.schemas import Tables


class MainQuestionBaseline:
    """Shared plumbing: predictions of the main question for the annotated pairs."""

    name = "baseline"

    def __init__(self, rubric: Rubric, seed: int = 0):
        self.rubric, self.seed = rubric, seed
        self.question = rubric.main

    def fit(self, tables: Tables):
        return self

    def _predict(self, tables: Tables, pairs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        probs, means = self._predict(tables, pairs)
        return predictions_frame(pairs, [self.question], probs[:, None, :], None if means is None else means[:, None])

    def _llm_distribution(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        """(pairs, options) the LLM's main-question distribution over the human options, normalised."""
        blocks = [b for b in FeatureLayout.from_features(tables.features, self.rubric).blocks if b.question_id == self.question.id]
        if len(blocks) != 1:
            raise InputError(f"the LLM baselines need exactly one feature block of {self.question.id}, found {[b.name for b in blocks]}")
        layout = FeatureLayout(tuple(blocks))
        texts = sorted(pairs.text_id.unique())
        x = layout.matrix(tables.features, texts)[:, : len(blocks[0].options)]
        keep = [blocks[0].options.index(k) for k in self.question.keys if k in blocks[0].options]
        p = x[:, keep].astype(np.float64)
        z = p.sum(axis=1, keepdims=True)
        if (z <= 0).any():
            raise InputError(f"{int((z <= 0).sum())} texts have no LLM mass on the options of {self.question.id}")
        return (p / z)[pairs.text_id.map({t: i for i, t in enumerate(texts)}).to_numpy()]


class RandomBaseline(MainQuestionBaseline):
    """A uniformly random answer per pair (seeded); its distribution is uniform."""

    name = "random"

    def _predict(self, tables, pairs):
        k = len(self.question.options)
        draws = np.random.default_rng(self.seed).integers(0, k, len(pairs))
        return np.full((len(pairs), k), 1 / k), np.asarray(self.question.values)[draws]


class ArgmaxLLM(MainQuestionBaseline):
    """The LLM's most probable answer; distribution = the LLM's, normalised."""

    name = "argmax_llm"

    def _predict(self, tables, pairs):
        p = self._llm_distribution(tables, pairs)
        return p, np.asarray(self.question.values)[p.argmax(axis=1)]


class ExpectedLLM(MainQuestionBaseline):
    """The expected answer under the LLM's normalised distribution."""

    name = "expected_llm"

    def _predict(self, tables, pairs):
        return self._llm_distribution(tables, pairs), None


class ConstantBaseline(MainQuestionBaseline):
    """The training marginal of the main question (its mean is the training mean)."""

    name = "constant"

    def fit(self, tables):
        answers = tables.annotations[tables.annotations.question_id == self.question.id].answer
        counts = answers.value_counts().reindex(list(self.question.keys), fill_value=0).to_numpy(float)
        self.marginal_ = (counts + 1e-3) / (counts + 1e-3).sum()
        return self

    def _predict(self, tables, pairs):
        return np.tile(self.marginal_, (len(pairs), 1)), None


class RidgeJudge(MainQuestionBaseline):
    """Ridge regression of the main answer on every block's expected LLM answer plus judge indicators.

    Its distribution is a normal with the training residual spread, discretised onto the
    options (bins between midpoints, open at both ends).
    """

    name = "ridge_judge"

    def _design(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        texts = sorted(pairs.text_id.unique())
        x = self.layout_.matrix(tables.features, texts)
        columns, offset = [], 0
        for block in self.layout_.blocks:
            k = len(block.options)
            p = x[:, offset : offset + k].astype(np.float64)
            values = np.array([float(o) for o in block.options])
            z = p.sum(axis=1)
            columns.append(np.divide(p @ values, z, out=np.full(len(z), values.mean()), where=z > 0))
            offset += k
        text_x = np.stack(columns, axis=1)[pairs.text_id.map({t: i for i, t in enumerate(texts)}).to_numpy()]
        judge = self.judges_.indices(pairs.judge_id)
        onehot = np.zeros((len(pairs), len(self.judges_.judges)))
        onehot[judge >= 0, judge[judge >= 0]] = 1.0
        return np.hstack([text_x, onehot])

    def fit(self, tables):
        self.layout_ = FeatureLayout.from_features(tables.features, self.rubric)
        self.judges_ = JudgeMap.from_annotations(tables.annotations)
        ann = tables.annotations[tables.annotations.question_id == self.question.id]
        pairs = pairs_of(ann)
        y = ann.set_index(["text_id", "judge_id", "round"]).loc[pd.MultiIndex.from_frame(pairs[["text_id", "judge_id", "round"]]), "answer"]
        y = y.map(lambda a: self.question.values[self.question.keys.index(a)]).to_numpy(float)
        x = self._design(tables, pairs)
        self.model_ = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(x, y)
        self.sigma_ = float(np.std(y - self.model_.predict(x)))
        return self

    def _predict(self, tables, pairs):
        mu = self.model_.predict(self._design(tables, pairs))
        values = np.asarray(self.question.values)
        edges = np.concatenate([[-np.inf], (values[1:] + values[:-1]) / 2, [np.inf]])
        cdf = stats.norm.cdf((edges[None, :] - mu[:, None]) / self.sigma_)
        return np.diff(cdf, axis=1), mu


def make_method(name: str, rubric: Rubric, seed: int = 0, model: dict | None = None, trainer: dict | None = None):
    """A method of Table 1 by name, unfitted."""
    simple = {c.name: c for c in (RandomBaseline, ArgmaxLLM, ExpectedLLM, ConstantBaseline, RidgeJudge)}
    if name in simple:
        return simple[name](rubric, seed)
    model = dict(model or {})
    if name == "llm_rubric":
        return Calibrator(rubric, model, trainer, seed)
    if name == "no_personalization":
        return Calibrator(rubric, {**model, "personalize": "none"}, trainer, seed)
    if name == "llm_rubric_single":
        return Calibrator(rubric, {**model, "ensemble": 1}, trainer, seed)
    if name == "llm_rubric_paper":
        return Calibrator(rubric, {**model, "personalize": "deltas", "inputs": "probabilities", "input_dropout": 0.0, "ensemble": 1}, trainer, seed)
    if name == "calibrated_q0":
        return Calibrator(rubric, model, trainer, seed, feature_questions=[rubric.main.id])
    raise InputError(f"unknown method {name!r}; known: {sorted(simple) + ['calibrated_q0', 'llm_rubric', 'llm_rubric_paper', 'llm_rubric_single', 'no_personalization']}")


METHODS = ("random", "argmax_llm", "expected_llm", "calibrated_q0", "constant", "ridge_judge", "no_personalization", "llm_rubric_paper", "llm_rubric")
DETERMINISTIC = ("argmax_llm", "expected_llm", "constant", "ridge_judge")
