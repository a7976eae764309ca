"""``llmrubric train [overrides…]``: the Hydra app :mod:`llmrubric.training.app` (imported when run)."""

from __future__ import annotations

HELP = "train calibrators on an experiment's data and save checkpoints (Hydra: conf/, key=value overrides)"


def register(subparsers) -> None:
    """Everything after ``train`` goes to Hydra: overrides (``key=value``) and its flags (``--help``, ``--cfg job``, ``--multirun``)."""
    p = subparsers.add_parser("train", help=HELP, add_help=False, prefix_chars="\0")
    p.add_argument("argv", nargs="*", help="Hydra overrides and flags")
    p.set_defaults(run=run)


def run(args) -> None:
    from llmrubric.training.app import main

    main(args.argv)
