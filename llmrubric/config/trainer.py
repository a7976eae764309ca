"""Optimisation settings (``trainer.*``, ``conf/trainer/``), each checked where it is defined."""

from __future__ import annotations

from dataclasses import dataclass, fields

from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_range

ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps")
VAL_GROUPS = ("auto", "text", "system")


@dataclass
class TrainConfig:
    """Optimisation settings (``trainer.*``, the one definition of their defaults); epochs are maxima,
    each phase stops early on held-out NLL, and temperature scaling is fitted on it.

    ``val_group``: what the held-out ``val_fraction`` is drawn from: ``text`` (training texts),
    ``system`` (training systems; by text where that fraction is under one system) or ``auto``
    (systems where the network is fitted for new systems and the fraction is at least
    ``val_min_systems`` of them, else texts): stopping and temperature on texts of the training
    systems are tuned to those systems and too sharp for new ones, and on one held-out system they
    follow that one system's shift.
    """

    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    delta_l2: float = 0.01
    pretrain_epochs: int = 100
    finetune_epochs: int = 100
    patience: int = 20
    val_fraction: float = 0.2
    val_group: str = "auto"
    val_min_systems: int = 2
    temperature_scaling: bool = True
    ordinal_blend: bool = True
    accelerator: str = "auto"

    def __post_init__(self):
        """Each setting checked (and converted) here, named ``trainer.<field>`` in the error."""
        if self.accelerator not in ACCELERATORS:
            raise InputError(f"{self.accelerator!r} is not one of {list(ACCELERATORS)}", setting="trainer.accelerator")
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
        if self.val_group not in VAL_GROUPS:
            raise InputError(f"{self.val_group!r} is not one of {list(VAL_GROUPS)}", setting="trainer.val_group")
        for name in ("temperature_scaling", "ordinal_blend"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{getattr(self, name)!r} is not true or false", setting=f"trainer.{name}")

    @classmethod
    def search_space(cls, base: dict) -> dict:
        """The optimisation part of the network's search (``search=optuna``)."""
        return {
            "batch_size": {"type": "int", "low": 32, "high": 256, "log": True},
            "lr": {"type": "float", "low": 1.0e-5, "high": 1.0e-2, "log": True},
            "weight_decay": {"type": "float", "low": 1.0e-6, "high": 1.0e-1, "log": True},
            "delta_l2": {"type": "float", "low": 1.0e-4, "high": 1.0, "log": True},
            "pretrain_epochs": {"type": "int", "low": 0, "high": 200, "step": 10},
            "finetune_epochs": {"type": "int", "low": 10, "high": 200, "step": 10},
        }

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
    "val_min_systems": (1, True, False, None),
}
