"""Fold-vectorised training: many calibration networks trained as one batched program.

The k fold models of a cross-validation (and several seeds each) have the same
architecture; their parameters are stacked with a leading model dimension and every step
runs all of them at once (:meth:`CalibrationNet.stacked_forward`, batched einsums). Each model keeps its own training
rows, batch order, Adam state, validation set and early stopping, so the result equals
training each one alone with :func:`llmrubric.module.train_network` (tested) at about the
cost of one fit.
"""

from __future__ import annotations

import math

import torch
from llmrubric.data import Encoded
from llmrubric.model import CalibrationNet
from llmrubric.module import TrainConfig

BETAS, EPS = (0.9, 0.999), 1e-8


def _stack_rows(datas: list[Encoded], rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, max rows + 1, ·) tensors of each model's selected rows; the last row is padding (y = -1)."""
    width = max(len(r) for r in rows) + 1
    x = torch.zeros(len(datas), width, datas[0].x.shape[1])
    judge = torch.full((len(datas), width), -1, dtype=torch.long)
    y = torch.full((len(datas), width, datas[0].y.shape[1]), -1, dtype=torch.long)
    for m, (data, r) in enumerate(zip(datas, rows)):
        x[m, : len(r)], judge[m, : len(r)], y[m, : len(r)] = data.x[r], data.judge[r], data.y[r]
    return x, judge, y


def _phase_rows(data: Encoded, mask: torch.Tensor) -> torch.Tensor:
    return ((data.y >= 0) & mask).any(dim=1).nonzero().squeeze(1)


class _Adam:
    """torch.optim.Adam's update on the flat (M, P) parameters, applied only to the active models."""

    def __init__(self, flat: torch.Tensor, lr: float, weight_decay: torch.Tensor):
        self.lr, self.weight_decay = lr, weight_decay
        self.m, self.v = torch.zeros_like(flat), torch.zeros_like(flat)
        self.t = torch.zeros(flat.shape[0], 1)

    @torch.no_grad()
    def step(self, flat: torch.Tensor, grad: torch.Tensor, active: torch.Tensor) -> None:
        """flat, grad: (M, P); active: (M,) bool."""
        on = active[:, None]
        self.t += on
        b1, b2 = BETAS
        t = self.t.clamp(min=1)
        g = grad + self.weight_decay * flat
        self.m = torch.where(on, self.m.lerp(g, 1 - b1), self.m)
        self.v = torch.where(on, self.v * b2 + (1 - b2) * g * g, self.v)
        denom = self.v.sqrt() / (1 - b2**t).sqrt() + EPS
        flat.copy_(torch.where(on, flat - (self.lr / (1 - b1**t)) * self.m / denom, flat))


class _FlatParams:
    """The parameters of M networks as one (M, P) leaf tensor, with per-name views for the forward pass."""

    def __init__(self, nets: list[CalibrationNet]):
        named = list(nets[0].named_parameters())
        self.shapes = [(k, p.shape, p.numel()) for k, p in named]
        self.flat = torch.stack([torch.cat([p.detach().flatten() for p in n.parameters()]) for n in nets]).requires_grad_()
        self.is_delta = torch.cat([torch.full((n,), k.startswith("delta")) for k, _, n in self.shapes])

    def views(self) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for k, shape, n in self.shapes:
            out[k] = self.flat[:, offset : offset + n].view(self.flat.shape[0], *shape)
            offset += n
        return out

    @torch.no_grad()
    def write_to(self, nets: list[CalibrationNet]) -> None:
        views = self.views()
        for m, net in enumerate(nets):
            for k, p in net.named_parameters():
                p.copy_(views[k][m])


def train_stacked(
    nets: list[CalibrationNet],
    trains: list[Encoded],
    vals: list[Encoded | None],
    main_index: int,
    config: TrainConfig,
    seeds: list[int],
    progress=None,
    on_epoch=None,
) -> list[dict]:
    """Train ``nets`` in place, model m on ``trains[m]`` with early stopping on ``vals[m]``.

    Same procedure as :func:`llmrubric.module.train_network` (pretrain on all questions,
    finetune on the main one; shuffled permutations seeded per model; Adam with weight decay
    on the shared weights and ``delta_l2`` on the deltas; best weights restored). Returns one
    summary per model, with the per-epoch ``history`` of train loss and validation NLL.
    ``progress`` (a tqdm bar, optional) is advanced once per epoch; ``on_epoch(phase, epoch,
    val_nll)``, with val_nll (M,) (nan where a model has no validation set or has stopped),
    is called after every epoch and may raise to abort (e.g. ``optuna.TrialPruned``).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(nets, trains, vals, main_index, config, seeds, progress, on_epoch)
    finally:
        torch.set_num_threads(threads)


def _stacked_nll(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-model mean NLL over observed cells: logits (M, B, Q, O), y (M, B, Q) → (M,)."""
    observed = (y >= 0) & mask
    picked = torch.log_softmax(logits, dim=-1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * observed).sum(dim=(1, 2)) / observed.sum(dim=(1, 2)).clamp(min=1)


