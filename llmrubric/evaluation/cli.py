"""``llmrubric evaluate [overrides…]``: the Hydra app :mod:`llmrubric.evaluation.app` (imported when run)."""

from __future__ import annotations

HELP = "evaluate an experiment's checkpoints and baselines on held-out texts (Hydra: conf/, key=value overrides)"


def register(subparsers) -> None:
    """Everything after ``evaluate`` goes to Hydra: overrides (``key=value``) and its flags (``--help``, ``--cfg job``, ``--multirun``)."""
    p = subparsers.add_parser("evaluate", help=HELP, add_help=False, prefix_chars="\0")
    p.add_argument("argv", nargs="*", help="Hydra overrides and flags")
    p.set_defaults(run=run)


def run(args) -> None:
    from llmrubric.evaluation.app import main

    main(args.argv)
