"""``llmrubric evaluate [overrides…]``: the Hydra app :mod:`llmrubric.evaluation.app` (imported when run)."""

from __future__ import annotations

from llmrubric.cli import add_hydra_app

HELP = "evaluate an experiment's checkpoints and baselines on held-out texts (Hydra: conf/, key=value overrides)"


def register(subparsers) -> None:
    add_hydra_app(subparsers, "evaluate", HELP, "llmrubric.evaluation.app")
