"""LightningModule (masked NLL, two phases) and the pretrain → finetune procedure."""

from __future__ import annotations

import copy
import logging
import math
import warnings
from dataclasses import dataclass, fields

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_range
from llmrubric.model.encoding import Encoded
from llmrubric.model.network import CalibrationNet
from llmrubric.model.ordinal import blend

log = logging.getLogger(__name__)
for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
    logging.getLogger(name).setLevel(logging.ERROR)
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*GPU available but not used.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*is deprecated.*")


@dataclass
class TrainConfig:
    """Optimisation settings (``trainer.*``, the one definition of their defaults); epochs are maxima,
    each phase stops early on held-out NLL."""

    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    delta_l2: float = 0.01
    pretrain_epochs: int = 100
    finetune_epochs: int = 100
    patience: int = 20
    val_fraction: float = 0.2
    temperature_scaling: bool = True
    ordinal_blend: bool = True
    engine: str = "stacked"

    def __post_init__(self):
        """Each setting checked (and converted) here, named ``trainer.<field>`` in the error."""
        if self.engine not in ("stacked", "lightning"):
            raise InputError(f"{self.engine!r} is not an engine (stacked or lightning)", setting="trainer.engine")
        for name, (low, integer, open_low, high) in LIMITS.items():
            setattr(
                self,
                name,
                check_range(
                    f"trainer.{name}",
                    getattr(self, name),
                    low,
                    high,
                    open_low=open_low,
                    integer=integer,
                    open_high=name == "val_fraction",
                ),
            )
        for name in ("temperature_scaling", "ordinal_blend"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{getattr(self, name)!r} is not true or false", setting=f"trainer.{name}")

    @classmethod
    def from_dict(cls, data: dict | None) -> TrainConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(
                f"unknown trainer setting(s) {unknown}; known: {sorted(known)}", setting=f"trainer.{unknown[0]}"
            )
        return cls(**data)


LIMITS = {  # field: (lower bound, integer, lower bound excluded, upper bound)
    "batch_size": (1, True, False, None),
    "lr": (0, False, True, None),
    "weight_decay": (0, False, False, None),
    "delta_l2": (0, False, False, None),
    "pretrain_epochs": (0, True, False, None),
    "finetune_epochs": (0, True, False, None),
    "patience": (1, True, False, None),
    "val_fraction": (0, False, False, 1),
}


def masked_nll(logits: torch.Tensor, y: torch.Tensor, question_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of -log p over observed cells of the masked questions, and their count.

    logits: (B, Q, O) with -inf padding; y: (B, Q) option index or -1; question_mask: (Q,) bool.
    """
    observed = (y >= 0) & question_mask[None, :]
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * observed).sum(), observed.sum()


class CalibrationModule(pl.LightningModule):
    """Trains a :class:`CalibrationNet` by maximum likelihood over observed cells.

    ``phase`` is ``"pretrain"`` (all questions) or ``"finetune"`` (the main question only).
    Weight decay applies to the shared weights; ``delta_l2`` penalises the judge deltas.
    """

    def __init__(self, net: CalibrationNet, main_index: int, config: TrainConfig):
        super().__init__()
        self.net, self.main_index, self.config = net, main_index, config
        self.phase = "pretrain"

    def question_mask(self) -> torch.Tensor:
        mask = torch.ones(self.net.n_q, dtype=torch.bool)
        if self.phase == "finetune":
            mask[:] = False
            mask[self.main_index] = True
        return mask

    def training_step(self, batch, batch_idx):
        x, judge, y = batch
        total, count = masked_nll(self.net(x, judge), y, self.question_mask())
        loss = total / count.clamp(min=1)
        if self.config.delta_l2 and self.net.has_deltas:
            loss = loss + self.config.delta_l2 * self.net.delta_penalty()
        return loss

    def validation_step(self, batch, batch_idx):
        x, judge, y = batch
        total, count = masked_nll(self.net(x, judge), y, self.question_mask())
        self.log("val/nll", total / count.clamp(min=1), prog_bar=False, batch_size=len(x))

    def configure_optimizers(self):
        groups = [{"params": self.net.shared_parameters(), "weight_decay": self.config.weight_decay}]
        if self.net.has_deltas:
            groups.append({"params": self.net.delta_parameters(), "weight_decay": 0.0})
        return torch.optim.Adam(groups, lr=self.config.lr)


class RestoreBest(pl.Callback):
    """Keep the weights of the epoch with the lowest ``val/nll`` and restore them at the end."""

    def __init__(self):
        self.best, self.state, self.best_epoch = math.inf, None, -1

    def on_validation_epoch_end(self, trainer, module):
        value = trainer.callback_metrics.get("val/nll")
        if value is not None and float(value) < self.best:
            self.best, self.best_epoch = float(value), trainer.current_epoch
            self.state = copy.deepcopy(module.net.state_dict())

    def on_fit_end(self, trainer, module):
        if self.state is not None:
            module.net.load_state_dict(self.state)


class PermutationBatches(torch.utils.data.Sampler):
    """Batches of indices: one fresh permutation of ``n`` per epoch from ``generator`` (or in order)."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator | None):
        self.n, self.batch_size, self.generator = n, batch_size, generator

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator) if self.generator is not None else torch.arange(self.n)
        return iter(order.split(self.batch_size))

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)


