"""What the command modules of :mod:`llmrubric.apps` share to register their verbs under ``llmrubric``."""

from __future__ import annotations

import importlib


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


def flags(args, *keys: str) -> dict:
    """The values of the flags ``keys`` (None where not given), for :func:`llmrubric.config.command_settings`."""
    return {key: getattr(args, key, None) for key in keys}


def section_settings(args, group: str, section: str, *keys: str) -> dict:
    """The ``section`` of a command's settings (config group ``group``: its ``--config`` file or the shipped
    default) with the flags ``keys`` over it."""
    from llmrubric.config import command_settings

    given = {f"{section}.{key}": value for key, value in flags(args, *keys).items()}
    return command_settings(group, args.config, given)[section]
