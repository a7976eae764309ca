"""Baselines of LLM-Rubric Table 1 and those a careful user tries first, with the estimator
interface (:mod:`llmrubric.model.core.checkpoints`).

Each predicts the main question's distribution for every annotated (text, judge) pair and
a point value (``mean``): random draws from a uniform distribution; the LLM's own
distribution normalised over the options, decoded by argmax or expectation (``mean_of_sources``:
the mean over the sources that answered); that mean mapped by a line fitted on the training
systems' means (``raw_linear_system``); the training marginal; and ridge regression on the
expected LLM answers plus judge indicators with a discretised normal around its prediction
(every question: it is also a candidate of ``model=auto``).

With several LLM sources (models, prompt variants) answering the main question,
``expected_llm/<source>`` and ``argmax_llm/<source>`` use one source and the unqualified
names the mean of the sources' normalised distributions (whose expected answer is the
mean of the sources' expected answers); :func:`expand_baselines` names them for a data set.
Each registers under its name in :mod:`llmrubric.model.core.registry` and saves its (small) fitted
state like every family; ``mean_of_sources`` is ``expected_llm`` under a second name, so a run of
both lists it once (:func:`duplicates`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch
from scipy import special, stats
from sklearn.linear_model import LogisticRegression, RidgeCV
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from llmrubric.config import LinearConfig
from llmrubric.io.errors import InputError
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, source_of
from llmrubric.model.core.absent import CompletionBatch, marginal_proba
from llmrubric.model.core.answers import AnswerModel, answers_from_state, answers_state
from llmrubric.model.core.columns import text_columns
from llmrubric.model.core.context import centre_of, contextual_columns, system_means, text_systems
from llmrubric.model.core.encoding import Block, FeatureLayout, JudgeMap, pairs_of, question_targets
from llmrubric.model.core.params import check_params, replaced
from llmrubric.model.core.registry import Capabilities, Setup, entry, make, register, with_capability
from llmrubric.model.core.threads import one_thread


class MainQuestionBaseline:
    """Shared plumbing: the estimator interface (:mod:`llmrubric.model.core.checkpoints`) of a method that
    predicts the main question only; a pair it cannot predict (a text without the LLM's answer to the
    main question) is left out of :meth:`predict` and NaN in :meth:`predict_proba`."""

    name = "baseline"
    FORMAT = "llmrubric-baseline/1"
    FITTED: tuple[str, ...] = ()  # the fitted attributes (numbers or arrays) that state() saves

    def __init__(self, rubric: Rubric, seed: int = 0, source: str | None = None):
        self.rubric, self.seed, self.source = rubric, seed, source
        self.question = rubric.main

    def fit(self, tables: Tables):
        return self

    def get_params(self) -> dict:
        """None: what it does is its name's (and its source's)."""
        return {}

    def set_params(self, **params) -> MainQuestionBaseline:
        check_params(params, [], self.name)
        return self

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The seed and LLM source, and the :attr:`FITTED` attributes as float64 tensors."""
        meta = {"format": self.FORMAT, "seed": self.seed, "source": self.source}
        return meta, {k: torch.from_numpy(np.asarray(getattr(self, k), dtype=np.float64)) for k in self.FITTED}

    @classmethod
    def from_state(cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"):
        self = cls(rubric, meta["seed"], meta["source"])
        for key in cls.FITTED:
            setattr(self, key, tensors[key].numpy()[()])
        return self

    def _predict(self, tables: Tables, pairs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
        pairs = pairs_of(tables.annotations) if pairs is None else pairs.reset_index(drop=True)
        probs, means = self._predict(tables, pairs)
        rows = np.flatnonzero(np.isfinite(probs).all(axis=1))
        means = None if means is None else means[rows, None]
        return predictions_frame(pairs.iloc[rows], [self.question], probs[rows, None, :], means)

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray:
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        return questions_proba(self.rubric, {self.question.id: self._predict(tables, pairs)[0]}, len(pairs))

    def _llm_distribution(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        """(pairs, options) the LLM's main-question distribution over the human options, normalised
        per source, then averaged over the sources that answered the text (or ``self.source`` only);
        NaN for a text that no (such) source answered."""
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
        mean = np.divide(total, count, out=np.full_like(total, np.nan), where=count > 0)
        return mean[pairs.text_id.map({t: i for i, t in enumerate(texts)}).to_numpy()]


ALPHAS = np.logspace(-3, 3, 13)  # the ridge penalties RidgeCV chooses from (leave-one-out)


def questions_proba(rubric: Rubric, probs: dict[str, np.ndarray], n: int) -> np.ndarray:
    """(n, rubric questions, max options) from each predicted question's (n, options): NaN for the
    others, 0 in the padding."""
    out = np.full((n, len(rubric.questions), max(len(q.options) for q in rubric.questions)), np.nan)
    for qid, p in probs.items():
        q = rubric.ids.index(qid)
        out[:, q, : p.shape[1]], out[:, q, p.shape[1] :] = p, 0.0
    return out


class RandomBaseline(MainQuestionBaseline):
    """A uniformly random answer per pair (seeded); its distribution is uniform."""

    name = "random"
    FORMAT = "llmrubric-random/1"

    def _predict(self, tables, pairs):
        k = len(self.question.options)
        draws = np.random.default_rng(self.seed).integers(0, k, len(pairs))
        return np.full((len(pairs), k), 1 / k), np.asarray(self.question.values)[draws]


class ArgmaxLLM(MainQuestionBaseline):
    """The LLM's most probable answer; distribution = the LLM's, normalised."""

    name = "argmax_llm"
    FORMAT = "llmrubric-argmax_llm/1"

    def _predict(self, tables, pairs):
        p = self._llm_distribution(tables, pairs)
        best = np.nan_to_num(p, nan=-1.0).argmax(axis=1)
        return p, np.where(np.isnan(p).any(axis=1), np.nan, np.asarray(self.question.values)[best])


class ExpectedLLM(MainQuestionBaseline):
    """The expected answer under the LLM's normalised distribution."""

    name = "expected_llm"
    FORMAT = "llmrubric-expected_llm/1"

    def _predict(self, tables, pairs):
        return self._llm_distribution(tables, pairs), None


class MeanOfSources(ExpectedLLM):
    """The mean of the LLM sources' normalised distributions of the main question (its expected
    answer is the mean of the sources' expected answers), over the sources that answered each text."""

    name = "mean_of_sources"
    FORMAT = "llmrubric-mean_of_sources/1"


class ConstantBaseline(MainQuestionBaseline):
    """The training marginal of the main question (its mean is the training mean)."""

    name = "constant"
    FORMAT = "llmrubric-constant/1"
    FITTED = ("marginal_",)

    def fit(self, tables):
        answers = tables.annotations[tables.annotations.question_id == self.question.id].answer
        counts = answers.value_counts().reindex(list(self.question.keys), fill_value=0).to_numpy(float)
        self.marginal_ = (counts + 1e-3) / (counts + 1e-3).sum()
        return self

    def _predict(self, tables, pairs):
        return np.tile(self.marginal_, (len(pairs), 1)), None


class RawLinearSystem(MainQuestionBaseline):
    """The mean of sources' expected answer mapped by a line fitted on the training systems' means
    (human mean of each system against the mean of its texts' LLM answers; on the texts' means when
    the training data have fewer than 2 systems), with a normal of the training pairs' residual
    spread discretised onto the options. A text no source answered gets no prediction."""

    name = "raw_linear_system"
    FORMAT = "llmrubric-raw_linear_system/1"
    FITTED = ("slope_", "intercept_", "sigma_")

    def fit(self, tables):
        pairs, y = answered_pairs(tables, self.question)
        x = _expected(self._llm_distribution(tables, pairs), self.question)
        ok = ~np.isnan(x)
        groups = pairs.text_id.map(_text_system(tables)) if _text_system(tables).nunique() >= 2 else pairs.text_id
        frame = pd.DataFrame({"group": groups[ok].to_numpy(), "x": x[ok], "y": y[ok]}).groupby("group").mean()
        if len(frame) < 2 or np.ptp(frame.x) == 0:
            raise InputError(
                f"{self.name} needs at least 2 systems (or texts) with different LLM answers to fit a line"
            )
        self.slope_, self.intercept_ = np.polyfit(frame.x.to_numpy(), frame.y.to_numpy(), 1)
        self.sigma_ = max(float(np.std(y[ok] - (self.intercept_ + self.slope_ * x[ok]))), 1e-3)
        return self

    def _predict(self, tables, pairs):
        mu = self.intercept_ + self.slope_ * _expected(self._llm_distribution(tables, pairs), self.question)
        return discretised_normal(mu, self.sigma_, self.question), mu


def _expected(p: np.ndarray, question) -> np.ndarray:
    return p @ np.asarray(question.values, dtype=float)


def _text_system(tables: Tables) -> pd.Series:
    """text id → system id (empty when the data have none)."""
    for source in (tables.texts, tables.annotations):
        if source is not None and "system_id" in source and source.system_id.notna().any():
            return source.dropna(subset=["system_id"]).drop_duplicates("text_id").set_index("text_id").system_id
    return pd.Series(dtype=object)


def answered_pairs(tables: Tables, question) -> tuple[pd.DataFrame, np.ndarray]:
    """The pairs that answered ``question`` and their answers' values (ordered) or option indices."""
    pairs, index = question_targets(tables, question)
    return pairs, (np.asarray(question.values)[index] if question.ordered else index)


def discretised_normal(mu: np.ndarray, sigma: float, question) -> np.ndarray:
    """(n, options): a normal around ``mu`` integrated over bins between the options' midpoints
    (open at both ends); NaN rows where ``mu`` is NaN."""
    values = np.asarray(question.values)
    edges = np.concatenate([[-np.inf], (values[1:] + values[:-1]) / 2, [np.inf]])
    return np.diff(stats.norm.cdf((edges[None, :] - np.asarray(mu)[:, None]) / sigma), axis=1)


class RidgeJudge(MainQuestionBaseline):
    """Ridge regression of each question's answer on every feature block plus judge indicators.

    Each block gives one value per text (:mod:`llmrubric.model.core.columns`); a block missing for a
    training text takes the training mean, one absent from a text to predict is marginalised
    (:mod:`llmrubric.model.core.absent`). For an ordered question the distribution is a normal with the
    training residual spread, discretised onto the options (:func:`discretised_normal`); for a
    categorical one the regression is an L2-penalised multinomial logistic regression on the same
    inputs (penalty chosen by 5-fold CV log loss). ``fit(tables, questions)`` fits the given
    questions (default: every question with annotations; Table 1 needs only the main one; model=auto's inner
    folds fit the other questions without it).

    ``linear.contextual`` (``ridge_context``) adds each text's system means of the columns, less
    their training centre (:mod:`llmrubric.model.core.context`): their coefficients are the
    between-system slopes less the within ones, so penalising them shrinks the between slopes to
    the within ones. Their penalty is the within one / s², s chosen from ``linear.context_scales``
    by cross-validation over the training systems (0, the plain ridge, with fewer than 3).
    """

    name = "ridge_judge"
    family = "ridge_judge"
    FORMAT = "llmrubric-ridge_judge/1"

    def __init__(self, rubric: Rubric, seed: int = 0, source: str | None = None, linear: LinearConfig | None = None):
        super().__init__(rubric, seed, source)
        self._configure(linear or LinearConfig())
        self.context_cache_: dict[str, np.ndarray] = {}
        self.answers_: AnswerModel | None = None  # fitted by fit (None in an old checkpoint)
        self.source_: str | None = None  # the checkpoint it was loaded from

    def _configure(self, linear: LinearConfig) -> None:
        self.linear = linear
        self.contextual = bool(self.linear.contextual)
        self.name = "ridge_context" if self.contextual else "ridge_judge"

    def get_params(self) -> dict:
        """The ``model.linear`` settings (:class:`LinearConfig`)."""
        return asdict(self.linear)

    def set_params(self, **params) -> RidgeJudge:
        self._configure(replaced(self.linear, params, self.name))
        return self

    @property
    def questions_(self) -> list[str]:
        """The questions it predicts (those fitted)."""
        return list(self.fits_)

    def _design(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
        texts = sorted(pairs.text_id.unique())
        absent_ok = self.answers_ is not None
        text_x = text_columns(self.layout_, self.rubric, tables.features, texts, absent_ok)
        rows = pairs.text_id.map({t: i for i, t in enumerate(texts)}).to_numpy()
        return self._design_rows(text_x[rows], self.judges_.indices(pairs.judge_id), self._context(tables, pairs))

    def _context(self, tables: Tables, pairs: pd.DataFrame) -> np.ndarray | None:
        """(pairs, columns) the contextual columns of the pairs' texts: their system means over every
        text of ``tables.features`` (kept for :meth:`proba_completed`); None when not contextual."""
        if not self.contextual:
            return None
        every = sorted(tables.features.text_id.astype(str).unique())
        absent_ok = self.answers_ is not None
        columns = text_columns(self.layout_, self.rubric, tables.features, every, absent_ok)
        context = contextual_columns(system_means(columns, every, text_systems(tables)), self.centre_)
        self.context_cache_.update(zip(every, context))
        return self._cached_context(pairs)

    def _cached_context(self, pairs: pd.DataFrame) -> np.ndarray | None:
        """The contextual columns of the pairs' texts last seen by :meth:`_context` (0 for others)."""
        if not self.contextual:
            return None
        zero = np.zeros(len(self.centre_))
        return np.array([self.context_cache_.get(str(t), zero) for t in pairs.text_id]).reshape(len(pairs), -1)

    def _design_rows(self, columns: np.ndarray, judge: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
        """The design matrix of rows of text ``columns`` (absent: the training mean), their contextual
        columns (contextual only) and judge indices."""
        onehot = np.zeros((len(judge), len(self.judges_.judges)))
        onehot[judge >= 0, judge[judge >= 0]] = 1.0
        parts = [np.where(np.isnan(columns), self.fill_, columns)]
        return np.hstack(parts + ([] if context is None else [context]) + [onehot])

    def _completed(self, batch: CompletionBatch, completions: np.ndarray) -> dict:
        """Each fitted question's (probabilities (D, P, options), point values (D, P) or None) per completion."""
        columns = batch.pair_columns(completions)
        draws, n_pairs = columns.shape[:2]
        judge = np.tile(self.judges_.indices(batch.pairs.judge_id), draws)
        context = self._cached_context(batch.pairs)
        context = None if context is None else np.tile(context, (draws, 1))
        x = self._design_rows(columns.reshape(draws * n_pairs, -1), judge, context)
        out = {}
        for qid in self.fits_:
            p, mu = self._question_proba(self.rubric[qid], x)
            out[qid] = (p.reshape(draws, n_pairs, -1), None if mu is None else mu.reshape(draws, n_pairs))
        return out

    def proba_completed(self, batch: CompletionBatch, completions: np.ndarray) -> np.ndarray:
        """(draws, pairs, questions, max options) for each completion (:mod:`llmrubric.model.core.absent`);
        contextual: the pairs' contextual columns of the last tables predicted (0 for texts not seen)."""
        probs = self._completed(batch, completions)
        draws, n_pairs = completions.shape[1], len(batch.pairs)
        flat = questions_proba(
            self.rubric, {q: p.reshape(draws * n_pairs, -1) for q, (p, _) in probs.items()}, draws * n_pairs
        )
        return flat.reshape(draws, n_pairs, *flat.shape[1:])

    def fit(self, tables, questions: list[str] | None = None):
        self.layout_ = FeatureLayout.from_features(tables.features, self.rubric)
        self.judges_ = JudgeMap.from_annotations(tables.annotations)
        self.answers_ = AnswerModel.fit(tables.features, self.layout_, self.rubric)
        columns = text_columns(self.layout_, self.rubric, tables.features, tables.text_ids)
        self.fill_ = pd.DataFrame(columns).mean().fillna(0.0).to_numpy()
        systems = text_systems(tables)
        if self.contextual:
            every = sorted(tables.features.text_id.astype(str).unique())
            every_columns = text_columns(self.layout_, self.rubric, tables.features, every)
            self.centre_ = centre_of(system_means(every_columns, every, systems), every, systems)
        self.fits_ = {}
        for qid in questions or self.rubric.ids:
            question = self.rubric[qid]
            pairs, y = answered_pairs(tables, question)
            if len(pairs):
                groups = pairs.text_id.astype(str).map(systems).to_numpy()
                self.fits_[qid] = self._fit_question(question, self._design(tables, pairs), y, groups)
        if self.question.id in (questions or self.rubric.ids) and self.question.id not in self.fits_:
            raise InputError(f"{self.name}: no annotations of the main question {self.question.id} to fit")
        if not self.fits_:
            raise InputError(f"{self.name}: no annotations of {questions} to fit")
        return self

    def _fit_question(self, question, x: np.ndarray, y: np.ndarray, systems: np.ndarray) -> dict[str, np.ndarray]:
        """The fitted arrays of one question: ridge weights and residual spread (:func:`ridge_fit`), or the
        logistic model's (:func:`logistic_fit`); ``systems``: each row's system id (NaN: none)."""
        if not question.ordered:
            return logistic_fit(question, x, y)
        start = len(self.fill_)
        context = slice(start, start + (len(self.fill_) if self.contextual else 0))
        return ridge_fit(x, y, systems, context, self.linear if self.contextual else None)

    def _question_proba(self, question, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        fit = self.fits_[question.id]
        if question.ordered:
            mu = x @ fit["coef"] + fit["intercept"][0]
            return discretised_normal(mu, float(fit["sigma"][0]), question), mu
        if "prior" in fit:
            return np.tile(fit["prior"], (len(x), 1)), None
        logits = ((x - fit["mean"]) / fit["scale"]) @ fit["coef"].T + fit["intercept"]
        if logits.shape[1] == 1:
            logits = np.hstack([-logits, logits]) / 2
        p = special.softmax(logits, axis=1)
        probs = np.zeros((len(x), len(question.options)))
        probs[:, fit["classes"].astype(int)] = p
        return (probs + 1e-3) / (1 + 1e-3 * probs.shape[1]), None

    def _predict(self, tables, pairs):
        return self._question_proba(self.question, self._design(tables, pairs))

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
        """The predictions table of every fitted question."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs.reset_index(drop=True)
        questions = [self.rubric[q] for q in self.fits_]
        self._context(tables, pairs)  # the contextual columns of every text, before any completion
        results = self._marginal_results(tables, pairs)
        if results is None:
            x = self._design(tables, pairs)
            results = [self._question_proba(q, x) for q in questions]
        width = max(len(q.options) for q in questions)
        probs = np.stack([np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p, _ in results], axis=1)
        means = None
        if all(m is not None for _, m in results):
            means = np.stack([m for _, m in results], axis=1)
        return predictions_frame(pairs, questions, probs, means)

    def _marginal_results(self, tables: Tables, pairs: pd.DataFrame) -> list | None:
        """Each fitted question's (probabilities, point values) with absent blocks marginalised
        (:func:`llmrubric.model.core.absent.marginal_proba`); None when every text has every block."""
        questions = list(self.fits_)
        widths = [len(self.rubric[q].options) for q in questions]

        def whole(part):
            x = self._design(tables, part)
            return _packed([self._question_proba(self.rubric[q], x) for q in questions])

        def completed(batch, completions):
            results = self._completed(batch, completions)
            return _packed([results[q] for q in questions])

        packed = marginal_proba(self, tables, pairs, whole, completed)
        if packed is None:
            return None
        out, start = [], 0
        for k in widths:
            mu = packed[:, start + k]
            out.append((packed[:, start : start + k], None if np.isnan(mu).all() else mu))
            start += k + 1
        return out

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray:
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        self._context(tables, pairs)  # the contextual columns of every text, before any completion
        results = self._marginal_results(tables, pairs)
        if results is not None:
            return questions_proba(self.rubric, {q: p for q, (p, _) in zip(self.fits_, results)}, len(pairs))
        x = self._design(tables, pairs)
        return questions_proba(
            self.rubric, {q: self._question_proba(self.rubric[q], x)[0] for q in self.fits_}, len(pairs)
        )

    def add_judge(self, tables: Tables, judge_id: str) -> RidgeJudge:
        """A copy that knows ``judge_id``: on each ordered question its indicator's coefficient is the
        ridge estimate from its residuals against the shared prediction (sum / (answers + alpha)); on a
        categorical question it keeps the shared prediction (coefficient 0)."""
        new = copy.deepcopy(self)
        new.judges_ = JudgeMap((*self.judges_.judges, str(judge_id)))
        mine = tables.annotations[tables.annotations.judge_id.astype(str) == str(judge_id)]
        for qid, fit in new.fits_.items():
            question = self.rubric[qid]
            if "prior" in fit:
                continue
            coef = 0.0
            pairs, y = answered_pairs(Tables(mine, tables.features), question)
            if question.ordered and len(pairs):
                shared = self._question_proba(question, self._design(tables, pairs))[1]  # the judge unseen
                coef = float(np.sum(y - shared) / (len(y) + fit["alpha"][0]))
            if question.ordered:
                fit["coef"] = np.append(fit["coef"], coef)
            else:
                fit["coef"] = np.hstack([fit["coef"], np.zeros((len(fit["coef"]), 1))])
                fit["mean"], fit["scale"] = np.append(fit["mean"], 0.0), np.append(fit["scale"], 1.0)
        return new

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {
            f"{q}.{k}": torch.from_numpy(np.asarray(v, dtype=np.float64))
            for q, fit in self.fits_.items()
            for k, v in fit.items()
        }
        tensors["fill"] = torch.from_numpy(self.fill_.astype(np.float64))
        meta = {
            "format": self.FORMAT,
            "layout": self.layout_.to_dict(),
            "judges": list(self.judges_.judges),
            "questions": list(self.fits_),
            "contextual": self.contextual,
            "linear": asdict(self.linear),
        }
        if self.contextual:
            tensors["centre"] = torch.from_numpy(self.centre_.astype(np.float64))
        answers_state(self.answers_, meta, tensors)
        return meta, tensors

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> RidgeJudge:
        linear = meta.get("linear") or {"contextual": bool(meta.get("contextual", False))}
        self = cls(rubric, linear=LinearConfig(**linear))
        self.layout_ = FeatureLayout.from_dict(meta["layout"])
        self.judges_ = JudgeMap(tuple(meta["judges"]))
        self.fill_ = tensors["fill"].numpy()
        if self.contextual:
            self.centre_ = tensors["centre"].numpy()
        self.fits_ = {
            q: {k.split(".", 1)[1]: v.numpy() for k, v in tensors.items() if "." in k and k.split(".", 1)[0] == q}
            for q in meta["questions"]
        }
        self.answers_, self.source_ = answers_from_state(meta, tensors, rubric, source), source
        return self


def _packed(results: list) -> np.ndarray:
    """Questions' (probabilities, point values or None) side by side on the last axis: each
    question's options, then its point value (NaN when None)."""
    parts = []
    for p, mu in results:
        parts += [p, (np.full(p.shape[:-1], np.nan) if mu is None else mu)[..., None]]
    return np.concatenate(parts, axis=-1)


def main_blocks(features: pd.DataFrame, rubric: Rubric) -> list[Block]:
    """The feature blocks that answer the rubric's main question, one per LLM source."""
    return [b for b in FeatureLayout.from_features(features, rubric).blocks if b.question_id == rubric.main.id]


def expand_baselines(names: list[str], rubric: Rubric, features: pd.DataFrame) -> tuple[list[str], dict[str, str]]:
    """The baselines ``names`` for this data: the methods to run and those skipped, with the reason.

    With several sources answering the main question, each per-source baseline (``argmax_llm``,
    ``expected_llm``) becomes one method per source (``expected_llm/<source>``) followed by the
    unqualified name (the mean over the sources); with none, it is skipped. A baseline that is
    another of ``names`` under a second name (:func:`duplicates`) is not run twice.
    """
    sources = [b.source for b in main_blocks(features, rubric)]
    methods, skipped = [], {}
    for name in [n for n in names if n not in duplicates(names)]:
        if not entry(name, "baselines").per_source:
            methods.append(name)
        elif not sources:
            skipped[name] = f"no LLM source answered the main question {rubric.main.id} in the features"
        else:
            methods += ([f"{name}/{s}" for s in sources] if len(sources) > 1 else []) + [name]
    return methods, skipped


def duplicates(names: list[str]) -> dict[str, str]:
    """The baselines of ``names`` that predict what another of ``names`` does on every data set
    (``mean_of_sources``: ``expected_llm``), each with that other name."""
    same = {n: entry(n, "baselines").same_as for n in names if "/" not in n}
    return {n: other for n, other in same.items() if other is not None and other in names}


def make_method(name: str, rubric: Rubric, seed: int = 0, model: dict | None = None, trainer: dict | None = None):
    """A method of Table 1 by name, unfitted: :func:`llmrubric.model.core.registry.make` with the seed
    third; ``argmax_llm/<source>``, ``expected_llm/<source>``: one LLM source."""
    return make(name, rubric, model, trainer, seed)


def ridge_fit(x: np.ndarray, y: np.ndarray, systems: np.ndarray, context: slice, linear: LinearConfig | None) -> dict:
    """Ridge weights (penalty by :class:`RidgeCV`) and residual spread of an ordered question; with ``linear``
    (contextual) the ``context`` columns scaled by :func:`context_scale` first (their penalty: the within one / s²)."""
    scale = context_scale(x, y, systems, context, linear) if linear is not None else 1.0
    scaled = x.copy()
    scaled[:, context] *= scale
    model = RidgeCV(alphas=ALPHAS).fit(scaled, y)
    coef = model.coef_.copy()
    coef[context] *= scale
    sigma = max(float(np.std(y - model.predict(scaled))), 1e-3)
    return {
        "coef": coef,
        "intercept": np.atleast_1d(model.intercept_),
        "sigma": np.array([sigma]),
        "alpha": np.array([model.alpha_]),
        **({"context_scale": np.array([scale])} if linear is not None else {}),
    }


def context_scale(x: np.ndarray, y: np.ndarray, systems: np.ndarray, context: slice, linear: LinearConfig) -> float:
    """The scale s of the contextual columns (penalty: the within one / s²) with the lowest squared
    error of held-out systems' answers (folds by system, ``linear.context_folds`` at most); 0 with
    fewer than 3 training systems. Rows without a system are always trained on."""
    named = pd.notna(systems)
    groups = pd.Series(np.where(named, systems, "")).astype(str).to_numpy()
    n_systems = len(set(groups[named]))
    if n_systems < 3:
        return 0.0
    folds = GroupKFold(n_splits=min(linear.context_folds, n_systems))
    errors = {}
    with one_thread(blas=True):
        for scale in sorted(linear.context_scales):
            scaled = x.copy()
            scaled[:, context] *= scale
            error = 0.0
            for train, test in folds.split(scaled[named], y[named], groups[named]):
                train = np.concatenate([np.flatnonzero(named)[train], np.flatnonzero(~named)])
                test = np.flatnonzero(named)[test]
                fit = RidgeCV(alphas=ALPHAS).fit(scaled[train], y[train])
                error += float(((fit.predict(scaled[test]) - y[test]) ** 2).sum())
            errors[scale] = error
    return min(errors, key=errors.get)  # the first (smallest) scale of the lowest error


def logistic_fit(question, x: np.ndarray, y: np.ndarray) -> dict:
    """A categorical question's standardised logistic regression (C by cross-validated log loss), or the
    answers' smoothed frequencies where too few answers of a class allow no 2-fold CV."""
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    grid = {"logisticregression__C": np.logspace(-3, 3, 7)}
    folds = min(5, int(np.bincount(y).max())) if len(np.unique(y)) > 1 else 0
    if folds < 2:
        counts = np.bincount(y, minlength=len(question.options)) + 1.0
        return {"prior": counts / counts.sum()}
    with one_thread(blas=True):  # small problems: threads only contend
        search = GridSearchCV(pipeline, grid, scoring="neg_log_loss", cv=folds).fit(x, y)
    scaler, logistic = search.best_estimator_[0], search.best_estimator_[1]
    return {
        "mean": scaler.mean_,
        "scale": scaler.scale_,
        "coef": logistic.coef_,
        "intercept": logistic.intercept_,
        "classes": logistic.classes_.astype(np.float64),
    }


def _baseline(cls):
    """The build of an LLM baseline registered in :mod:`llmrubric.model.core.registry`."""
    return lambda rubric, setup: cls(rubric, setup.seed, setup.source)


def _linear(setup: Setup, **override) -> LinearConfig:
    """``model.linear`` of ``setup`` with ``override``; an unknown key is an :class:`InputError`."""
    try:
        return LinearConfig(**{**dict(setup.model.get("linear") or {}), **override})
    except TypeError as e:
        raise InputError(f"unknown model.linear setting: {e}", setting="model.linear") from None


def _ridge(rubric: Rubric, setup: Setup) -> RidgeJudge:
    return RidgeJudge(rubric, setup.seed, linear=_linear(setup))


LLM = Capabilities(deterministic=True, needs_llm_answers=True)
register("random", _baseline(RandomBaseline), RandomBaseline)
register("argmax_llm", _baseline(ArgmaxLLM), ArgmaxLLM, per_source=True, capabilities=LLM)
register("expected_llm", _baseline(ExpectedLLM), ExpectedLLM, per_source=True, capabilities=LLM)
register("mean_of_sources", _baseline(MeanOfSources), MeanOfSources, capabilities=LLM)
register("constant", _baseline(ConstantBaseline), ConstantBaseline, capabilities=Capabilities(deterministic=True))
register("raw_linear_system", _baseline(RawLinearSystem), RawLinearSystem, capabilities=LLM)
register(
    "ridge_judge",
    _ridge,
    RidgeJudge,
    capabilities=Capabilities(questions=True, absent_blocks=True, member_judge=True, deterministic=True),
    settings=LinearConfig,
)


def report_methods() -> list[str]:
    """The report's Table 1 methods by default: the names registered ``report_default``, in registration order."""
    return with_capability("report_default")


def deterministic_methods() -> list[str]:
    """The names that draw nothing at random (``deterministic``): one seed of them suffices."""
    return with_capability("deterministic")
