"""The training engine: calibration networks trained as one stacked module, run by Lightning Fabric.

The fold models of a cross-validation, the members of each ensemble and even several search
trials train together: :class:`StackedNets` holds every model's parameters as one padded flat
row (its own ``nn.Parameter``) and each step runs all of them at once (batched einsums of
:meth:`CalibrationNet.stacked_logits`). Models may differ in hidden sizes (zero-padded to the
largest; the padding gets no gradient), inputs (all run on the widest feature set, each model's
first layer sees only its own columns), input dropout and every :class:`TrainConfig` number.
Each model keeps its own training rows, batch order, dropout masks (drawn per epoch and row from
its own seed, on the model's device), ``torch.optim.Adam`` state and step count, validation set
and early stopping, so a model trained in a stack equals the same model trained alone (tested).

The loop is this module's own (:class:`_Phase`), not Lightning's ``Trainer``: a stacked step is a
few hundred microseconds and the Trainer's per-step hooks would cost more than the step
(``benchmarks/engine.py`` measures both). :class:`StackedNets` is therefore a plain ``nn.Module``;
Lightning Fabric places it, its optimiser and the data on the accelerator (CPU, CUDA, …) and runs
the backward pass.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from llmrubric.config import TrainConfig
from llmrubric.io.errors import InputError
from llmrubric.model.core.accelerator import OnCpu, needs_fabric
from llmrubric.model.core.encoding import Encoded
from llmrubric.model.core.threads import one_thread
from llmrubric.model.families.network.net import CalibrationNet

if TYPE_CHECKING:
    import lightning_fabric as lf

BETAS, EPS = (0.9, 0.999), 1e-8
COMPACT_BELOW = 0.75  # re-stack the running models once fewer than this share of the stack still runs
PHASES = ("pretrain", "finetune")


def phase_mask(n_questions: int, main_index: int, phase: str) -> torch.Tensor:
    """(Q,) bool: the questions a phase trains on (all when pretraining, the main one when finetuning)."""
    mask = torch.full((n_questions,), phase == "pretrain")
    mask[main_index] = True
    return mask


def masked_nll(
    logp: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-model NLL over observed cells of the masked questions: log-probabilities (M, B, Q, O),
    answers y (M, B, Q) (-1: none), mask (Q,) → (M,), the sum divided by ``denom`` (M,) when given,
    else the mean."""
    observed = (y >= 0) & mask
    picked = logp.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    total = -(picked * observed).sum(dim=(1, 2))
    return total / (denom if denom is not None else observed.sum(dim=(1, 2)).clamp(min=1))


def stream_seed(seed: int, purpose: int) -> int:
    """An independent seed for one of a model's random streams (``purpose`` 0: dropout masks)."""
    return int(np.random.SeedSequence([seed, purpose]).generate_state(1)[0])


def train_stacked(
    nets: list[CalibrationNet],
    trains: list[Encoded],
    vals: list[Encoded | None],
    main_index: int,
    config: TrainConfig | list[TrainConfig],
    seeds: list[int],
    progress=None,
    on_epoch=None,
    accelerator: str | None = None,
) -> list[dict]:
    """Train ``nets`` in place, model m on ``trains[m]`` with early stopping on ``vals[m]``.

    Pretrain on all questions, then finetune on the main one; each phase draws shuffled
    mini-batches from the model's seed (``seeds[m]``, ``+ 1`` when finetuning), steps Adam
    (weight decay on the shared weights, ``delta_l2`` on the judge deltas) and stops when the
    held-out NLL of its questions has not improved for ``patience`` epochs; the best weights
    are kept. ``config`` is one :class:`TrainConfig` or one per model; ``accelerator`` (default
    the first config's ``accelerator``) is Lightning's (``cpu``, ``cuda``, ``auto``, …): Lightning Fabric runs
    it, except on the CPU (:mod:`llmrubric.model.core.accelerator`).
    Returns one summary per model and phase with ``epochs``, ``best_epoch``, ``val_nll``,
    ``stopped`` (``early``, ``max_epochs``, ``pruned`` or ``diverged``: a non-finite training
    loss; the model keeps its best weights and skips the later phase) and the per-epoch
    ``history``. The nets stay where they were (their weights are copied back).

    ``progress`` (a tqdm bar, optional) is advanced once per epoch. ``on_epoch(phase, epoch,
    main_nll)``, main_nll (M,): the held-out NLL of the main question (comparable across
    phases; nan where a model has no validation set or does not run), is called after every
    epoch; it may return a (M,) bool tensor of models to stop now (pruning) or raise to abort.
    """
    configs = config if isinstance(config, list) else [config] * len(nets)
    if not (len(nets) == len(trains) == len(vals) == len(configs) == len(seeds)):
        raise ValueError("train_stacked needs one training set, validation set, config and seed per network")
    accelerator = accelerator or configs[0].accelerator
    fabric = fabric_for(accelerator) if needs_fabric(accelerator) else OnCpu()
    with one_thread(flush_denormal=True):  # Adam's decaying moments turn denormal, which is many times slower
        return _Program(fabric, nets, trains, vals, main_index, configs, seeds).run(progress, on_epoch)


