"""Cumulative-link mixed model (CLMM): an ordinal regression per question with partially pooled judges.

For question q with options 1..K, text t and judge j::

    P(y <= k) = σ(c_k + u_jk - exp(v_j) · β·f_t)

``f_t`` are standardised inputs of the text (:mod:`llmrubric.model.core.columns`): the expected
answers of q's own feature blocks (``inputs=own``), of every block (``all``), or their mean over
the LLM sources that answered (``mean``: the mean of sources through a per-judge ordinal link).
``c`` are the population cut points (kept increasing as in :mod:`llmrubric.model.families.network.cumulative`),
``u_j`` each judge's offsets of the cut points and ``v_j`` its log-slope: random effects with
``u_jk ~ N(0, σ_k²)``, ``v_j ~ N(0, σ_v²)`` and ``β ~ N(0, τ²)``. The variances are estimated
as ordinal mixed models do, by the Laplace approximation: the posterior mode is fitted by L-BFGS
(:mod:`llmrubric.model.families.mixed_mode`), then each variance is set to the mean of its effects'
squared modes plus their posterior variances (the diagonal of each judge's inverse Hessian
block), for ``rounds`` rounds. A judge not seen in training gets the population values (u = 0, v = 0).

A text with absent blocks is predicted by marginalising them with the answer model
(:mod:`llmrubric.model.core.absent`). In training, and for a checkpoint without an answer model, a
missing block is filled: ``own``/``all`` with the training mean of its column, ``mean`` averages
the sources present; a text without any input column of its question is at the training mean of
the inputs. A question without a block of its own is predicted from all blocks. Categorical questions are not predicted (NaN): the family is ordinal.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_range
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Question, Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.absent import CompletionBatch, marginal_proba
from llmrubric.model.core.answers import AnswerModel, answers_from_state, answers_state
from llmrubric.model.core.columns import column_blocks, text_columns
from llmrubric.model.core.encoding import FeatureLayout, JudgeMap, pairs_of, question_targets
from llmrubric.model.core.params import replaced
from llmrubric.model.core.registry import Capabilities, name_with, register
from llmrubric.model.core.threads import one_thread
from llmrubric.model.families.mixed_mode import ModeProblem, posterior_mode
from llmrubric.model.families.network.cumulative import interval_log_probs

INPUTS = ("own", "all", "mean")
CLASS_NAME = "clmm"  # the registered class (its presets clmm_own, clmm_all, clmm_mean: conf/presets.yaml)
VARIANCE_FLOOR, VARIANCE_CEILING = 1e-4, 100.0


@dataclass
class MixedSettings:
    """The mixed model's parameters (:class:`MixedOrdinal`); ``clmm_<inputs>`` names their default.

    Attributes:
        inputs: ``own``, ``all`` or ``mean`` (module doc).
        rounds: Laplace-EM rounds of the variance estimates (at least 1).
    """

    inputs: str = "own"
    rounds: int = 4

    @classmethod
    def search_space(cls, base: dict) -> dict:
        """What a search tunes: the rounds and the inputs."""
        return {
            "rounds": {"type": "int", "low": 1, "high": 8},
            "inputs": {"type": "categorical", "choices": list(INPUTS)},
        }

    def check(self) -> MixedSettings:
        """These settings in range, each error naming the setting."""
        if self.inputs not in INPUTS:
            raise InputError(f"{self.inputs!r} is not one of {list(INPUTS)}", setting="inputs")
        self.rounds = check_range("rounds", self.rounds, 1, integer=True)
        return self


class _QuestionFit(nn.Module):
    """The parameters of one ordered question (see module doc)."""

    def __init__(self, dim: int, options: int, judges: int):
        super().__init__()
        c = torch.logit(torch.arange(1, options, dtype=torch.float64) / options)
        self.beta = nn.Parameter(torch.zeros(dim, dtype=torch.float64))
        self.cuts = nn.Parameter(torch.cat([c[:1], torch.log(torch.expm1(c.diff()))]))
        self.effects = nn.Parameter(torch.zeros(judges, options, dtype=torch.float64))  # [u_j (K-1), v_j]
        self.register_buffer("variances", torch.tensor([0.25] * (options - 1) + [0.05], dtype=torch.float64))
        self.register_buffer("tau2", torch.tensor(1.0, dtype=torch.float64))

    def log_probs(self, f: torch.Tensor, judge: torch.Tensor, effects: torch.Tensor | None = None) -> torch.Tensor:
        """Inputs (B, dim), judge index (B,) (-1: population) → log-probabilities (B, K); ``effects``
        replaces the judges' effects (judges, K)."""
        seen = (judge >= 0)[:, None].to(f.dtype)
        effects = (self.effects if effects is None else effects)[judge.clamp(min=0)] * seen
        raw = self.cuts[None] + effects[:, :-1]
        cuts = torch.cat([raw[:, :1], nn.functional.softplus(raw[:, 1:])], dim=1).cumsum(dim=1)
        score = torch.exp(effects[:, -1]) * (f @ self.beta)
        return interval_log_probs(nn.functional.logsigmoid(cuts - score[:, None]))

    def packed(self) -> np.ndarray:
        """(beta, cuts, effects) as one vector, in :meth:`~llmrubric.model.families.mixed_mode.ModeProblem.split`'s
        order."""
        return torch.cat([self.beta, self.cuts, self.effects.ravel()]).detach().numpy()

    @torch.no_grad()
    def assign(self, beta: np.ndarray, cuts: np.ndarray, effects: np.ndarray) -> None:
        """Set the parameters (a :meth:`~llmrubric.model.families.mixed_mode.ModeProblem.split` vector's parts)."""
        self.beta.copy_(torch.from_numpy(beta))
        self.cuts.copy_(torch.from_numpy(cuts))
        self.effects.copy_(torch.from_numpy(effects))

    def penalty(self) -> torch.Tensor:
        """The negative log prior of the effects and weights (up to constants)."""
        return 0.5 * ((self.effects**2 / self.variances).sum() + (self.beta**2).sum() / self.tau2)


