"""Baselines of LLM-Rubric Table 1 with the calibrator's interface: ``fit(tables)``, ``predict(tables)``.

Each predicts the main question's distribution for every annotated (text, judge) pair and
a point value (``mean``): random draws from a uniform distribution; the LLM's own
distribution normalised over the options, decoded by argmax or expectation; the training
marginal; and ridge regression on the expected LLM answers plus judge indicators with a
discretised normal around its prediction.

With several LLM sources (models, prompt variants) answering the main question,
``expected_llm/<source>`` and ``argmax_llm/<source>`` use one source and the unqualified
names the mean of the sources' normalised distributions (whose expected answer is the
mean of the sources' expected answers); :func:`expand_baselines` names them for a data set.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.linear_model import LogisticRegression, RidgeCV
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from llmrubric.io.errors import InputError
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Rubric
from llmrubric.io.schemas import Tables, source_of
from llmrubric.model.calibrator import Calibrator
from llmrubric.model.encoding import Block, FeatureLayout, JudgeMap, pairs_of
from llmrubric.training.threads import one_thread


class MainQuestionBaseline:
    """Shared plumbing: predictions of the main question for the annotated pairs."""

    name = "baseline"

    def __init__(self, rubric: Rubric, seed: int = 0, source: str | None = None):
        self.rubric, self.seed, self.source = rubric, seed, source
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
        """(pairs, options) the LLM's main-question distribution over the human options, normalised
        per source, then averaged over the sources that answered the text (or ``self.source`` only)."""
        blocks = main_blocks(tables.features, self.rubric)
        if self.source is not None:
            blocks = [b for b in blocks if b.source == self.source]
        if not blocks:
            wanted = f"source {self.source!r} for " if self.source is not None else ""
            raise InputError(
                f"the LLM baselines need the LLM's answers to {self.question.id}: no feature block of {wanted}{self.question.id}",
                file=source_of(tables.features),
                column="question_id",
            )
        texts = sorted(pairs.text_id.unique())
        total, count = np.zeros((len(texts), len(self.question.keys))), np.zeros((len(texts), 1))
        for block in blocks:
            x = FeatureLayout((block,)).matrix(tables.features, texts)[:, : len(block.options)]
            p = x[:, [block.options.index(k) for k in self.question.keys if k in block.options]].astype(np.float64)
            z = p.sum(axis=1, keepdims=True)
            total += np.divide(p, z, out=np.zeros_like(p), where=z > 0)
            count += z > 0
        if (count == 0).any():
            raise InputError(
                f"{int((count == 0).sum())} texts have no LLM mass on the options of {self.question.id} (first: {texts[int(np.argmin(count))]!r})",
                file=source_of(tables.features),
                column="prob",
            )
        return (total / count)[pairs.text_id.map({t: i for i, t in enumerate(texts)}).to_numpy()]


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
    """Ridge regression of the main answer on every feature block plus judge indicators.

    Each block gives its expected answer (ordered numeric options), its probability (a block
    of one option, e.g. a summary's ``covered`` fraction) or its normalised distribution
    (categories); a block missing for a text takes the training mean. For an ordered main
    question the distribution is a normal with the training residual spread, discretised
    onto the options (bins between midpoints, open at both ends); for a categorical one the
    regression is an L2-penalised multinomial logistic regression on the same inputs (penalty
    chosen by 5-fold CV log loss).
    """

    name = "ridge_judge"

    def _block_columns(self, block: Block, p: np.ndarray) -> np.ndarray:
        """(texts, columns) of one block's probabilities ``p``; NaN where the block is missing."""
        z = p.sum(axis=1, keepdims=True)
        if len(block.options) == 1:
            return np.where(z > 0, p, np.nan)
        dist = np.divide(p, z, out=np.full_like(p, np.nan), where=z > 0)
        question = self.rubric[block.question_id] if block.question_id in self.rubric else None
        try:
            values = np.array([float(o) for o in block.options])
        except ValueError:
            values = None
        if values is not None and (question is None or question.ordered):
            return dist @ values[:, None]
        return dist[:, :-1]

    def _text_columns(self, tables: Tables, texts: list[str]) -> np.ndarray:
        """(texts, columns) of every block; NaN where a block is missing."""
        x = self.layout_.matrix(tables.features, texts).astype(np.float64)
        columns, offset = [], 0
        for block in self.layout_.blocks:
            columns.append(self._block_columns(block, x[:, offset : offset + len(block.options)]))
            offset += len(block.options)
        return np.hstack(columns)

    def _design(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        texts = sorted(pairs.text_id.unique())
        text_x = self._text_columns(tables, texts)
        text_x = np.where(np.isnan(text_x), self.fill_, text_x)[
            pairs.text_id.map({t: i for i, t in enumerate(texts)}).to_numpy()
        ]
        judge = self.judges_.indices(pairs.judge_id)
        onehot = np.zeros((len(pairs), len(self.judges_.judges)))
        onehot[judge >= 0, judge[judge >= 0]] = 1.0
        return np.hstack([text_x, onehot])

    def fit(self, tables):
        self.layout_ = FeatureLayout.from_features(tables.features, self.rubric)
        self.judges_ = JudgeMap.from_annotations(tables.annotations)
        ann = tables.annotations[tables.annotations.question_id == self.question.id]
        pairs = pairs_of(ann)
        self.fill_ = (
            pd.DataFrame(self._text_columns(tables, sorted(pairs.text_id.unique()))).mean().fillna(0.0).to_numpy()
        )
        answers = ann.set_index(["text_id", "judge_id", "round"]).loc[
            pd.MultiIndex.from_frame(pairs[["text_id", "judge_id", "round"]]), "answer"
        ]
        index = pd.Index(self.question.keys).get_indexer(answers)
        x = self._design(tables, pairs)
        if self.question.ordered:
            y = np.asarray(self.question.values)[index]
            self.model_ = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(x, y)
            self.sigma_ = float(np.std(y - self.model_.predict(x)))
        else:
            pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
            grid = {"logisticregression__C": np.logspace(-3, 3, 7)}
            with one_thread(blas=True):  # small problems: threads only contend
                self.model_ = GridSearchCV(pipeline, grid, scoring="neg_log_loss", cv=5).fit(x, index)
        return self

    def _predict(self, tables, pairs):
        x = self._design(tables, pairs)
        if not self.question.ordered:
            probs = np.zeros((len(pairs), len(self.question.options)))
            probs[:, self.model_.classes_] = self.model_.predict_proba(x)
            return (probs + 1e-3) / (1 + 1e-3 * probs.shape[1]), None
        mu = self.model_.predict(x)
        values = np.asarray(self.question.values)
        edges = np.concatenate([[-np.inf], (values[1:] + values[:-1]) / 2, [np.inf]])
        cdf = stats.norm.cdf((edges[None, :] - mu[:, None]) / self.sigma_)
        return np.diff(cdf, axis=1), mu


def main_blocks(features: pd.DataFrame, rubric: Rubric) -> list[Block]:
    """The feature blocks that answer the rubric's main question, one per LLM source."""
    return [b for b in FeatureLayout.from_features(features, rubric).blocks if b.question_id == rubric.main.id]


def expand_baselines(names: list[str], rubric: Rubric, features: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """The baselines ``names`` for this data: the methods to run and those skipped, with the reason.

    With several sources answering the main question, each LLM baseline (``argmax_llm``,
    ``expected_llm``) becomes one method per source (``expected_llm/<source>``) followed by the
    unqualified name (the mean over the sources); with none, it is skipped.
    """
    sources = [b.source for b in main_blocks(features, rubric)]
    methods, skipped = [], {}
    for name in names:
        if name not in LLM_METHODS:
            methods.append(name)
        elif not sources:
            skipped[name] = f"no LLM source answered the main question {rubric.main.id} in the features"
        else:
            methods += ([f"{name}/{s}" for s in sources] if len(sources) > 1 else []) + [name]
    return methods, skipped


def make_method(name: str, rubric: Rubric, seed: int = 0, model: dict | None = None, trainer: dict | None = None):
    """A method of Table 1 by name, unfitted; ``argmax_llm/<source>``, ``expected_llm/<source>``: one LLM source."""
    simple = {c.name: c for c in (RandomBaseline, ArgmaxLLM, ExpectedLLM, ConstantBaseline, RidgeJudge)}
    if name in simple:
        return simple[name](rubric, seed)
    method, _, source = name.partition("/")
    if method in LLM_METHODS and source:
        return simple[method](rubric, seed, source)
    model = dict(model or {})
    if name == "llm_rubric":
        return Calibrator(rubric, model, trainer, seed)
    if name == "no_personalization":
        return Calibrator(rubric, {**model, "personalize": "none"}, trainer, seed)
    if name == "llm_rubric_single":
        return Calibrator(rubric, {**model, "ensemble": 1}, trainer, seed)
    if name == "llm_rubric_paper":
        return Calibrator(
            rubric,
            {**model, "personalize": "deltas", "inputs": "probabilities", "input_dropout": 0.0, "ensemble": 1},
            trainer,
            seed,
        )
    if name == "calibrated_q0":
        return Calibrator(rubric, model, trainer, seed, feature_questions=[rubric.main.id])
    raise InputError(
        f"unknown method {name!r}; known: {sorted(simple) + ['calibrated_q0', 'llm_rubric', 'llm_rubric_paper', 'llm_rubric_single', 'no_personalization']}"
    )


LLM_METHODS = ("argmax_llm", "expected_llm")
METHODS = (
    "random",
    "argmax_llm",
    "expected_llm",
    "calibrated_q0",
    "constant",
    "ridge_judge",
    "no_personalization",
    "llm_rubric_paper",
    "llm_rubric",
)
DETERMINISTIC = ("argmax_llm", "expected_llm", "constant", "ridge_judge")
