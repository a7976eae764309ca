"""Cumulative-link (ordered-logit) calibration heads that extrapolate to systems unlike the training ones.

A softmax head on sigmoid hidden units saturates: a system much better (or worse) than every
training system is predicted near the edge of the training range. An ordinal head instead puts
each question's answer on a learned score s and cut points c_1 < … < c_{K-1}:
``P(y <= k) = σ(c_k - s)`` (LLM-Rubric Appendix B's ordinal view; McCullagh 1980). The score is
linear in the standardised features (expected answers and presence flags), so it keeps moving
with the LLM's answers outside the training range. Cut points are shared plus a per-judge
delta (L2-penalised by ``trainer.delta_l2``; zero for an unseen judge). With ``monotone``,
each question's score is nondecreasing in the expected answers of that question's own feature
blocks (every source): an LLM rating a text higher never lowers its prediction.

Heads: ``ordinal`` (the linear score alone) and ``combined`` (the calibration network's
hidden layers add a bounded residual to the linear score: ``s = w·f + r(σ(W2 σ(W1 f)))``, the
residual's weights start at zero). Both are trained by :func:`train_cumulative` (full-batch
L-BFGS, pretrain on all questions then finetune on the main one, each phase early-stopped on
held-out NLL like the network) and predicted, saved and loaded like the network.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from llmrubric.config import TrainConfig
from llmrubric.model.core.encoding import Encoded
from llmrubric.model.core.threads import one_thread
from llmrubric.model.families.network.engine import (
    PHASES,
    EarlyStopping,
    PhaseRun,
    masked_nll,
    phase_mask,
    phase_summaries,
    run_phase,
)
from llmrubric.model.families.network.net import CalibrationNet

HEADS = ("softmax", "ordinal", "combined")
LBFGS_STEPS = 10  # L-BFGS iterations per epoch of train_cumulative
MONOTONE_START = -3.0  # softplus(-3) ≈ 0.05: constrained weights start small and positive
LOG_FLOOR = math.log(1e-12)  # no answer gets probability 0 (an infinite NLL)


class CumulativeNet(CalibrationNet):
    """Ordinal heads on a learned score (see module doc); same inputs and buffers as :class:`CalibrationNet`.

    Args:
        head: ``"ordinal"`` or ``"combined"``.
        block_questions: the question id of each feature block (for ``monotone``).
        question_ids: the questions in rubric order.
        monotone: constrain each question's weights on its own blocks' expected answers to be >= 0.
        Other arguments as :class:`CalibrationNet`; personalization is by the judges' cut points
        (``personalize`` must be ``"none"``), ``inputs`` must include the expected answers, and
        ``input_dropout`` is not used (full-batch L-BFGS needs a deterministic objective).
    """

    program = "lbfgs"  # trained alone by train_cumulative

    def __init__(
        self,
        block_values: list[list[float]],
        n_judges: int,
        option_counts: list[int],
        head: str = "ordinal",
        block_questions: list[str] | None = None,
        question_ids: list[str] | None = None,
        monotone: bool = False,
        h1: int = 25,
        h2: int = 25,
        personalize: bool | str = "none",
        inputs: str = "expected",
        input_dropout: float = 0.0,
        extra_dim: int = 0,
    ):
        if head not in HEADS[1:]:
            raise ValueError(f"head must be one of {HEADS[1:]} for a cumulative net, not {head!r}")
        if personalize not in ("none", False):
            raise ValueError(
                f"the {head} head personalizes by judge cut points; personalize must be 'none', not {personalize!r}"
            )
        if inputs == "probabilities":
            raise ValueError(f"the {head} head needs the expected answers: inputs must be 'expected' or 'both'")
        super().__init__(block_values, n_judges, option_counts, h1, h2, "none", inputs, input_dropout, extra_dim)
        self.head, self.n_judges = head, n_judges
        del self.heads
        if head == "ordinal":
            del self.layer1, self.layer2
        else:
            self.residual = nn.Linear(h2, self.n_q)
            nn.init.zeros_(self.residual.weight), nn.init.zeros_(self.residual.bias)
        in_dim = self.input_mean.numel()
        mono = torch.zeros(self.n_q, in_dim, dtype=torch.bool)
        if monotone:
            start = self.n_probs if inputs == "both" else 0  # the expected answers' columns
            for b, q in enumerate(block_questions or []):
                if q in (question_ids or []):
                    mono[question_ids.index(q), start + b] = True
        self.register_buffer("monotone_mask", mono, persistent=False)
        self.score = nn.Parameter(torch.where(mono, torch.tensor(MONOTONE_START), torch.tensor(0.0)))
        counts = torch.tensor(option_counts)
        cuts = torch.zeros(self.n_q, self.max_opt - 1)
        for q, k in enumerate(option_counts):  # cut points of the uniform distribution: logit(j / K)
            c = torch.logit(torch.arange(1, k) / k)
            cuts[q, : k - 1] = torch.cat([c[:1], torch.log(torch.expm1(c.diff()))])
        self.cuts = nn.Parameter(cuts)
        self.judge_cuts = nn.Parameter(torch.zeros(n_judges, self.n_q, self.max_opt - 1))
        self.register_buffer(
            "cut_mask", torch.arange(self.max_opt - 1)[None, :] < (counts - 1)[:, None], persistent=False
        )

    def weights(self) -> torch.Tensor:
        """The score's weights (questions, features): softplus of the raw ones where monotone."""
        return torch.where(self.monotone_mask, nn.functional.softplus(self.score), self.score)

    def scores(self, f: torch.Tensor) -> torch.Tensor:
        """Standardised features (B, in_dim) → scores (B, questions)."""
        s = f @ self.weights().T
        if self.head == "combined":
            z = torch.sigmoid(self.layer2(torch.sigmoid(self.layer1(f))))
            s = s + self.residual(z)
        return s

    def cut_points(self, judge: torch.Tensor) -> torch.Tensor:
        """(B,) judge index (-1: unseen) → increasing cut points (B, questions, max options - 1)."""
        raw = self.cuts[None].expand(len(judge), -1, -1)
        if self.n_judges:
            onehot = (judge[:, None] == torch.arange(self.n_judges)[None, :]).to(
                raw.dtype
            )  # all zeros for an unseen judge
            raw = raw + (onehot @ self.judge_cuts.flatten(1)).view_as(raw)
        steps = torch.cat([raw[..., :1], nn.functional.softplus(raw[..., 1:])], dim=-1)
        return steps.cumsum(dim=-1)

    def forward(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (B, questions, max options), -inf where padded, divided by each
        question's temperature (so that a softmax of the output is the prediction)."""
        return self.log_probs(self.standardized(x, judge), judge) / self.temperature[:, None]

    def standardized(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        return (self.features(x, judge) - self.input_mean) / self.input_scale

    def log_probs(self, f: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """Standardised features (B, in_dim), judges (B,) → log-probabilities (B, questions, max options)."""
        s = self.scores(f)
        lcdf = nn.functional.logsigmoid(self.cut_points(judge) - s[..., None]).masked_fill(
            ~self.cut_mask, 0.0
        )  # log P(y <= k)
        return interval_log_probs(lcdf).masked_fill(~self.option_mask, float("-inf"))

    def shared_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if name != "judge_cuts" and not name.startswith("delta")]

    def delta_parameters(self) -> list[nn.Parameter]:
        return [self.judge_cuts]

    def delta_penalty(self) -> torch.Tensor:
        return (self.judge_cuts**2).sum()

    @torch.no_grad()
    def for_judge(self, judge: int) -> CumulativeNet:
        """A copy without judges that predicts what this net predicts for judge index ``judge``
        (-1: an unseen judge): the judge's cut deltas are added to the shared ones."""
        net = copy.deepcopy(self).eval()
        if judge >= 0:
            net.cuts += self.judge_cuts[judge]
        net.judge_cuts = nn.Parameter(self.judge_cuts[:0].clone())
        net.n_judges = 0
        return net


def interval_log_probs(lcdf: torch.Tensor) -> torch.Tensor:
    """log P(y <= k) (..., K-1) → log P(y = k) (..., K), floored at :data:`LOG_FLOOR`: log(P(y <= k) -
    P(y <= k-1)), exact also where both are near 1 or near 0."""
    lcdf = torch.cat([lcdf, torch.zeros_like(lcdf[..., :1])], dim=-1)
    below = torch.cat([torch.full_like(lcdf[..., :1], float("-inf")), lcdf[..., :-1]], dim=-1)
    return (lcdf + torch.log((-torch.expm1(below - lcdf)).clamp(min=1e-30))).clamp(min=LOG_FLOOR)


def train_cumulative(
    nets: list[CumulativeNet],
    trains: list[Encoded],
    vals: list[Encoded | None],
    main_index: int,
    configs: list[TrainConfig],
    seeds: list[int] | None = None,
    progress=None,
    on_epoch=None,
) -> list[dict]:
    """Train ``nets`` in place: pretrain on all questions, then finetune on the main one, each phase
    by full-batch L-BFGS (the heads are small and near-convex: mini-batches only slow them down) on
    the mean NLL plus ``weight_decay`` times the squared shared weights and ``delta_l2`` times the
    squared judge cut deltas. An epoch is up to :data:`LBFGS_STEPS` L-BFGS iterations of each model;
    :func:`llmrubric.model.families.network.engine.run_phase`, the stacked networks' loop, runs the epochs (early
    stopping on held-out NLL with the best weights restored, or convergence; ``progress`` and
    ``on_epoch`` as in :func:`llmrubric.model.families.network.engine.train_stacked`). Nothing is random here: the
    caller's ``seeds`` drew the initial weights. Returns one summary per model and phase."""
    summaries: list[dict] = [{} for _ in nets]
    dropped = torch.zeros(len(nets), dtype=torch.bool)  # pruned or diverged: no further phases
    try:
        with one_thread():
            for phase in PHASES:
                epochs = torch.tensor([getattr(c, f"{phase}_epochs") for c in configs])
                ids = ((epochs > 0) & ~dropped).nonzero().squeeze(1)
                if not len(ids):
                    continue
                members = ids.tolist()
                run = LbfgsPhase(
                    phase,
                    [nets[m] for m in members],
                    [trains[m] for m in members],
                    [vals[m] for m in members],
                    main_index,
                    [configs[m] for m in members],
                    epochs[ids],
                )
                history, stopped = run_phase(run, progress, on_epoch, ids, len(nets))
                run.restore_best()
                for m, summary in zip(members, phase_summaries(run, history, stopped)):
                    dropped[m] |= summary["stopped"] in ("pruned", "diverged")
                    summaries[m][phase] = summary
        return summaries
    finally:
        for net in nets:
            net.eval()


def _nll(logp: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean -log p over the observed cells of the masked questions (logp (B, Q, O), y (B, Q))."""
    return masked_nll(logp[None], y[None], mask)[0]


class LbfgsPhase(PhaseRun):
    """One phase of cumulative heads, each model its own full-batch L-BFGS on its phase rows."""

    def __init__(self, phase, nets, trains, vals, main_index, configs, max_epochs: torch.Tensor):
        self.phase, self.nets, self.vals, self.configs, self.max_epochs = phase, nets, vals, configs, max_epochs
        self.n = len(nets)
        self.mask = phase_mask(nets[0].n_q, main_index, phase)
        self.main = phase_mask(nets[0].n_q, main_index, "finetune")
        self.has_val = torch.tensor([v is not None and len(v) > 0 for v in vals])
        self.stopping = EarlyStopping(torch.tensor([c.patience for c in configs]), self.has_val)
        self.running = torch.ones(self.n, dtype=torch.bool)
        self.best_state: list[dict | None] = [None] * self.n
        self.previous: list[float | None] = [None] * self.n
        self.iterations = [0] * self.n
        self.optimizers, self.closures, self.val_features = [], [], []
        for net, train, val, config, has_val in zip(nets, trains, vals, configs, self.has_val.tolist()):
            rows = ((train.y >= 0) & self.mask).any(dim=1).nonzero().squeeze(1)
            if not len(rows):
                raise ValueError("no training annotations for this phase")
            net.eval()  # deterministic objective for the line search: no input dropout
            with torch.no_grad():  # the features do not change during training
                f = net.standardized(train.x[rows], train.judge[rows])
                self.val_features.append(net.standardized(val.x, val.judge) if has_val else None)
            optimizer = torch.optim.LBFGS(
                net.shared_parameters() + net.delta_parameters(),
                lr=1.0,
                max_iter=LBFGS_STEPS,
                line_search_fn="strong_wolfe",
            )
            self.optimizers.append(optimizer)
            self.closures.append(self._closure(net, optimizer, f, train.judge[rows], train.y[rows], config))

    def _closure(self, net, optimizer, f, judge, y, config):
        shared = net.shared_parameters()

        def closure():
            optimizer.zero_grad()
            loss = _nll(net.log_probs(f, judge), y, self.mask) + config.delta_l2 * net.delta_penalty()
            if config.weight_decay:
                loss = loss + config.weight_decay * sum((p**2).sum() for p in shared)
            loss.backward()
            return loss

        return closure

    def epoch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        losses, finite = torch.zeros(self.n, dtype=torch.float64), torch.ones(self.n, dtype=torch.bool)
        converged = torch.zeros(self.n, dtype=torch.bool)
        for j in self.running.nonzero().squeeze(1).tolist():
            loss = float(self.optimizers[j].step(self.closures[j]).detach())
            losses[j], finite[j] = loss, math.isfinite(loss)
            if not finite[j]:
                continue
            shared = self.nets[j].shared_parameters()[0]
            self.iterations[j] = int(self.optimizers[j].state[shared].get("n_iter", 0))
            converged[j] = self.previous[j] is not None and abs(self.previous[j] - loss) < 1e-7
            self.previous[j] = loss
        return losses, finite, converged

    @torch.no_grad()
    def validate(self) -> tuple[torch.Tensor, torch.Tensor]:
        val_nll, main_nll = torch.full((self.n,), math.nan), torch.full((self.n,), math.nan)
        for j in (self.running & self.has_val).nonzero().squeeze(1).tolist():
            val = self.vals[j]
            logp = self.nets[j].log_probs(self.val_features[j], val.judge)
            val_nll[j], main_nll[j] = _nll(logp, val.y, self.mask), _nll(logp, val.y, self.main)
        return val_nll, main_nll

    def keep_best(self, improved: torch.Tensor) -> None:
        for j in improved.nonzero().squeeze(1).tolist():
            self.best_state[j] = copy.deepcopy(self.nets[j].state_dict())

    def entry(self, j: int, epoch: int, loss: float, val_nll: float) -> dict:
        return {"epoch": epoch, "train/loss": loss, "val/nll": val_nll, "iterations": self.iterations[j]}

    def restore_best(self) -> None:
        """Each model's best weights of the phase (those with a validation set)."""
        for net, state in zip(self.nets, self.best_state):
            net.eval()
            if state is not None:
                net.load_state_dict(state)