class MixedOrdinal:
    """The CLMM family (module doc) with the estimator interface: ``fit``, ``predict_proba``,
    ``predict``, ``state`` / ``from_state``.

    Args:
        rubric: questions and scales.
        inputs: ``own``, ``all`` or ``mean`` (module doc).
        rounds: Laplace-EM rounds of the variance estimates.
    """

    family = "clmm"
    FORMAT = "llmrubric-clmm/1"

    def __init__(self, rubric: Rubric, inputs: str = "own", rounds: int = 4, seed: int = 0):
        self.rubric, self.seed = rubric, seed
        self._configure(MixedSettings(inputs, rounds))
        self.answers_: AnswerModel | None = None  # fitted by fit (None in an old checkpoint)
        self.source_: str | None = None  # the checkpoint it was loaded from

    def _configure(self, settings: MixedSettings) -> None:
        settings.check()
        self.inputs, self.rounds = settings.inputs, settings.rounds
        self.name = f"clmm_{self.inputs}"

    def get_params(self) -> dict:
        """:class:`MixedSettings`."""
        return {"inputs": self.inputs, "rounds": self.rounds}

    def set_params(self, **params) -> MixedOrdinal:
        self._configure(replaced(MixedSettings(**self.get_params()), params, self.name))
        return self

    def same_as(self, tables: Tables) -> tuple[str, str] | None:
        """The name this one equals on ``tables`` and why: the preset with ``inputs=own`` (``clmm_own``) for
        ``inputs=mean`` when every question has at most one LLM source (the mean of one source is that source)."""
        questions = [b.question_id for b in FeatureLayout.from_features(tables.features, self.rubric).blocks]
        twin = name_with(CLASS_NAME, inputs="own")
        if self.inputs != "mean" or len(questions) != len(set(questions)) or twin is None:
            return None
        return twin, "every question has at most one LLM source"

    def _columns(self, question: Question) -> list[int]:
        """Input columns of ``question``: its own blocks' (``own``, ``mean``) or all; all when it has none."""
        own = [i for i, b in enumerate(self.blocks_) if b.question_id == question.id]
        return own if own and self.inputs != "all" else list(range(len(self.blocks_)))

    def _inputs(self, columns: np.ndarray, question: Question, fit: bool = False) -> np.ndarray:
        """Standardised inputs (texts, dim) of ``question`` from all text columns."""
        x = columns[:, self._columns(question)]
        if self.inputs == "mean" and x.shape[1]:
            present = ~np.isnan(x).all(axis=1)
            x = np.where(
                present[:, None], np.nanmean(np.where(present[:, None], x, 0.0), axis=1, keepdims=True), np.nan
            )
        if fit:
            mean = np.nanmean(x, axis=0) if len(x) else np.zeros(x.shape[1])
            mean = np.where(np.isnan(mean), 0.0, mean)
            scale = np.nanstd(np.where(np.isnan(x), mean, x), axis=0)
            self.scales_[question.id] = (mean, np.where(scale > 1e-9, scale, 1.0))
        mean, scale = self.scales_[question.id]
        return (np.where(np.isnan(x), mean, x) - mean) / scale

    def fit(self, tables: Tables, questions: list[str] | None = None) -> MixedOrdinal:
        """Fit ``questions`` (default: every rubric question with annotations)."""
        self.layout_ = FeatureLayout.from_features(tables.features, self.rubric)
        self.blocks_ = column_blocks(self.layout_, self.rubric)
        self.judges_ = JudgeMap.from_annotations(tables.annotations)
        self.answers_ = AnswerModel.fit(tables.features, self.layout_, self.rubric)
        self.scales_, self.fits_ = {}, {}
        texts = tables.text_ids
        columns = text_columns(self.layout_, self.rubric, tables.features, texts)
        wanted = questions or [q.id for q in self.rubric.questions]
        with one_thread():
            for qid in wanted:
                question = self.rubric[qid]
                pairs, y = question_targets(tables, question)
                if not len(pairs):
                    continue
                judge = self.judges_.indices(pairs.judge_id)
                if not question.ordered:
                    continue
                f = self._inputs(columns, question, fit=True)[pd.Index(texts).get_indexer(pairs.text_id)]
                self.fits_[qid] = _fit_question(f, judge, y, len(question.keys), self)
        self.questions_ = [q for q in wanted if q in self.fits_]
        if not self.questions_:
            raise InputError(
                f"{self.name} fits ordered questions: no annotations of an ordered question among {wanted}"
            )
        return self

    def predict_proba(self, tables: Tables, pairs: pd.DataFrame | None = None) -> np.ndarray:
        """(pairs, questions, max options) probabilities; NaN for questions not fitted, 0 in padding.
        Texts with absent blocks are marginalised (:mod:`llmrubric.model.core.absent`)."""
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        marginal = marginal_proba(self, tables, pairs)
        if marginal is not None:
            return marginal
        texts = sorted(pairs.text_id.unique())
        absent_ok = self.answers_ is not None
        columns = text_columns(self.layout_, self.rubric, tables.features, texts, absent_ok)
        rows = pd.Index(texts).get_indexer(pairs.text_id)
        return self._proba_rows(columns[rows], self.judges_.indices(pairs.judge_id))

    def _proba_rows(self, columns: np.ndarray, judge: np.ndarray) -> np.ndarray:
        """(rows, questions, max options) of rows of text ``columns`` and judge indices."""
        judge = torch.from_numpy(judge)
        width = max(len(q.options) for q in self.rubric.questions)
        out = np.full((len(columns), len(self.rubric.questions), width), np.nan)
        for qi, question in enumerate(self.rubric.questions):
            k = len(question.options)
            if question.id in self.fits_:
                f = torch.from_numpy(self._inputs(columns, question))
                with torch.no_grad(), one_thread():
                    p = self.fits_[question.id].log_probs(f, judge).exp().numpy()
            else:
                continue
            out[:, qi, :k], out[:, qi, k:] = p, 0.0
        return out

    def proba_completed(self, batch: CompletionBatch, completions: np.ndarray) -> np.ndarray:
        """(draws, pairs, questions, max options) for each completion (:mod:`llmrubric.model.core.absent`)."""
        return batch.rows_proba(completions, self.judges_, self._proba_rows)

    def predict(self, tables: Tables, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
        pairs = pairs_of(tables.annotations) if pairs is None else pairs
        probs = self.predict_proba(tables, pairs)
        index = [self.rubric.ids.index(q) for q in self.questions_]
        return predictions_frame(pairs, [self.rubric[q] for q in self.questions_], probs[:, index])

    def add_judge(self, tables: Tables, judge_id: str) -> MixedOrdinal:
        """A copy that knows ``judge_id``: its effects on each fitted question are the posterior mode
        given its annotations in ``tables`` under the fitted prior, everything shared frozen (a
        question it did not answer keeps the population values)."""
        new = copy.deepcopy(self)
        new.judges_ = JudgeMap((*self.judges_.judges, str(judge_id)))
        mine = tables.annotations[tables.annotations.judge_id.astype(str) == str(judge_id)]
        texts = sorted(mine.text_id.unique())
        columns = text_columns(self.layout_, self.rubric, tables.features, texts)
        with one_thread():
            for qid, fit in new.fits_.items():
                pairs, y = question_targets(Tables(mine, tables.features), self.rubric[qid])
                row = torch.zeros(1, fit.effects.shape[1], dtype=torch.float64, requires_grad=True)
                keep = y >= 0
                if keep.any():
                    f = torch.from_numpy(
                        self._inputs(columns, self.rubric[qid])[pd.Index(texts).get_indexer(pairs.text_id)]
                    )
                    f, target = f[keep], torch.from_numpy(y[keep])
                    judge = torch.full((len(target),), len(self.judges_.judges), dtype=torch.long)
                    optimizer = torch.optim.LBFGS([row], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

                    def closure(f=f, target=target, judge=judge, fit=fit):
                        optimizer.zero_grad()
                        effects = torch.cat([fit.effects.detach(), row])
                        logp = fit.log_probs(f, judge, effects)
                        loss = -logp.gather(1, target[:, None]).sum() + 0.5 * (row**2 / fit.variances).sum()
                        loss.backward()
                        return loss

                    optimizer.step(closure)
                fit.effects = nn.Parameter(torch.cat([fit.effects.detach(), row.detach()]))
        return new

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """JSON metadata and tensors that :meth:`from_state` restores."""
        tensors = {}
        for qid, fit in self.fits_.items():
            for key, value in fit.state_dict().items():
                tensors[f"fit.{qid}.{key}"] = value.detach().clone()
            mean, scale = self.scales_[qid]
            tensors[f"scale.{qid}.mean"], tensors[f"scale.{qid}.scale"] = torch.tensor(mean), torch.tensor(scale)
        meta = {
            "format": self.FORMAT,
            "inputs": self.inputs,
            "rounds": self.rounds,
            "layout": self.layout_.to_dict(),
            "judges": list(self.judges_.judges),
            "questions": self.questions_,
            "fitted": list(self.fits_),
            "options": {qid: len(self.rubric[qid].options) for qid in self.fits_},
        }
        answers_state(self.answers_, meta, tensors)
        return meta, tensors

    @classmethod
    def from_state(
        cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor], source: str = "<checkpoint>"
    ) -> MixedOrdinal:
        self = cls(rubric, meta["inputs"], meta["rounds"])
        self.layout_ = FeatureLayout.from_dict(meta["layout"])
        self.blocks_ = column_blocks(self.layout_, rubric)
        self.judges_ = JudgeMap(tuple(meta["judges"]))
        self.questions_, self.fits_, self.scales_ = meta["questions"], {}, {}
        for qid in meta["fitted"]:
            mean, scale = tensors[f"scale.{qid}.mean"].numpy(), tensors[f"scale.{qid}.scale"].numpy()
            self.scales_[qid] = (mean, scale)
            fit = _QuestionFit(len(mean), meta["options"][qid], len(self.judges_.judges))
            fit.load_state_dict({k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"fit.{qid}.")})
            self.fits_[qid] = fit
        self.answers_, self.source_ = answers_from_state(meta, tensors, rubric, source), source
        return self


