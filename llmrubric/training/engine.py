"""Fold-vectorised training: many calibration networks trained as one batched program.

The fold models of a cross-validation, several seeds each, and even several search trials
are trained together: their parameters are stacked with a leading model dimension and every
step runs all of them at once (:meth:`CalibrationNet.stacked_forward`, batched einsums).
Models may differ in hidden sizes (parameters are zero-padded to the largest, and the
padding is kept at zero by masking its gradient), inputs (probabilities, expected answers or
both; judge indicator or none: all run on the widest feature set, each model's first layer
sees only its own columns), input dropout and every
:class:`~llmrubric.training.module.TrainConfig` number (learning rate, weight decay, delta L2,
batch size, epochs, patience). Each model keeps its own training rows, batch order, Adam
state, validation set and early stopping, so the result equals training each one alone
with :func:`llmrubric.training.module.train_network` (tested). Models that stop are dropped from the
stacked tensors (and the padding shrinks to the running models' own sizes), so a program
costs what its running models cost.
"""

from __future__ import annotations

import copy
import math

import torch

from llmrubric.model.encoding import Encoded
from llmrubric.model.network import CalibrationNet
from llmrubric.training.module import TrainConfig

BETAS, EPS = (0.9, 0.999), 1e-8
COMPACT_BELOW = 0.75  # drop stopped models from the stack once fewer than this share still run


def train_stacked(
    nets: list[CalibrationNet],
    trains: list[Encoded],
    vals: list[Encoded | None],
    main_index: int,
    config: TrainConfig | list[TrainConfig],
    seeds: list[int],
    progress=None,
    on_epoch=None,
) -> list[dict]:
    """Train ``nets`` in place, model m on ``trains[m]`` with early stopping on ``vals[m]``.

    Same procedure as :func:`llmrubric.training.module.train_network` (pretrain on all questions,
    finetune on the main one; shuffled permutations seeded per model; Adam with weight decay
    on the shared weights and ``delta_l2`` on the deltas; best weights restored). ``config``
    is one :class:`TrainConfig` or one per model. Returns one summary per model and phase
    with ``epochs``, ``best_epoch``, ``val_nll``, ``stopped`` (``early``, ``max_epochs``,
    ``pruned`` or ``diverged``: a non-finite training loss; the model keeps its best
    weights and skips the later phase) and the per-epoch ``history``.

    ``progress`` (a tqdm bar, optional) is advanced once per epoch. ``on_epoch(phase, epoch,
    main_nll)``, main_nll (M,): the held-out NLL of the main question (comparable across
    phases; nan where a model has no validation set or does not run), is called after every
    epoch; it may return a (M,) bool tensor of models to stop now (pruning) or raise to abort.
    """
    configs = config if isinstance(config, list) else [config] * len(nets)
    if not (len(nets) == len(trains) == len(vals) == len(configs) == len(seeds)):
        raise ValueError("train_stacked needs one training set, validation set, config and seed per network")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # Adam's decaying moments turn denormal, which is many times slower
    try:
        return _Program(nets, trains, vals, main_index, configs, seeds).run(progress, on_epoch)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


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


