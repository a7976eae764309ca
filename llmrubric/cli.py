"""The ``llmrubric`` command: each sub-command group registers itself from its own module."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from llmrubric.io.errors import USER_ERRORS, report

GROUPS = {
    "data": "llmrubric.data.cli",
    "extract": "llmrubric.extract.cli",
    "models": "llmrubric.extract.models_cli",
    "score": "llmrubric.scoring.cli",
    "ir": "llmrubric.ir.cli",
    "train": "llmrubric.training.cli",
    "evaluate": "llmrubric.evaluation.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmrubric", description=__doc__)
    sub = parser.add_subparsers(dest="group", required=True)
    for _name, module in GROUPS.items():
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    schema = sub.add_parser(
        "schema", help="print the table contracts (columns, types, what NA means) that the validators check"
    )
    schema.set_defaults(run=_print_schema)
    return parser


def _print_schema(args) -> int:
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
    except BrokenPipeError:  # the reader of stdout went away (``llmrubric schema | head``)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
