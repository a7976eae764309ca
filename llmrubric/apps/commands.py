"""What the command modules of :mod:`llmrubric.apps` share to register their verbs under ``llmrubric``."""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from llmrubric.io.guards import closest


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose error is one line: what is wrong, the names meant where close ones exist
    (:mod:`difflib`) and the usage of the command itself (not of the root ``llmrubric``)."""

    given: list[str] = []  # the arguments being parsed, for the unknown flags behind a missing argument

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but arguments no command knows are reported in the usage of the command given them."""
        CommandParser.given = list(sys.argv[1:] if args is None else args)
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            leaf = command_parser(self, namespace)
            leaf.error(f"unrecognized arguments: {' '.join(extras)}{flags_meant(leaf, extras)}")
        return namespace

    def error(self, message: str):
        unknown = unknown_flags(self, CommandParser.given)
        if message.startswith("the following arguments are required") and unknown:
            message = f"unrecognized arguments: {' '.join(unknown)}{flags_meant(self, unknown)} ({message})"
        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)", message)
        if choice:
            names = re.findall(r"'([^']*)'", choice.group(2))
            near = closest(choice.group(1), names, 3)
            message += f"; did you mean {' or '.join(near)}?" if near else ""
        self.exit(2, f"error: {message}; {' '.join(self.format_usage().split())}\n")


def command_parser(parser: argparse.ArgumentParser, namespace) -> argparse.ArgumentParser:
    """The parser of the command that ``namespace`` was parsed for (``llmrubric score texts``: that verb's)."""
    for action in parser._actions:
        if isinstance(action.choices, dict):  # a sub-command action: its choices are the parsers of its verbs
            chosen = getattr(namespace, action.dest, None)
            if chosen in action.choices:
                return command_parser(action.choices[chosen], namespace)
    return parser


def unknown_flags(parser: argparse.ArgumentParser, given: list[str]) -> list[str]:
    """The flags of ``given`` that ``parser`` does not know (negative numbers are values, not flags)."""
    options = {o for action in parser._actions for o in action.option_strings}
    return [g for g in given if g.startswith("-") and not re.match(r"-\.?\d", g) and g.split("=")[0] not in options]


def flags_meant(parser: argparse.ArgumentParser, given: list[str]) -> str:
    """``"; did you mean --quantile?"`` for the unknown flags of ``given`` close to a flag of ``parser``."""
    options = [o for action in parser._actions for o in action.option_strings]
    near = [m for g in given if g.startswith("-") for m in closest(g.split("=")[0], options)]
    return f"; did you mean {' or '.join(dict.fromkeys(near))}?" if near else ""


def add_noun(subparsers, name: str, help: str):
    """The noun ``name`` under ``subparsers``; returns the subparsers its verbs are added to."""
    noun = subparsers.add_parser(name, help=help, description=help)
    return noun.add_subparsers(dest="verb", required=True, help="the verb (its --help: what it does)")


def describe(parser: argparse.ArgumentParser) -> None:
    """Give each verb under ``parser`` without a description its one-line help as the opening of its help page."""
    for action in parser._actions:
        if isinstance(action.choices, dict):
            helps = {choice.dest: choice.help for choice in action._get_subactions()}
            for name, sub in action.choices.items():
                sub.description = sub.description or helps.get(name)
                describe(sub)


def command_listing(parser: argparse.ArgumentParser) -> str:
    """One line per noun under ``parser`` with its verbs (``llmrubric score texts``), the nouns without verbs (the
    Hydra apps) on one last line: the listing of ``llmrubric --help``, made from the parsers themselves."""
    lines, apps = [], []
    for action in parser._actions:
        if isinstance(action.choices, dict):
            for noun, sub in action.choices.items():
                verbs = [v for a in sub._actions if isinstance(a.choices, dict) for v in a.choices]
                if verbs:
                    lines.append(f"{parser.prog} {noun} {' | '.join(verbs)}")
                else:
                    apps.append(noun)
    if apps:
        lines.append(f"{parser.prog} {' | '.join(apps)} [key=value ...]   (Hydra apps: train.py, evaluate.py)")
    return "\n".join(lines)


def add_hydra_app(subparsers, name: str, help: str) -> None:
    """``llmrubric <name> [overrides…]``: everything after ``name`` goes to the Hydra app (:func:`launch`):
    overrides (``key=value``) and its flags (``--help``, ``--cfg job``, ``--multirun``)."""
    p = subparsers.add_parser(name, help=help, description=help, add_help=False, prefix_chars="\0")
    p.add_argument("argv", nargs="*", help="Hydra overrides (key=value) and flags (--help, --cfg job, --multirun)")
    p.set_defaults(run=lambda args: launch(name, args.argv))


def launch(name: str, argv: list[str] | None = None) -> None:
    """Run the Hydra app ``llmrubric.apps.<name>`` (``train``, ``evaluate``) on ``argv`` (default: the command
    line); ``--help`` is printed without importing the app (and the seconds of torch and Lightning)."""
    from llmrubric.config.hydra_app import HELP_FLAGS, app_help

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in HELP_FLAGS for a in argv):
        print(app_help(name))
        return
    importlib.import_module(f"llmrubric.apps.{name}").main(argv)


def flags(args, *keys: str) -> dict:
    """The values of the flags ``keys`` (None where not given), for :func:`llmrubric.config.command_settings`."""
    return {key: getattr(args, key, None) for key in keys}


def section_settings(args, group: str, section: str, *keys: str) -> dict:
    """The ``section`` of a command's settings (config group ``group``: its ``--config`` file or the shipped
    default) with the flags ``keys`` over it."""
    from llmrubric.config import command_settings

    given = {f"{section}.{key}": value for key, value in flags(args, *keys).items()}
    return command_settings(group, args.config, given)[section]