def _stacked_nll(
    logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-model NLL over observed cells: logits (M, B, Q, O), y (M, B, Q) → (M,); the sum divided
    by ``denom`` (M,) when given, else the mean."""
    observed = (y >= 0) & mask
    picked = torch.log_softmax(logits, dim=-1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    total = -(picked * observed).sum(dim=(1, 2))
    return total / (denom if denom is not None else observed.sum(dim=(1, 2)).clamp(min=1))


def _template(nets: list[CalibrationNet]) -> CalibrationNet:
    """A network computing the widest feature set of ``nets`` (inputs ``both``, and the judge
    indicator unless they are personalized by deltas); its parameters are not used."""
    base = nets[0]
    for net in nets[1:]:
        same = (
            net.has_deltas == base.has_deltas
            and net.n_judges == base.n_judges
            and net.n_probs == base.n_probs
            and net.n_blocks == base.n_blocks
            and net.option_mask.shape == base.option_mask.shape
            and torch.equal(net.expected_weights, base.expected_weights)
            and net.extra_dim == base.extra_dim
        )
        if not same:
            raise ValueError(
                "train_stacked needs networks with the same feature blocks, judges, questions and kind of personalization"
            )
    template = copy.deepcopy(base)
    template.inputs, template.personalize = "both", "deltas" if base.has_deltas else "input"
    return template


class _Layout:
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
        return {k: flat[:, o : o + n].view(flat.shape[0], *shape) for k, shape, o, n in self.entries}

    def transfer(self, flat: torch.Tensor, dest: _Layout) -> torch.Tensor:
        """Rows of ``flat`` (this layout) rewritten in layout ``dest``: each parameter's leading block
        common to both shapes is copied, the rest is zero (padding either way)."""
        out = flat.new_zeros(flat.shape[0], dest.size)
        source, target = self.views(flat), dest.views(out)
        shapes = {k: shape for k, shape, _, _ in self.entries}
        for k, shape, _, _ in dest.entries:
            common = (slice(None), *(slice(0, min(a, b)) for a, b in zip(shape, shapes[k])))
            target[k][common] = source[k][common]
        return out

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
        """Flat padded parameters (M, P), the mask of real entries, and the mask of delta entries."""
        flat, real = torch.zeros(len(nets), self.size), torch.zeros(len(nets), self.size)
        is_delta = torch.zeros(self.size, dtype=torch.bool)
        for k, _shape, o, n in self.entries:
            is_delta[o : o + n] = k.startswith("delta")
        for m, net in enumerate(nets):
            views, masks = self.views(flat[m : m + 1]), self.views(real[m : m + 1])
            for k, p in net.named_parameters():
                region = self._region(net, k, p.shape)
                views[k][region] = p.detach()
                masks[k][region] = 1.0
        return flat, real, is_delta

    @torch.no_grad()
    def unpack(self, flat: torch.Tensor, nets: list[CalibrationNet]) -> None:
        for m, net in enumerate(nets):
            views = self.views(flat[m : m + 1])
            for k, p in net.named_parameters():
                p.copy_(views[k][self._region(net, k, p.shape)])


class _Program:
    """State of the stacked models; per-model tensors are compacted together as models stop."""

    def __init__(self, nets, trains, vals, main_index, configs, seeds):
        self.nets, self.trains, self.vals, self.main_index, self.configs, self.seeds = (
            nets,
            trains,
            vals,
            main_index,
            configs,
            seeds,
        )
        self.base = _template(nets)
        n_features = self.base.n_widest_features
        self.layout = _Layout(nets, n_features)
        self.result, self.real, is_delta = self.layout.pack(nets)
        mean, scale = torch.zeros(len(nets), n_features), torch.ones(len(nets), n_features)
        for m, net in enumerate(nets):
            mean[m, net.feature_columns], scale[m, net.feature_columns] = net.input_mean, net.input_scale
        self.per_model = {
            "lr": torch.tensor([c.lr for c in configs], dtype=torch.float64),
            "wd": torch.tensor([c.weight_decay for c in configs])[:, None],
            "l2": torch.tensor([2 * c.delta_l2 if n.has_deltas else 0.0 for c, n in zip(configs, nets)])[:, None],
            "batch": torch.tensor([c.batch_size for c in configs]),
            "patience": torch.tensor([c.patience for c in configs]),
            "dropout": torch.tensor([n.dropout.p for n in nets]),
            "mean": mean,
            "scale": scale,
        }
        self.is_delta = is_delta
        self.summaries: list[dict] = [{} for _ in nets]
        self.best: dict[int, tuple[float, int]] = {}
        self.dropped = torch.zeros(len(nets), dtype=torch.bool)  # pruned or diverged: no further phases
        self.noise = torch.Generator().manual_seed(seeds[0])

    def run(self, progress, on_epoch) -> list[dict]:
        for phase in ("pretrain", "finetune"):
            epochs = torch.tensor([getattr(c, f"{phase}_epochs") for c in self.configs])
            if (epochs > 0).any():
                self._phase(phase, epochs, progress, on_epoch)
        self.layout.unpack(self.result, self.nets)
        for net in self.nets:
            net.eval()
        return self.summaries

    def _phase(self, phase: str, epochs: torch.Tensor, progress, on_epoch) -> None:
        mask = torch.zeros(self.base.n_q, dtype=torch.bool)
        mask[:] = phase == "pretrain"
        mask[self.main_index] = True
        ids = ((epochs > 0) & ~self.dropped).nonzero().squeeze(1)
        if not len(ids):
            return
        rows = [_phase_rows(self.trains[m], mask) for m in ids.tolist()]
        if any(len(r) == 0 for r in rows):
            raise ValueError(f"no training annotations for the {phase} phase")
        has_val = torch.tensor([self.vals[m] is not None and len(self.vals[m]) > 0 for m in ids.tolist()])
        val_rows = [
            _phase_rows(self.vals[m], mask) if h else torch.zeros(0, dtype=torch.long)
            for m, h in zip(ids.tolist(), has_val)
        ]
        x, judge, y = _stack_rows([self.trains[m] for m in ids.tolist()], rows)
        vx, vjudge, vy = _stack_rows(
            [self.vals[m] if h else self.trains[m] for m, h in zip(ids.tolist(), has_val)], val_rows
        )
        decay = torch.where(self.is_delta, self.per_model["l2"][ids], self.per_model["wd"][ids]) * self.real[ids]
        s = {
            "layout": self.layout,
            "ids": ids,
            "flat": self.result[ids].clone(),
            "real": self.real[ids],
            "decay": decay,
            "m": torch.zeros(len(ids), self.layout.size),
            "v": torch.zeros(len(ids), self.layout.size),
            "t": torch.zeros(len(ids)),
            "best_flat": self.result[ids].clone(),
            "best": torch.full((len(ids),), math.inf),
            "best_epoch": torch.full((len(ids),), -1),
            "wait": torch.zeros(len(ids), dtype=torch.long),
            "running": torch.ones(len(ids), dtype=torch.bool),
            "has_val": has_val,
            "max_epochs": epochs[ids],
            "n_rows": torch.tensor([len(r) for r in rows]),
            "x": x,
            "judge": judge,
            "y": y,
            "vx": vx,
            "vjudge": vjudge,
            "vy": vy,
            **{k: v[ids] for k, v in self.per_model.items()},
        }
        s["steps"] = (s["n_rows"] + s["batch"] - 1) // s["batch"]
        s["padded"], s["decayed"] = not bool(s["real"].all()), bool(decay.any())
        generators = {int(m): torch.Generator().manual_seed(self.seeds[m] + (phase == "finetune")) for m in ids}
        history = {int(m): [] for m in ids}
        stopped = {}
        for epoch in range(int(epochs.max())):
            losses, finite = self._epoch(s, generators, mask)
            for j in (~finite & s["running"]).nonzero().squeeze(1).tolist():
                stopped[int(s["ids"][j])] = "diverged"
            s["running"] &= finite
            val_nll, main_nll = self._validate(s, mask)
            improved = s["running"] & s["has_val"] & (val_nll < s["best"])
            s["best"] = torch.where(improved, val_nll, s["best"])
            s["best_epoch"] = torch.where(improved, epoch, s["best_epoch"])
            s["best_flat"][improved] = s["flat"][improved]
            s["wait"] = torch.where(improved, 0, s["wait"] + (s["running"] & s["has_val"]).long())
            for j, m in enumerate(s["ids"].tolist()):
                if s["running"][j]:
                    history[m].append(
                        {"epoch": epoch, "train/loss": float(losses[j] / s["steps"][j]), "val/nll": float(val_nll[j])}
                    )
            reported = torch.full((len(self.nets),), math.nan)
            reported[s["ids"]] = torch.where(s["running"], main_nll, math.nan)
            judged = s["running"].clone()  # a model that reports may be pruned, even if this epoch ends its phase
            early = s["has_val"] & ((s["wait"] >= s["patience"]) | ~torch.isfinite(val_nll))
            for j in (s["running"] & early).nonzero().squeeze(1).tolist():
                stopped[int(s["ids"][j])] = "early"
            s["running"] &= ~early
            s["running"] &= epoch + 1 < s["max_epochs"]
            if progress is not None:
                progress.update(1)
            if on_epoch is not None:
                prune = on_epoch(phase, epoch, reported)
                if prune is not None:
                    cut = judged & prune[s["ids"]]
                    for j in cut.nonzero().squeeze(1).tolist():
                        stopped[int(s["ids"][j])] = "pruned"
                    s["running"] &= ~cut
            if not s["running"].any():
                break
            if s["running"].float().mean() < COMPACT_BELOW:
                self._retire(s, ~s["running"])
                s = self._narrow(
                    {k: (v[s["running"]] if isinstance(v, torch.Tensor) and v.dim() else v) for k, v in s.items()}
                )
        self._retire(s, torch.ones(len(s["ids"]), dtype=torch.bool))
        for m, reason in stopped.items():
            self.dropped[m] |= reason in ("pruned", "diverged")
        for j, m in enumerate(ids.tolist()):
            best, best_epoch = self.best[m]
            self.summaries[m][phase] = {
                "epochs": len(history[m]),
                "best_epoch": best_epoch if has_val[j] else len(history[m]) - 1,
                "val_nll": best if has_val[j] else None,
                "stopped": stopped.get(m, "max_epochs"),
                "history": history[m],
            }

    def _narrow(self, s: dict) -> dict:
        """Pad the running models only to their own largest hidden sizes."""
        layout = _Layout([self.nets[m] for m in s["ids"].tolist()], self.layout.n_features)
        if layout.size == s["layout"].size:
            return s
        for k in ("flat", "best_flat", "real", "decay", "m", "v"):
            s[k] = s["layout"].transfer(s[k], layout)
        s["layout"], s["padded"] = layout, not bool(s["real"].all())
        return s

    def _retire(self, s: dict, which: torch.Tensor) -> None:
        """Write the weights of the models in ``which`` (their best epoch's when validated) to the result."""
        keep = torch.where(s["has_val"][:, None], s["best_flat"], s["flat"])
        self.result[s["ids"][which]] = s["layout"].transfer(keep[which].detach(), self.layout)
        for j in which.nonzero().squeeze(1).tolist():
            self.best[int(s["ids"][j])] = (float(s["best"][j]), int(s["best_epoch"][j]))

    def _forward(self, s: dict, x: torch.Tensor, judge: torch.Tensor, params: dict, train: bool) -> torch.Tensor:
        dropout = s["dropout"] if train and bool((s["dropout"] > 0).any()) else None
        return self.base.stacked_forward(params, s["mean"], s["scale"], x, judge, dropout, self.noise)

    def _chunks(
        self, s: dict, order: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every model's mini-batches of this epoch cut into chunks of the smallest batch size C.

        Returns idx (M, T, C) row indices (padding row where empty), ``last`` (M, T): the chunk
        ends its batch, and ``denom`` (M, T): the observed cells of the chunk's batch, so that
        summing the chunks' NLL sums / denom gives each batch's mean NLL.
        """
        n_models, width = order.shape
        pad, size = width - 1, int(s["batch"].min())
        b, n = s["batch"][:, None], s["n_rows"][:, None]
        position = torch.arange(pad)[None, :].expand(n_models, pad)
        valid = position < n
        batch, within = position // b, position % b
        per_batch = (b + size - 1) // size
        chunk = batch * per_batch + within // size
        batch_size = (n - batch * b).clamp(max=b)
        last = (within // size) == (batch_size + size - 1) // size - 1
        chunks = int(chunk[valid].max()) + 1
        slot = torch.where(valid, chunk * size + within % size, chunks * size)
        idx = torch.full((n_models, chunks * size + 1), pad, dtype=torch.long).scatter_(1, slot, order[:, :pad])
        is_last = torch.zeros(n_models, chunks + 1, dtype=torch.bool).scatter_(
            1, torch.where(valid & last, chunk, chunks), True
        )
        cells = ((s["y"] >= 0) & mask).sum(dim=2).gather(1, order[:, :pad])
        batches = int(batch.max()) + 1
        batch_cells = torch.zeros(n_models, batches + 1, dtype=torch.long).scatter_add_(
            1, torch.where(valid, batch, batches), cells
        )
        denom = batch_cells.gather(1, (torch.arange(chunks)[None, :] // per_batch).clamp(max=batches))
        return idx[:, : chunks * size].view(n_models, chunks, size), is_last[:, :chunks], denom.clamp(min=1).float()

    def _epoch(self, s: dict, generators: dict, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch of shuffled mini-batches for every running model; per-model loss sums and finiteness.

        Models with larger batches accumulate the gradients of several chunks before their
        Adam step, so every step computes the same number of rows for every model."""
        n_models, width = s["x"].shape[:2]
        pad = width - 1
        order = torch.full((n_models, width), pad, dtype=torch.long)
        for j, m in enumerate(s["ids"].tolist()):
            if s["running"][j]:
                n = int(s["n_rows"][j])
                order[j, :n] = torch.randperm(n, generator=generators[m])
        idx, last, denom = self._chunks(s, order, mask)
        has_rows = (idx != pad).any(dim=2)
        losses, finite = torch.zeros(n_models), torch.ones(n_models, dtype=torch.bool)
        take = torch.arange(n_models)[:, None]
        accumulated = torch.zeros_like(s["flat"]) if bool((s["batch"] > idx.shape[2]).any()) else None
        for step in range(idx.shape[1]):
            active = s["running"] & has_rows[:, step] & finite
            rows = torch.where(active[:, None], idx[:, step], pad)
            leaves = {k: v.detach().requires_grad_() for k, v in s["layout"].views(s["flat"]).items()}
            logits = self._forward(s, s["x"][take, rows], s["judge"][take, rows], leaves, True)
            loss = _stacked_nll(logits, s["y"][take, rows], mask, denom[:, step])
            grads = torch.autograd.grad(loss.sum(), list(leaves.values()), allow_unused=True, materialize_grads=True)
            grad = torch.cat([g.reshape(n_models, -1) for g in grads], dim=1)
            ok = torch.isfinite(loss)
            finite &= ok | ~active
            update = active & ok & last[:, step]
            if accumulated is not None:
                accumulated += torch.where((active & ok)[:, None], grad, 0.0)
                grad = accumulated.clone()
                accumulated[update] = 0.0
            self._adam(s, grad, update)
            losses += torch.where(active & ok, loss.detach(), 0.0)
        return losses, finite

    @torch.no_grad()
    def _adam(self, s: dict, grad: torch.Tensor, on: torch.Tensor) -> None:
        """torch.optim.Adam's update (L2 added to the gradient) on the models where ``on`` (M,) is true:
        PyTorch's fused Adam kernel, once per learning rate."""
        if s["padded"]:
            grad.mul_(s["real"])
        if s["decayed"]:
            grad.addcmul_(s["flat"], s["decay"])
        s["t"] += on
        groups: dict[float, list[int]] = {}
        for j, lr in zip(on.nonzero().squeeze(1).tolist(), s["lr"][on].tolist()):
            groups.setdefault(lr, []).append(j)
        for lr, group in groups.items():
            torch._fused_adam_(
                [s["flat"][j] for j in group],
                [grad[j] for j in group],
                [s["m"][j] for j in group],
                [s["v"][j] for j in group],
                [],
                [s["t"][j] for j in group],
                lr=lr,
                beta1=BETAS[0],
                beta2=BETAS[1],
                weight_decay=0.0,
                eps=EPS,
                amsgrad=False,
                maximize=False,
            )

    @torch.no_grad()
    def _validate(self, s: dict, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out NLL of the phase's questions (early stopping) and of the main question (M,)."""
        if not s["has_val"].any():
            return torch.full((len(s["ids"]),), math.nan), torch.full((len(s["ids"]),), math.nan)
        logits = self._forward(s, s["vx"], s["vjudge"], s["layout"].views(s["flat"]), False)
        main = torch.zeros_like(mask)
        main[self.main_index] = True
        phase, main_nll = _stacked_nll(logits, s["vy"], mask), _stacked_nll(logits, s["vy"], main)
        return torch.where(s["has_val"], phase, math.nan), torch.where(s["has_val"], main_nll, math.nan)
