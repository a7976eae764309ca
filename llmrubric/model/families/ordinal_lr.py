"""Penalised proportional-odds regression (``ordinal_lr``): a low-variance ordinal candidate.

For an ordered question with options 1..K, text t and judge j::

    P(y <= k) = σ(c_k - β·f_t - δ_j)

``f_t`` are every feature block's standardised values (:mod:`llmrubric.model.core.columns`), ``δ_j``
judge offsets (only with more than one training judge; an unseen judge gets 0) and ``c`` increasing
cut points. β and δ carry an L2 penalty λ/2·‖·‖² chosen from ``penalties`` (:class:`OrdinalSettings`,
default :data:`PENALTIES`) by the held-out NLL of ``folds`` folds grouped by system (by text with fewer
than 3 training systems), then refitted on all the training data. L-BFGS (scipy) in float64:
deterministic, seconds. A missing block is the training mean in training; a text with absent blocks
is predicted by marginalising them (:mod:`llmrubric.model.core.absent`). Categorical questions are left to the other families (NaN).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import torch
from scipy import optimize, special

from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_range
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.absent import CompletionBatch, marginal_proba
from llmrubric.model.core.answers import AnswerModel, answers_from_state, answers_state
from llmrubric.model.core.columns import text_columns
from llmrubric.model.core.context import text_systems
from llmrubric.model.core.encoding import FeatureLayout, JudgeMap, pairs_of, question_targets
from llmrubric.model.core.params import replaced
from llmrubric.model.core.registry import Capabilities, register

PENALTIES = tuple(float(v) for v in np.logspace(-1, 4, 11))  # λ on the summed NLL, standardised inputs
FOLDS = 5


@dataclass
class OrdinalSettings:
    """The parameters of ``ordinal_lr`` (:class:`OrdinalRegression`).

    Attributes:
        penalties: the L2 penalties λ chosen from by the held-out NLL (positive).
        folds: the folds of that choice (at least 2; fewer where there are fewer groups).
    """

    penalties: list[float] = field(default_factory=lambda: list(PENALTIES))
    folds: int = FOLDS

    def check(self) -> OrdinalSettings:
        """These settings in range, each error naming the setting."""
        if isinstance(self.penalties, (str, int, float)) or not len(self.penalties):
            raise InputError(f"{self.penalties!r} is not a list of penalties", setting="penalties")
        self.penalties = [check_range("penalties", p, 0, open_low=True) for p in self.penalties]
        self.folds = check_range("folds", self.folds, 2, integer=True)
        return self


def _cuts(raw: np.ndarray) -> np.ndarray:
    """Increasing cut points from raw ones: the first, then softplus increments."""
    return np.concatenate([raw[:1], np.logaddexp(0.0, raw[1:])]).cumsum()


def _bounds(score: np.ndarray, cuts: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's upper and lower latent bounds less its score (±inf at the ends)."""
    padded = np.concatenate([[-np.inf], cuts, [np.inf]])
    return padded[y + 1] - score, padded[y] - score