def fabric_for(accelerator: str) -> lf.Fabric:
    """Lightning Fabric on one device of ``accelerator`` at 32-bit precision (imported here: about 9 CPU-s,
    :mod:`llmrubric.model.core.accelerator`)."""
    import lightning_fabric as lf

    try:
        return lf.Fabric(accelerator=accelerator, devices=1, precision="32-true")
    except (ValueError, RuntimeError) as e:  # e.g. cuda asked for on a machine without one
        raise InputError(f"accelerator {accelerator!r} cannot be used here: {e}", setting="trainer.accelerator") from e


def _template(nets: list[CalibrationNet]) -> CalibrationNet:
    """A network computing the widest feature set of ``nets`` (inputs ``both``, and the judge
    indicator unless they are personalized by deltas); its parameters are not used."""
    base = nets[0]
    for net in nets[1:]:
        if structure(net) != structure(base):
            raise ValueError(
                "train_stacked needs networks with the same feature blocks, judges, questions and kind of personalization"
            )
    template = copy.deepcopy(base)
    template.inputs, template.personalize = "both", "deltas" if base.has_deltas else "input"
    return template


def structure(net: CalibrationNet) -> tuple:
    """What networks trained in one stack must share (the rest may differ per model)."""
    return (
        type(net),
        net.has_deltas,
        net.n_judges,
        net.n_probs,
        net.n_blocks,
        net.extra_dim,
        tuple(net.option_mask.shape),
        tuple(net.expected_weights.flatten().tolist()),
    )