def _train(nets, trains, vals, main_index, config, seeds, progress, on_epoch) -> list[dict]:
    base = nets[0]
    params = _FlatParams(nets)
    flat = params.flat
    mean = torch.stack([n.input_mean for n in nets])
    scale = torch.stack([n.input_scale for n in nets])
    penalize = bool(config.delta_l2) and base.has_deltas
    decay = torch.where(params.is_delta, 0.0, config.weight_decay)
    n_models = len(nets)
    x, judge, y = _stack_rows(trains, [torch.arange(len(d)) for d in trains])
    pad = x.shape[1] - 1
    for net in nets:
        net.train()
    base.train()
    summaries: list[dict] = [{} for _ in nets]
    for phase, epochs in (("pretrain", config.pretrain_epochs), ("finetune", config.finetune_epochs)):
        if epochs <= 0:
            continue
        mask = torch.zeros(nets[0].n_q, dtype=torch.bool)
        mask[:] = phase == "pretrain"
        mask[main_index] = True
        rows = [_phase_rows(d, mask) for d in trains]
        if any(len(r) == 0 for r in rows):
            raise ValueError(f"no training annotations for the {phase} phase")
        has_val = torch.tensor([v is not None and len(v) > 0 for v in vals])
        val_rows = [_phase_rows(v, mask) if h else torch.zeros(0, dtype=torch.long) for v, h in zip(vals, has_val)]
        vx, vjudge, vy = _stack_rows([v if h else trains[0] for v, h in zip(vals, has_val)], val_rows)
        generators = [torch.Generator().manual_seed(s + (phase == "finetune")) for s in seeds]
        steps = torch.tensor([math.ceil(len(r) / config.batch_size) for r in rows])
        adam = _Adam(flat, config.lr, decay)
        best = torch.full((n_models,), math.inf)
        best_epoch = torch.full((n_models,), -1)
        wait = torch.zeros(n_models, dtype=torch.long)
        running = torch.ones(n_models, dtype=torch.bool)
        best_flat = flat.detach().clone()
        history = [[] for _ in nets]
        epochs_run = torch.zeros(n_models, dtype=torch.long)
        for epoch in range(epochs):
            order = torch.full((n_models, int(steps.max()) * config.batch_size), pad, dtype=torch.long)
            for m, r in enumerate(rows):
                order[m, : len(r)] = r[torch.randperm(len(r), generator=generators[m])]
            losses = torch.zeros(n_models)
            for s in range(int(steps.max())):
                active = running & (s < steps)
                idx = order[:, s * config.batch_size : (s + 1) * config.batch_size]
                take = torch.arange(n_models)[:, None]
                loss = _stacked_nll(base.stacked_forward(params.views(), mean, scale, x[take, idx], judge[take, idx]), y[take, idx], mask)
                if penalize:
                    loss = loss + config.delta_l2 * (flat**2 * params.is_delta).sum(dim=1)
                (grad,) = torch.autograd.grad(loss.sum(), flat)
                adam.step(flat, grad, active)
                losses += torch.where(active, loss.detach(), 0.0)
            epochs_run += running.long()
            val_nll = torch.full((n_models,), math.nan)
            if has_val.any():
                with torch.no_grad():
                    base.eval()
                    val_nll = torch.where(has_val, _stacked_nll(base.stacked_forward(params.views(), mean, scale, vx, vjudge), vy, mask), math.nan)
                    base.train()
                improved = running & has_val & (val_nll < best)
                best = torch.where(improved, val_nll, best)
                best_epoch = torch.where(improved, epoch, best_epoch)
                best_flat[improved] = flat.detach()[improved]
                wait = torch.where(improved, 0, wait + (running & has_val).long())
                stop = has_val & ((wait >= config.patience) | ~torch.isfinite(val_nll))
                running = running & ~stop
            for m in range(n_models):
                if epochs_run[m] == epoch + 1:
                    history[m].append({"epoch": epoch, "train/loss": float(losses[m] / steps[m]), "val/nll": float(val_nll[m])})
            if progress is not None:
                progress.update(1)
            if on_epoch is not None:
                on_epoch(phase, epoch, torch.where(epochs_run == epoch + 1, val_nll, math.nan))
            if not running.any():
                break
        with torch.no_grad():
            flat.copy_(torch.where(has_val[:, None], best_flat, flat))
        for m in range(n_models):
            summaries[m][phase] = {
                "epochs": int(epochs_run[m]),
                "best_epoch": int(best_epoch[m]) if has_val[m] else epochs - 1,
                "val_nll": float(best[m]) if has_val[m] else None,
                "history": history[m],
            }
    params.write_to(nets)
    for net in nets:
        net.eval()
    return summaries