def _fit_question(f: np.ndarray, judge: np.ndarray, y: np.ndarray, options: int, owner) -> _QuestionFit:
    """Posterior mode (:mod:`llmrubric.model.families.mixed_mode`) and Laplace-EM variances of one
    question's CLMM (module doc)."""
    keep = y >= 0
    f, judge, y = f[keep], judge[keep], y[keep]
    fit = _QuestionFit(f.shape[1], options, len(owner.judges_.judges))
    if not len(y):
        return fit
    problem = ModeProblem(f, judge, y, options, len(owner.judges_.judges))
    mode = fit.packed()
    f, judge, y = torch.from_numpy(f), torch.from_numpy(judge), torch.from_numpy(y)

    def loss() -> torch.Tensor:
        logp = fit.log_probs(f, judge)
        return -logp.gather(1, y[:, None]).sum() + fit.penalty()

    for _ in range(max(1, owner.rounds)):
        mode = posterior_mode(problem, mode, fit.variances.numpy(), float(fit.tau2))
        fit.assign(*problem.split(mode))
        _update_variances(fit, loss)
    return fit


def _update_variances(fit: _QuestionFit, loss) -> None:
    """One Laplace-EM step: each variance ← mean of its effects' squared modes plus posterior variances.

    Judges' effects touch only their own pairs, so the Hessian is block diagonal by judge: one
    Hessian-vector product per effect index gives every judge's block at once."""
    effects, beta = fit.effects, fit.beta
    grad_e, grad_b = torch.autograd.grad(loss(), [effects, beta], create_graph=True)
    blocks = []
    for c in range(effects.shape[1]):
        v = torch.zeros_like(effects)
        v[:, c] = 1.0
        blocks.append(torch.autograd.grad((grad_e * v).sum(), effects, retain_graph=True)[0])
    hessian = torch.stack(blocks, dim=2).detach()  # (judges, K, K): column c of each judge's block
    eye = torch.eye(effects.shape[1], dtype=hessian.dtype)
    posterior = torch.linalg.inv(hessian + 1e-8 * eye).diagonal(dim1=1, dim2=2).clamp(min=0)
    rows = []
    for d in range(beta.numel()):
        rows.append(torch.autograd.grad(grad_b[d], beta, retain_graph=d + 1 < beta.numel())[0])
    with torch.no_grad():
        if len(effects):
            fit.variances.copy_((effects**2 + posterior).mean(dim=0).clamp(VARIANCE_FLOOR, VARIANCE_CEILING))
        if rows:
            h_beta = torch.stack(rows).detach()
            var_beta = (
                torch.linalg.inv(h_beta + 1e-8 * torch.eye(len(rows), dtype=h_beta.dtype)).diagonal().clamp(min=0)
            )
            fit.tau2.copy_(((beta**2 + var_beta).mean()).clamp(VARIANCE_FLOOR, VARIANCE_CEILING))


CLASS = dict(questions=True, twins=True, absent_blocks=True, member_judge=True)  # the class's capabilities
register(
    CLASS_NAME,
    lambda rubric, setup: MixedOrdinal(rubric, seed=setup.seed),
    MixedOrdinal,
    capabilities=Capabilities(**CLASS),
    settings=MixedSettings,
)
