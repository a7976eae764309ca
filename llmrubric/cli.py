"""The ``llmrubric`` command: ``llmrubric <noun> <verb>``, each noun registered by its own module.

llmrubric data fetch | simulate | summary | texts
llmrubric models fetch
llmrubric extract features | bank | summaries
llmrubric score texts
llmrubric leaderboard build | correlate
llmrubric label suggest
llmrubric judges add
llmrubric ir qrels | trec-eval | nuggets | grounded-qa
llmrubric schema show
llmrubric train | evaluate [key=value ...]   (the Hydra apps behind train.py and evaluate.py)
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from llmrubric.io.errors import USER_ERRORS, report

COMMAND_MODULES = (
    "llmrubric.data.cli",
    "llmrubric.extract.models_cli",
    "llmrubric.extract.cli",
    "llmrubric.scoring.cli",
    "llmrubric.scoring.labels_cli",
    "llmrubric.ir.cli",
    "llmrubric.training.cli",
    "llmrubric.evaluation.cli",
)


def add_noun(subparsers, name: str, help: str):
    """The noun ``name`` under ``subparsers``; returns the subparsers its verbs are added to."""
    noun = subparsers.add_parser(name, help=help, description=help)
    return noun.add_subparsers(dest="verb", required=True)


def add_hydra_app(subparsers, name: str, help: str, app_module: str) -> None:
    """``llmrubric <name> [overrides…]``: everything after ``name`` goes to the Hydra app ``app_module.main``
    (imported when run): overrides (``key=value``) and its flags (``--help``, ``--cfg job``, ``--multirun``)."""
    p = subparsers.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    p.add_argument("argv", nargs="*", help="Hydra overrides and flags")
    p.set_defaults(run=lambda args: importlib.import_module(app_module).main(args.argv))


def build_parser() -> argparse.ArgumentParser:
    """The root parser; a command module that fails to import is an error, never a missing noun."""
    parser = argparse.ArgumentParser(
        prog="llmrubric", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="noun", required=True)
    for module in COMMAND_MODULES:
        try:
            commands = importlib.import_module(module)
        except ImportError as e:
            raise RuntimeError(f"cannot load the commands of {module}: {e}") from e
        commands.register(sub)
    schema = add_noun(sub, "schema", "the table contracts that the validators check")
    show = schema.add_parser("show", help="print the columns, types and what NA means of every table")
    show.set_defaults(run=_show_schema)
    return parser


def _show_schema(args) -> int:
    from llmrubric.io.schemas import schema_text

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
