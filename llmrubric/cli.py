"""The ``llmrubric`` command: ``llmrubric <noun> <verb>``, each noun registered by its own module.

llmrubric data fetch | simulate | summary | texts
llmrubric models list | fetch | serve
llmrubric extract features | bank | summaries | weights
llmrubric score texts
llmrubric rubric plan
llmrubric leaderboard build | correlate
llmrubric label suggest
llmrubric judges add
llmrubric ir qrels | trec-eval | nuggets | grounded-qa
llmrubric import workbench | nuggetizer
llmrubric schema show
llmrubric train | evaluate [key=value ...]   (the Hydra apps behind train.py and evaluate.py)
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from llmrubric.apps.commands import CommandParser, add_hydra_app, add_noun, describe
from llmrubric.io.errors import USER_ERRORS, report

COMMAND_MODULES = (
    "llmrubric.apps.data",
    "llmrubric.apps.models",
    "llmrubric.apps.extract",
    "llmrubric.apps.score",
    "llmrubric.apps.labels",
    "llmrubric.apps.ir",
    "llmrubric.apps.imports",
    "llmrubric.apps.rubric",
)
HYDRA_APPS = (  # llmrubric <name> [overrides…]: the Hydra apps behind train.py and evaluate.py, imported when run
    ("train", "train calibrators on an experiment's data and save checkpoints (Hydra: conf/, key=value overrides)"),
    (
        "evaluate",
        "evaluate an experiment's checkpoints and baselines on held-out texts (Hydra: conf/, key=value overrides)",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The root parser; a command module that fails to import is an error, never a missing noun."""
    parser = CommandParser(prog="llmrubric", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="noun", required=True, help="the command (its --help: its verbs)")
    for module in COMMAND_MODULES:
        try:
            commands = importlib.import_module(module)
        except ImportError as e:
            raise RuntimeError(f"cannot load the commands of {module}: {e}") from e
        commands.register(sub)
    for name, help in HYDRA_APPS:
        add_hydra_app(sub, name, help)
    schema = add_noun(sub, "schema", "the table contracts that the validators check")
    show = schema.add_parser("show", help="print the columns, types and what NA means of every table")
    show.set_defaults(run=_show_schema)
    describe(parser)
    return parser


def _show_schema(args) -> int:
    from llmrubric.io.contracts import schema_text

    print(schema_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (*USER_ERRORS, KeyboardInterrupt) as e:
        return report(e)
    except BrokenPipeError:  # the reader of stdout went away (``llmrubric schema show | head``)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