def _interval(upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """σ(upper) − σ(lower), computed on the side where it does not cancel."""
    flip = lower > 0
    return np.where(flip, special.expit(-lower) - special.expit(-upper), special.expit(upper) - special.expit(lower))


def _objective(params: np.ndarray, x: np.ndarray, y: np.ndarray, penalty: float) -> tuple[float, np.ndarray]:
    """The penalised NLL of the proportional-odds model and its gradient in (β, raw cut points)."""
    dim = x.shape[1]
    beta, raw = params[:dim], params[dim:]
    cuts = _cuts(raw)
    upper, lower = _bounds(x @ beta, cuts, y)
    p = np.maximum(_interval(upper, lower), 1e-300)
    density = lambda z: np.where(np.isfinite(z), special.expit(z) * special.expit(-z), 0.0)
    du, dl = density(upper) / p, density(lower) / p
    grad_cuts = np.zeros(len(cuts))
    np.add.at(grad_cuts, y[y < len(cuts)], -du[y < len(cuts)])
    np.add.at(grad_cuts, y[y > 0] - 1, dl[y > 0])
    grad_steps = grad_cuts[::-1].cumsum()[::-1]
    grad_raw = grad_steps * np.concatenate([[1.0], special.expit(raw[1:])])
    grad_beta = x.T @ (du - dl) + penalty * beta
    return float(-np.log(p).sum() + 0.5 * penalty * beta @ beta), np.concatenate([grad_beta, grad_raw])


def fit_ordinal(x: np.ndarray, y: np.ndarray, options: int, penalty: float, start=None) -> dict[str, np.ndarray]:
    """β and raw cut points of the penalised proportional-odds model on design ``x`` and answers ``y``
    (L-BFGS from ``start`` or from β = 0 and the training marginal's cut points)."""
    if start is None:
        counts = np.bincount(y, minlength=options)[:-1].cumsum() + 0.5
        c = np.log(counts / (len(y) + 1.0 - counts))
        raw = np.concatenate([c[:1], np.log(np.expm1(np.maximum(np.diff(c), 1e-3)))])
        start = {"beta": np.zeros(x.shape[1]), "cuts": raw}
    params = np.concatenate([start["beta"], start["cuts"]])
    found = optimize.minimize(
        _objective, params, (x, y, penalty), jac=True, method="L-BFGS-B", options={"maxiter": 500}
    )
    return {"beta": found.x[: x.shape[1]].copy(), "cuts": found.x[x.shape[1] :].copy()}


def ordinal_proba(x: np.ndarray, fit: dict[str, np.ndarray]) -> np.ndarray:
    """(rows, K) probabilities of design ``x`` under ``fit``."""
    cuts = _cuts(fit["cuts"])
    score = x @ fit["beta"]
    edges = np.concatenate([[-np.inf], cuts, [np.inf]])
    return np.stack([_interval(edges[k + 1] - score, edges[k] - score) for k in range(len(cuts) + 1)], axis=1)


def choose_penalty(
    x: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    options: int,
    penalties: tuple[float, ...] = PENALTIES,
    folds: int = FOLDS,
) -> tuple[float, np.ndarray]:
    """The penalty of ``penalties`` with the lowest held-out NLL over ``folds`` folds of ``groups`` (each
    group in one fold), and every penalty's NLL; strongest first, each fit warm-started from the last."""
    names = np.array(sorted(set(groups)))
    fold_of = dict(zip(names, np.arange(len(names)) % min(folds, len(names))))
    fold = np.array([fold_of[g] for g in groups])
    nll = np.zeros(len(penalties))
    for k in np.unique(fold):
        train, test = fold != k, fold == k
        start = None
        for i, penalty in sorted(enumerate(penalties), key=lambda item: -item[1]):
            start = fit_ordinal(x[train], y[train], options, penalty, start)
            p = ordinal_proba(x[test], start)[np.arange(test.sum()), y[test]]
            nll[i] -= np.log(np.clip(p, 1e-12, 1.0)).sum()
    return penalties[int(np.argmin(nll))], nll / len(y)


class OrdinalRegression:
    """The ``ordinal_lr`` family (module doc) with the estimator interface."""

    name = "ordinal_lr"
    family = "ordinal_lr"
    FORMAT = "llmrubric-ordinal_lr/1"

    def __init__(self, rubric: Rubric, seed: int = 0, settings: OrdinalSettings | None = None):
        self.rubric, self.seed = rubric, seed
        self.settings = (settings or OrdinalSettings()).check()
        self.answers_: AnswerModel | None = None  # fitted by fit (None in an old checkpoint)
        self.source_: str | None = None  # the checkpoint it was loaded from

    def get_params(self) -> dict:
        """:class:`OrdinalSettings`."""
        return asdict(self.settings)

    def set_params(self, **params) -> OrdinalRegression:
        self.settings = replaced(self.settings, params, self.name).check()
        return self

    @property
    def questions_(self) -> list[str]:
        """The questions it predicts (the ordered ones fitted)."""
        return list(self.fits_)

    def _design_rows(self, columns: np.ndarray, judge: np.ndarray) -> np.ndarray:
        """Standardised columns (absent: the training mean) and, with 2+ judges, judge indicators."""
        x = (np.where(np.isnan(columns), self.mean_, columns) - self.mean_) / self.scale_
        if len(self.judges_.judges) < 2:
            return x
        onehot = np.zeros((len(judge), len(self.judges_.judges)))
        onehot[judge >= 0, judge[judge >= 0]] = 1.0
        return np.hstack([x, onehot])

    def _columns(self, tables: Tables, pairs: pd.DataFrame, absent_ok: bool) -> np.ndarray:
        texts = sorted(pairs.text_id.unique())
        columns = text_columns(self.layout_, self.rubric, tables.features, texts, absent_ok)
        return columns[pd.Index(texts).get_indexer(pairs.text_id)]

    def fit(self, tables: Tables, questions: list[str] | None = None) -> OrdinalRegression:
        """Fit ``questions`` (default: every ordered question with annotations)."""
        self.layout_ = FeatureLayout.from_features(tables.features, self.rubric)
        self.judges_ = JudgeMap.from_annotations(tables.annotations)
        self.answers_ = AnswerModel.fit(tables.features, self.layout_, self.rubric)
        columns = text_columns(self.layout_, self.rubric, tables.features, tables.text_ids)
        self.mean_ = pd.DataFrame(columns).mean().fillna(0.0).to_numpy()
        spread = pd.DataFrame(np.where(np.isnan(columns), self.mean_, columns)).std(ddof=0).to_numpy()
        self.scale_ = np.where(spread > 1e-9, spread, 1.0)
        systems = text_systems(tables)
        self.fits_ = {}
        for qid in questions or self.rubric.ids:
            question = self.rubric[qid]
            pairs, y = question_targets(tables, question)
            keep = y >= 0
            if not question.ordered or not keep.any():
                continue
            pairs, y = pairs[keep], y[keep]
            x = self._design_rows(self._columns(tables, pairs, False), self.judges_.indices(pairs.judge_id))
            groups = pairs.text_id.astype(str).map(systems)
            groups = groups.to_numpy() if groups.notna().all() and groups.nunique() >= 3 else pairs.text_id.to_numpy()
            penalty, _ = choose_penalty(
                x, y, groups.astype(str), len(question.options), tuple(self.settings.penalties), self.settings.folds
            )
            self.fits_[qid] = {**fit_ordinal(x, y, len(question.options), penalty), "penalty": np.array([penalty])}
        if not self.fits_:
            raise InputError(f"{self.name} fits ordered questions: no annotations of an ordered question to fit")
        return self

    def _proba_rows(self, columns: np.ndarray, judge: np.ndarray) -> np.ndarray:
        """(rows, questions, max options) of rows of text ``columns`` and judge indices."""
        x = self._design_rows(columns, judge)
        width = max(len(q.options) for q in self.rubric.questions)
        out = np.full((len(columns), len(self.rubric.questions), width), np.nan)
        for qi, question in enumerate(self.rubric.questions):
            if question.id in self.fits_:
                k = len(question.options)
                out[:, qi, :k], out[:, qi, k:] = ordinal_proba(x, self.fits_[question.id]), 0.0
        return out

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray:
        """(pairs, questions, max options); NaN for questions not fitted, 0 in padding."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        marginal = marginal_proba(self, tables, pairs)
        if marginal is not None:
            return marginal
        return self._proba_rows(self._columns(tables, pairs, True), self.judges_.indices(pairs.judge_id))

    def proba_completed(self, batch: CompletionBatch, completions: np.ndarray) -> np.ndarray:
        """(draws, pairs, questions, max options) for each completion (:mod:`llmrubric.model.core.absent`)."""
        return batch.rows_proba(completions, self.judges_, self._proba_rows)

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        probs = self.predict_proba(tables, pairs)
        index = [self.rubric.ids.index(q) for q in self.fits_]
        return predictions_frame(pairs, [self.rubric[q] for q in self.fits_], probs[:, index])

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {
            f"fit.{q}.{k}": torch.from_numpy(np.asarray(v, np.float64))
            for q, f in self.fits_.items()
            for k, v in f.items()
        }
        tensors["mean"], tensors["scale"] = torch.tensor(self.mean_), torch.tensor(self.scale_)
        meta = {
            "format": self.FORMAT,
            "layout": self.layout_.to_dict(),
            "judges": list(self.judges_.judges),
            "questions": list(self.fits_),
            "settings": asdict(self.settings),
        }
        answers_state(self.answers_, meta, tensors)
        return meta, tensors

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> OrdinalRegression:
        self = cls(rubric, settings=OrdinalSettings(**meta.get("settings", {})))
        self.layout_ = FeatureLayout.from_dict(meta["layout"])
        self.judges_ = JudgeMap(tuple(meta["judges"]))
        self.mean_, self.scale_ = tensors["mean"].numpy(), tensors["scale"].numpy()
        self.fits_ = {
            q: {k[len(f"fit.{q}.") :]: v.numpy() for k, v in tensors.items() if k.startswith(f"fit.{q}.")}
            for q in meta["questions"]
        }
        self.answers_, self.source_ = answers_from_state(meta, tensors, rubric, source), source
        return self


register(
    "ordinal_lr",
    lambda rubric, setup: OrdinalRegression(rubric, setup.seed),
    OrdinalRegression,
    capabilities=Capabilities(questions=True, absent_blocks=True),
    settings=OrdinalSettings,
)
