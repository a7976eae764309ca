"""``llmrubric train [overrides…]``: the Hydra app :mod:`llmrubric.training.app` (imported when run)."""

from __future__ import annotations

from llmrubric.cli import add_hydra_app

HELP = "train calibrators on an experiment's data and save checkpoints (Hydra: conf/, key=value overrides)"


def register(subparsers) -> None:
    add_hydra_app(subparsers, "train", HELP, "llmrubric.training.app")