class ParameterPacking:
    """Where each named parameter of the padded architecture lives in a flat (M, P) row.

    Hidden sizes are padded at the end; the input columns of ``layer1`` (and of ``delta1``,
    after its bias column) are placed at each network's :attr:`CalibrationNet.feature_columns`."""

    def __init__(self, nets: list[CalibrationNet], n_features: int):
        names = [k for k, _ in nets[0].named_parameters()]
        self.n_features, self.entries, offset = n_features, [], 0
        for k in names:
            shape = torch.tensor([list(dict(n.named_parameters())[k].shape) for n in nets]).amax(dim=0)
            if k in ("layer1.weight", "delta1"):
                shape[-1] = n_features + (k == "delta1")
            shape = torch.Size(shape.tolist())
            self.entries.append((k, shape, offset, shape.numel()))
            offset += shape.numel()
        self.size = offset

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's (M, *shape) view of ``flat`` (M, P), cut with one ``split``: its
        backward assembles the gradient of ``flat`` once, where a slice per parameter would
        allocate and sum a full (M, P) gradient for each."""
        parts = flat.split([n for _, _, _, n in self.entries], dim=1)
        return {k: part.view(flat.shape[0], *shape) for (k, shape, _, _), part in zip(self.entries, parts)}

    def index_in(self, source: ParameterPacking) -> torch.Tensor:
        """(P,) positions in ``source`` rows of this layout's entries (a layout no wider than ``source``)."""
        positions = torch.arange(source.size)[None]
        out = torch.zeros(1, self.size, dtype=torch.long)
        target, origin = self.views(out), source.views(positions)
        for k, shape, _, _ in self.entries:
            target[k][...] = origin[k][(slice(None), *(slice(0, s) for s in shape))]
        return out[0]

    @staticmethod
    def _region(net: CalibrationNet, name: str, shape: torch.Size) -> tuple:
        """Index of a network's parameter ``name`` (of ``shape``) inside its padded row view."""
        if name == "layer1.weight":
            return (0, slice(0, shape[0]), net.feature_columns)
        if name == "delta1":
            return (
                0,
                slice(0, shape[0]),
                slice(0, shape[1]),
                torch.cat([torch.zeros(1, dtype=torch.long), net.feature_columns + 1]),
            )
        return (0, *(slice(0, s) for s in shape))

    @torch.no_grad()
    def pack(self, nets: list[CalibrationNet]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Flat padded parameters (M, P), the mask of real entries, and the mask of delta entries (P,)."""
        flat, real = torch.zeros(len(nets), self.size), torch.zeros(len(nets), self.size)
        is_delta = torch.zeros(self.size, dtype=torch.bool)
        for k, _shape, o, n in self.entries:
            is_delta[o : o + n] = k.startswith("delta")
        for m, net in enumerate(nets):
            views, masks = self.views(flat[m : m + 1]), self.views(real[m : m + 1])
            for k, p in net.named_parameters():
                region = self._region(net, k, p.shape)
                views[k][region] = p.detach().cpu()
                masks[k][region] = 1.0
        return flat, real, is_delta

    @torch.no_grad()
    def unpack(self, flat: torch.Tensor, nets: list[CalibrationNet]) -> None:
        for m, net in enumerate(nets):
            views = self.views(flat[m : m + 1])
            for k, p in net.named_parameters():
                p.copy_(views[k][self._region(net, k, p.shape)])


class StackedNets(nn.Module):
    """M networks of one architecture as one module, each model's parameters one padded flat row.

    Every row is its own ``nn.Parameter`` so that ``torch.optim.Adam`` keeps each model's step
    count; a model that does not step (its batches are larger, or it stopped) is left out of the
    optimiser step by holding back its gradient. :meth:`forward` runs any subset of the models,
    optionally on a narrower layout (the running models' own largest sizes).
    """

    def __init__(self, template: CalibrationNet, layout: ParameterPacking, flat, real, decay, mean, scale, dropout, lr):
        super().__init__()
        self.template, self.layout = template, layout
        self.rows = nn.ParameterList([nn.Parameter(row.clone()) for row in flat])
        self.members = tuple(self.rows)  # the same parameters, read without the ParameterList's per-item lookup
        for name, value in {"real": real, "decay": decay, "mean": mean, "scale": scale, "dropout": dropout}.items():
            self.register_buffer(name, value)
        self.lr = lr

    def optimizer(self) -> torch.optim.Optimizer:
        """Adam with one parameter group per learning rate (decay is added to the gradients: see :meth:`finish_gradients`)."""
        groups: dict[float, list[nn.Parameter]] = {}
        for row, lr in zip(self.rows, self.lr):
            groups.setdefault(float(lr), []).append(row)
        return torch.optim.Adam(
            [{"params": rows, "lr": lr} for lr, rows in groups.items()], betas=BETAS, eps=EPS, fused=True
        )

    def flat(self, ids: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """(len(ids), P) the rows of models ``ids`` (padding is zero and stays so: its gradient is
        dropped before each step, see :meth:`finish_gradients`), in the layout of ``index``
        (positions of a narrower layout, see :meth:`ParameterPacking.index_in`) if given."""
        flat = torch.stack([self.members[i] for i in ids.tolist()])
        return flat if index is None else flat[:, index]

    def standardized_features(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """Each model's standardised features (M, B, F) of raw inputs x (M, B, raw), judge (M, B): computed
        once per phase for every row, since they do not change while training."""
        n_models, batch = judge.shape
        f = self.template.features(x.reshape(n_models * batch, -1), judge.reshape(-1)).view(n_models, batch, -1)
        return (f - self.mean[:, None]) / self.scale[:, None]

    def forward(self, ids, layout: ParameterPacking, flat, features, judge, keep=None) -> torch.Tensor:
        """Logits (M, B, Q, O) of models ``ids`` with parameters ``flat`` (in ``layout``) on standardised
        ``features`` (M, B, F) (:meth:`standardized_features`), judge (M, B); ``keep`` (M, B, F) bool: the input
        dropout masks (training)."""
        if keep is not None:
            features = features * keep / (1 - self.dropout[ids])[:, None, None]
        return self.template.stacked_logits(layout.views(flat), features, judge)

    @torch.no_grad()
    def finish_gradients(self, models: list[int]) -> None:
        """Before the step of ``models``: drop their padding's gradient and add the L2 term
        ``decay * row``, the gradient of half the decay-weighted squared parameters
        (``weight_decay`` on shared weights, ``2 delta_l2`` on judge deltas, zero on padding).
        Both stay out of the autograd graph, which then only holds the loss. One foreach call per operation
        over the models, not three per model."""
        rows = [self.members[j] for j in models]
        terms = torch._foreach_mul([self.decay[j] for j in models], rows)
        with_grad = [k for k, row in enumerate(rows) if row.grad is not None]
        grads = [rows[k].grad for k in with_grad]
        torch._foreach_mul_(grads, [self.real[models[k]] for k in with_grad])
        torch._foreach_add_(grads, [terms[k] for k in with_grad])
        for k, row in enumerate(rows):
            if row.grad is None:
                row.grad = terms[k]


def _stack_rows(datas: list[Encoded], rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, max rows + 1, ·) tensors of each model's selected rows; the last row is padding (y = -1)."""
    width = max(len(r) for r in rows) + 1
    x = torch.zeros(len(datas), width, datas[0].x.shape[1])
    judge = torch.full((len(datas), width), -1, dtype=torch.long)
    y = torch.full((len(datas), width, datas[0].y.shape[1]), -1, dtype=torch.long)
    for m, (data, r) in enumerate(zip(datas, rows)):
        x[m, : len(r)], judge[m, : len(r)], y[m, : len(r)] = data.x[r], data.judge[r], data.y[r]
    return x, judge, y


def _with_features(module: StackedNets, stacked: list[torch.Tensor]) -> list[torch.Tensor]:
    """(x, judge, y) of :func:`_stack_rows` → (standardised features, judge, y)."""
    x, judge, y = stacked
    with torch.no_grad():
        return [module.standardized_features(x, judge), judge, y]


def _phase_rows(data: Encoded, mask: torch.Tensor) -> torch.Tensor:
    return ((data.y >= 0) & mask).any(dim=1).nonzero().squeeze(1)


@dataclass
class _Program:
    """The models of one :func:`train_stacked` call through both phases: their packed parameters
    (``result``, updated after each phase), standardisation and summaries."""

    fabric: lf.Fabric | OnCpu
    nets: list[CalibrationNet]
    trains: list[Encoded]
    vals: list[Encoded | None]
    main_index: int
    configs: list[TrainConfig]
    seeds: list[int]

    def __post_init__(self):
        nets = self.nets
        self.base = _template(nets)
        self.n_features = self.base.n_widest_features
        self.layout = ParameterPacking(nets, self.n_features)
        self.result, self.real, self.is_delta = self.layout.pack(nets)
        self.mean, self.scale = torch.zeros(len(nets), self.n_features), torch.ones(len(nets), self.n_features)
        for m, net in enumerate(nets):
            self.mean[m, net.feature_columns], self.scale[m, net.feature_columns] = net.input_mean, net.input_scale
        self.summaries: list[dict] = [{} for _ in nets]
        self.dropped = torch.zeros(len(nets), dtype=torch.bool)  # pruned or diverged: no further phases
        self.device = self.fabric.device
        self.noise = [torch.Generator(device=self.device).manual_seed(stream_seed(s, 0)) for s in self.seeds]

    def run(self, progress, on_epoch) -> list[dict]:
        for phase in PHASES:
            epochs = torch.tensor([getattr(c, f"{phase}_epochs") for c in self.configs])
            if (epochs > 0).any():
                self._phase(phase, epochs, progress, on_epoch)
        self.layout.unpack(self.result, self.nets)
        for net in self.nets:
            net.eval()
        return self.summaries

    def _module(self, ids: torch.Tensor) -> StackedNets:
        configs = [self.configs[m] for m in ids.tolist()]
        l2 = torch.tensor([2 * c.delta_l2 if self.nets[m].has_deltas else 0.0 for c, m in zip(configs, ids.tolist())])[
            :, None
        ]
        wd = torch.tensor([c.weight_decay for c in configs])[:, None]
        decay = torch.where(self.is_delta, l2, wd) * self.real[ids]
        dropout = torch.tensor([self.nets[m].dropout.p for m in ids.tolist()])
        template = copy.deepcopy(self.base)
        return StackedNets(
            template,
            self.layout,
            self.result[ids],
            self.real[ids],
            decay,
            self.mean[ids],
            self.scale[ids],
            dropout,
            [c.lr for c in configs],
        )

    def _phase(self, phase: str, epochs: torch.Tensor, progress, on_epoch) -> None:
        mask = phase_mask(self.base.n_q, self.main_index, phase)
        ids = ((epochs > 0) & ~self.dropped).nonzero().squeeze(1)
        if not len(ids):
            return
        members = ids.tolist()
        rows = [_phase_rows(self.trains[m], mask) for m in members]
        if any(len(r) == 0 for r in rows):
            raise ValueError(f"no training annotations for the {phase} phase")
        has_val = torch.tensor([self.vals[m] is not None and len(self.vals[m]) > 0 for m in members])
        val_rows = [
            _phase_rows(self.vals[m], mask) if h else torch.zeros(0, dtype=torch.long) for m, h in zip(members, has_val)
        ]
        module = self._module(ids)
        wrapped, optimizer = self.fabric.setup(module, module.optimizer())
        to = self.fabric.to_device
        run = _Phase(
            fabric=self.fabric,
            module=module,
            wrapped=wrapped,
            optimizer=optimizer,
            layout=self.layout,
            mask=to(mask),
            seeds=[self.seeds[m] for m in members],
            noise=[self.noise[m] for m in members],
            phase=phase,
            has_val=has_val,
            max_epochs=epochs[ids],
            batch=torch.tensor([self.configs[m].batch_size for m in members]),
            patience=torch.tensor([self.configs[m].patience for m in members]),
            train=_with_features(module, [to(t) for t in _stack_rows([self.trains[m] for m in members], rows)]),
            n_rows=torch.tensor([len(r) for r in rows]),
            val=_with_features(
                module,
                [
                    to(t)
                    for t in _stack_rows(
                        [self.vals[m] if h else self.trains[m] for m, h in zip(members, has_val)], val_rows
                    )
                ],
            ),
            main=to(phase_mask(self.base.n_q, self.main_index, "finetune")),
            nets=[self.nets[m] for m in members],
            n_features=self.n_features,
        )
        history, stopped = run_phase(run, progress, on_epoch, ids, len(self.nets))
        kept = torch.where(has_val[:, None], run.best_flat.cpu(), run.final_flat().cpu())
        self.result[ids] = kept
        for m, summary in zip(members, phase_summaries(run, history, stopped)):
            self.dropped[m] |= summary["stopped"] in ("pruned", "diverged")
            self.summaries[m][phase] = summary


class PhaseRun(ABC):
    """One training phase of n models, driven epoch by epoch by :func:`run_phase`: the stacked
    networks' mini-batch Adam (:class:`_Phase`) and the cumulative heads' full-batch L-BFGS
    (:class:`llmrubric.model.families.network.cumulative.LbfgsPhase`). Holds ``phase``, ``n``, ``running`` (n,) bool,
    ``has_val`` and ``max_epochs`` (n,), and ``stopping`` (:class:`EarlyStopping`)."""

    @abstractmethod
    def epoch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Train the running models one epoch: loss sums, finite and converged (n,)."""

    @abstractmethod
    def validate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out NLL (n,) of the phase's questions (early stopping) and of the main question (nan: none)."""

    @abstractmethod
    def keep_best(self, improved: torch.Tensor) -> None:
        """Remember the current weights of the ``improved`` models (n,) as their best."""

    @abstractmethod
    def entry(self, j: int, epoch: int, loss: float, val_nll: float) -> dict:
        """Model j's history entry of this epoch."""

    def after_epoch(self) -> None:
        """Called after an epoch in which some model still runs."""


def run_phase(run: PhaseRun, progress, on_epoch, ids: torch.Tensor, n_all: int) -> tuple[list[list], dict]:
    """The training loop: epochs of ``run`` until every model stopped (early, max_epochs, converged,
    diverged or pruned). ``on_epoch(phase, epoch, main_nll)`` gets the main question's held-out NLL
    of all ``n_all`` models (the phase's are ``ids``) and may return a (n_all,) bool tensor to prune.
    Returns each model's history and its stop reason where it did not run to ``max_epochs``."""
    history: list[list] = [[] for _ in range(run.n)]
    stopped: dict[int, str] = {}
    for epoch in range(int(run.max_epochs.max())):
        losses, finite, converged = run.epoch()
        for j in (~finite & run.running).nonzero().squeeze(1).tolist():
            stopped[j] = "diverged"
        run.running &= finite
        val_nll, main_nll = run.validate()
        improved = run.stopping.update(epoch, val_nll, run.running)
        if improved.any():
            run.keep_best(improved)
        for j in run.running.nonzero().squeeze(1).tolist():
            history[j].append(run.entry(j, epoch, float(losses[j]), float(val_nll[j])))
        reported = torch.full((n_all,), math.nan)
        reported[ids] = torch.where(run.running, main_nll, math.nan)
        judged = run.running.clone()  # a model that reports may be pruned, even if this epoch ends its phase
        for reason, ends in (("early", run.stopping.exhausted(val_nll)), ("converged", converged)):
            for j in (run.running & ends).nonzero().squeeze(1).tolist():
                stopped[j] = reason
            run.running &= ~ends
        run.running &= epoch + 1 < run.max_epochs
        if progress is not None:
            progress.update(1)
        if on_epoch is not None:
            prune = on_epoch(run.phase, epoch, reported)
            if prune is not None:
                cut = judged & prune[ids]
                for j in cut.nonzero().squeeze(1).tolist():
                    stopped[j] = "pruned"
                run.running &= ~cut
        if not run.running.any():
            break
        run.after_epoch()
    return history, stopped


def phase_summaries(run: PhaseRun, history: list[list], stopped: dict) -> list[dict]:
    """Each model's summary of a phase: epochs, best epoch, best held-out NLL, stop reason, history."""
    has_val, best_epoch, best = run.has_val, run.stopping.best_epoch, run.stopping.best
    return [
        {
            "epochs": len(history[j]),
            "best_epoch": int(best_epoch[j]) if has_val[j] else len(history[j]) - 1,
            "val_nll": float(best[j]) if has_val[j] else None,
            "stopped": stopped.get(j, "max_epochs"),
            "history": history[j],
        }
        for j in range(run.n)
    ]


@dataclass
class EarlyStopping:
    """Early stopping of n models on held-out NLL: each model's best value and epoch, and its epochs
    without improvement (models without a validation set never improve nor wait)."""

    patience: torch.Tensor  # (n,) epochs without improvement before a model stops
    has_val: torch.Tensor  # (n,) bool: the model has a validation set
    best: torch.Tensor = field(init=False)
    best_epoch: torch.Tensor = field(init=False)
    wait: torch.Tensor = field(init=False)

    def __post_init__(self):
        n = len(self.patience)
        self.best = torch.full((n,), math.inf)
        self.best_epoch = torch.full((n,), -1)
        self.wait = torch.zeros(n, dtype=torch.long)

    def update(self, epoch: int, val_nll: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        """Record an epoch's held-out NLL (n,) of the ``running`` models; returns which improved."""
        improved = running & self.has_val & (val_nll < self.best)
        self.best = torch.where(improved, val_nll, self.best)
        self.best_epoch = torch.where(improved, epoch, self.best_epoch)
        self.wait = torch.where(improved, 0, self.wait + (running & self.has_val).long())
        return improved

    def exhausted(self, val_nll: torch.Tensor) -> torch.Tensor:
        """(n,) bool: out of patience, or a non-finite held-out NLL."""
        return self.has_val & ((self.wait >= self.patience) | ~torch.isfinite(val_nll))


@dataclass
class _Phase(PhaseRun):
    """One phase of the stacked models: shuffled mini-batches and Adam steps (:func:`run_phase` runs the epochs).

    Tensors and lists hold one entry per model of the phase; ``train`` and ``val`` are the
    (unstandardised features, judge, y) of :func:`_stack_rows` (the last row padding)."""

    fabric: lf.Fabric | OnCpu
    module: StackedNets
    wrapped: nn.Module  # the module as Fabric set it up
    optimizer: torch.optim.Optimizer
    layout: ParameterPacking
    nets: list[CalibrationNet]
    n_features: int
    phase: str  # "pretrain" or "finetune"
    mask: torch.Tensor  # (Q,) the questions this phase trains on
    main: torch.Tensor  # (Q,) the main question alone
    seeds: list[int]  # batch order (+ 1 when finetuning)
    noise: list[torch.Generator]  # input dropout masks, on the device
    has_val: torch.Tensor  # (n,) bool
    max_epochs: torch.Tensor  # (n,)
    batch: torch.Tensor  # (n,) batch sizes
    patience: torch.Tensor  # (n,)
    n_rows: torch.Tensor  # (n,) training rows
    train: list[torch.Tensor]
    val: list[torch.Tensor]
    n: int = field(init=False)
    device: torch.device = field(init=False)
    steps: torch.Tensor = field(init=False)  # (n,) optimiser steps per epoch
    best_flat: torch.Tensor = field(init=False)  # (n, P) each model's best parameters so far
    stopping: EarlyStopping = field(init=False)
    running: torch.Tensor = field(init=False)  # (n,) bool: still training
    shuffles: list[torch.Generator] = field(init=False)  # batch orders
    stack: torch.Tensor = field(init=False)  # the models in the stacked tensors (compacted as models stop)
    narrow: torch.Tensor | None = field(init=False)  # positions of the compacted packing (None: the full one)
    narrow_layout: ParameterPacking = field(init=False)
    drops: list[bool] = field(init=False)  # the model uses input dropout

    def __post_init__(self):
        self.n = len(self.seeds)
        self.device = self.mask.device
        self.steps = (self.n_rows + self.batch - 1) // self.batch
        self.best_flat = self.final_flat().detach().clone()
        self.stopping = EarlyStopping(self.patience, self.has_val)
        self.running = torch.ones(self.n, dtype=torch.bool)
        self.shuffles = [torch.Generator().manual_seed(s + (self.phase == "finetune")) for s in self.seeds]
        self.stack = torch.arange(self.n)
        self.narrow, self.narrow_layout = None, self.layout
        self.drops = (self.module.dropout > 0).tolist()

    def final_flat(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack(self.module.members) * self.module.real

    def keep_best(self, improved: torch.Tensor) -> None:
        self.best_flat[improved.to(self.device)] = self.final_flat()[improved.to(self.device)]

    def entry(self, j: int, epoch: int, loss: float, val_nll: float) -> dict:
        return {"epoch": epoch, "train/loss": float(loss / self.steps[j]), "val/nll": val_nll}

    def after_epoch(self) -> None:
        if self.running[self.stack].float().mean() < COMPACT_BELOW:
            self._compact()

    def _compact(self) -> None:
        """Stack only the running models, padded to their own largest hidden sizes."""
        self.stack = self.running.nonzero().squeeze(1)
        layout = ParameterPacking([self.nets[j] for j in self.stack.tolist()], self.n_features)
        if layout.size < self.layout.size:
            self.narrow, self.narrow_layout = layout.index_in(self.layout).to(self.device), layout
        else:
            self.narrow, self.narrow_layout = None, self.layout

    def _chunks(self, order: torch.Tensor, n_rows: torch.Tensor, batch: torch.Tensor, y: torch.Tensor):
        """Every model's mini-batches of this epoch cut into chunks of the smallest batch size C.

        Returns idx (M, T, C) row indices (padding row where empty), ``last`` (M, T): the chunk
        ends its batch, and ``denom`` (M, T): the observed cells of the chunk's batch, so that
        summing the chunks' NLL sums / denom gives each batch's mean NLL.
        """
        n_models, width = order.shape
        pad, size = width - 1, int(batch.min())
        b, n = batch[:, None], n_rows[:, None]
        position = torch.arange(pad)[None, :].expand(n_models, pad)
        valid = position < n
        batch_no, within = position // b, position % b
        per_batch = (b + size - 1) // size
        chunk = batch_no * per_batch + within // size
        batch_size = (n - batch_no * b).clamp(max=b)
        last = (within // size) == (batch_size + size - 1) // size - 1
        chunks = int(chunk[valid].max()) + 1
        slot = torch.where(valid, chunk * size + within % size, chunks * size)
        idx = torch.full((n_models, chunks * size + 1), pad, dtype=torch.long).scatter_(1, slot, order[:, :pad])
        is_last = torch.zeros(n_models, chunks + 1, dtype=torch.bool).scatter_(
            1, torch.where(valid & last, chunk, chunks), True
        )
        cells = ((y >= 0) & self.mask.cpu()).sum(dim=2).gather(1, order[:, :pad])
        batches = int(batch_no.max()) + 1
        batch_cells = torch.zeros(n_models, batches + 1, dtype=torch.long).scatter_add_(
            1, torch.where(valid, batch_no, batches), cells
        )
        denom = batch_cells.gather(1, (torch.arange(chunks)[None, :] // per_batch).clamp(max=batches))
        return idx[:, : chunks * size].view(n_models, chunks, size), is_last[:, :chunks], denom.clamp(min=1).float()

    def epoch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One epoch of shuffled mini-batches for every running model; per-model loss sums, finiteness,
        and convergence (never: Adam runs until early stopping or ``max_epochs``).

        Models with larger batches accumulate the gradients of several chunks before their
        Adam step, so every step computes the same number of rows for every model."""
        stack = self.stack
        features, judge, y = self.train if len(stack) == self.n else (t[stack] for t in self.train)
        n_models, width = judge.shape
        pad = width - 1
        order = torch.full((n_models, width), pad, dtype=torch.long)
        noise = torch.zeros(n_models, width, self.n_features, device=self.device)
        for j, m in enumerate(stack.tolist()):
            if self.running[m]:
                n = int(self.n_rows[m])
                order[j, :n] = torch.randperm(n, generator=self.shuffles[m])
                if self.drops[m]:
                    noise[j, :n] = torch.rand(n, self.n_features, generator=self.noise[m], device=self.device)
        idx, last, denom = self._chunks(order, self.n_rows[stack], self.batch[stack], y.cpu())
        has_rows = (idx != pad).any(dim=2)
        losses, finite = torch.zeros(n_models), torch.ones(n_models, dtype=torch.bool)
        take = torch.arange(n_models, device=self.device)[:, None]
        dropout = self.module.dropout[stack.to(self.device)]
        drops = bool((dropout > 0).any())
        idx, denom = idx.to(self.device), denom.to(self.device)
        running = self.running[stack]
        sdev, models = stack.to(self.device), stack.tolist()
        starts = take * width  # each model's first row in the tensors flattened over (model, row)

        def rows_of(t: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            """(M, C, ·): each model's rows ``at`` (M, C) of ``t`` (M, width, ·), one index_select."""
            flat_rows = (at + starts).view(-1)
            return t.reshape(n_models * width, *t.shape[2:]).index_select(0, flat_rows).view(*at.shape, *t.shape[2:])

        for step in range(idx.shape[1]):
            active = running & has_rows[:, step] & finite
            rows = torch.where(active.to(self.device)[:, None], idx[:, step], pad)
            update = active & last[:, step]
            flat = self.module.flat(sdev, self.narrow)
            keep = rows_of(noise, rows) >= dropout[:, None, None] if drops else None
            logits = self.wrapped(sdev, self.narrow_layout, flat, rows_of(features, rows), rows_of(judge, rows), keep)
            loss = masked_nll(torch.log_softmax(logits, dim=-1), rows_of(y, rows), self.mask, denom[:, step])
            self.fabric.backward(loss.sum())
            loss = loss.detach().cpu()
            ok = torch.isfinite(loss)
            finite &= ok | ~active
            self._step([models[j] for j in (update & ok).nonzero().squeeze(1).tolist()])
            losses += torch.where(active & ok, loss, 0.0)
        out_finite = torch.ones(self.n, dtype=torch.bool)
        out_finite[stack] = finite
        out_losses = torch.zeros(self.n)
        out_losses[stack] = losses
        return out_losses, out_finite, torch.zeros(self.n, dtype=torch.bool)

    def _step(self, models: list[int]) -> None:
        """One Adam step of ``models`` (their accumulated gradients); the others keep theirs for later."""
        rows = self.module.members
        held = {}
        chosen = set(models)
        for j, row in enumerate(rows):
            if j not in chosen and row.grad is not None:
                held[j], row.grad = row.grad, None
        if models:
            self.module.finish_gradients(models)
            self.optimizer.step()
        for j in models:
            rows[j].grad = None
        for j, grad in held.items():
            rows[j].grad = grad

    @torch.no_grad()
    def validate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out NLL of the phase's questions (early stopping) and of the main question (n,)."""
        nan = torch.full((self.n,), math.nan)
        if not self.has_val.any():
            return nan, nan.clone()
        stack = self.stack
        sdev = stack.to(self.device)
        vf, vjudge, vy = (t[sdev] for t in self.val)
        logp = torch.log_softmax(
            self.wrapped(sdev, self.narrow_layout, self.module.flat(sdev, self.narrow), vf, vjudge), dim=-1
        )
        phase, main = masked_nll(logp, vy, self.mask).cpu(), masked_nll(logp, vy, self.main).cpu()
        val, main_nll = nan.clone(), nan.clone()
        val[stack], main_nll[stack] = phase, main
        return torch.where(self.has_val, val, math.nan), torch.where(self.has_val, main_nll, math.nan)