def _loader(data: Encoded, batch_size: int, shuffle: bool, seed: int) -> DataLoader:
    """Whole batches indexed at once (no per-sample collation); shuffled permutations if ``shuffle``."""
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    sampler = PermutationBatches(len(data), batch_size, generator)
    return DataLoader(TensorDataset(data.x, data.judge, data.y), sampler=sampler, batch_size=None)


def train_network(
    net: CalibrationNet, train: Encoded, val: Encoded | None, main_index: int, config: TrainConfig, seed: int
) -> dict:
    """Pretrain on all questions, then finetune on the main one, each with early stopping.

    Mini-batches are shuffled permutations of the training pairs. Without ``val``, each
    phase runs its full number of epochs. Runs on one CPU thread: the network is tiny and
    more threads only add contention. Returns a summary of both phases.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_phases(net, train, val, main_index, config, seed)
    finally:
        torch.set_num_threads(threads)


def _train_phases(
    net: CalibrationNet, train: Encoded, val: Encoded | None, main_index: int, config: TrainConfig, seed: int
) -> dict:
    module = CalibrationModule(net, main_index, config)
    summary = {}
    for phase, epochs in (("pretrain", config.pretrain_epochs), ("finetune", config.finetune_epochs)):
        if epochs <= 0:
            continue
        module.phase = phase
        mask = module.question_mask()
        train_rows = ((train.y >= 0) & mask).any(dim=1).nonzero().squeeze(1).numpy()
        if len(train_rows) == 0:
            raise ValueError(f"no training annotations for the {phase} phase")
        callbacks = []
        val_loader = None
        if val is not None and len(val):
            val_rows = ((val.y >= 0) & mask).any(dim=1).nonzero().squeeze(1).numpy()
            val_loader = _loader(val.take(val_rows), max(len(val_rows), 1), False, seed)
            best = RestoreBest()
            callbacks = [pl.callbacks.EarlyStopping("val/nll", patience=config.patience, mode="min"), best]
        trainer = pl.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            devices=1,
            logger=False,
            callbacks=callbacks,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            deterministic=True,
            limit_val_batches=1.0 if val_loader is not None else 0,
        )
        trainer.fit(
            module, _loader(train.take(train_rows), config.batch_size, True, seed + (phase == "finetune")), val_loader
        )
        summary[phase] = {
            "epochs": trainer.current_epoch,
            "best_epoch": callbacks[-1].best_epoch if callbacks else epochs - 1,
            "val_nll": callbacks[-1].best if callbacks else None,
        }
    net.eval()
    return summary


@torch.no_grad()
def net_proba(net: CalibrationNet, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
    """The network's probabilities (B, questions, max options): its softmax, blended with the
    ordinal shape by each question's ``ordinal_weight`` (:mod:`llmrubric.model.ordinal`)."""
    return blend(torch.softmax(net(x, judge), dim=-1), net.ordinal_weight, net.option_mask)


def predict_proba(net: CalibrationNet, data: Encoded, batch_size: int = 65536) -> torch.Tensor:
    """(pairs, questions, max options) predicted probabilities; padded options are 0."""
    net.eval()
    out = [
        net_proba(net, data.x[i : i + batch_size], data.judge[i : i + batch_size])
        for i in range(0, len(data), batch_size)
    ]
    return torch.cat(out) if out else torch.zeros(0, net.n_q, net.max_opt)
