"""Every ``llmrubric`` command explains itself: each flag and argument has a help line, each help page opens with a
description of its own command (plain text, not a module docstring in RST), and a mistyped flag or verb is one line
with that command's usage and the name meant."""

from __future__ import annotations

import pytest

from llmrubric.cli import build_parser, main


def commands(parser, path=("llmrubric",)):
    """(command words, parser) of the root and of every noun and verb under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


COMMANDS = list(commands(build_parser()))


def test_every_command_is_walked():
    names = {" ".join(words) for words, _ in COMMANDS}
    assert {"llmrubric score texts", "llmrubric data simulate", "llmrubric train", "llmrubric schema show"} <= names
    assert len(COMMANDS) > 30


@pytest.mark.parametrize("words, parser", COMMANDS, ids=[" ".join(w[1:]) or "root" for w, _ in COMMANDS])
def test_every_argument_of_every_command_has_a_help_line(words, parser):
    missing = [a.option_strings or [a.dest] for a in parser._actions if not (a.help or "").strip()]
    assert not missing, f"{' '.join(words)}: no help for {missing}"


@pytest.mark.parametrize("words, parser", COMMANDS[1:], ids=[" ".join(w[1:]) for w, _ in COMMANDS[1:]])
def test_every_help_page_describes_its_own_command_in_plain_text(words, parser):
    description = (parser.description or "").strip()
    assert description, f"{' '.join(words)} has no description"
    assert "``" not in description and ":mod:" not in description and ":func:" not in description, description
    others = {f"llmrubric {w[1]}" for w, _ in COMMANDS if len(w) == 2 and w[1] != words[1]}
    assert not [o for o in others if f"{o} " in description + " "], f"{' '.join(words)} describes {others}"


@pytest.mark.parametrize(
    "argv, usage, meant",
    [
        (["score", "texts", "--quantlie", "0.8"], "usage: llmrubric score texts ", "did you mean --quantile?"),
        (
            ["score", "texts", "m.safetensors", "f.csv", "--out", "s.csv", "--quantlie", "0.8"],
            "score texts ",
            "--quantile?",
        ),
        (["data", "simulate", "dest", "--texs", "30"], "usage: llmrubric data simulate ", "did you mean --texts?"),
        (["leaderbord", "build"], "usage: llmrubric [-h]", "did you mean leaderboard?"),
        (["score", "txets"], "usage: llmrubric score [-h]", "did you mean texts?"),
    ],
)
def test_a_mistyped_flag_or_verb_is_one_line_with_the_commands_usage_and_the_name_meant(argv, usage, meant, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and usage in err and meant in err, err


def test_the_root_help_lists_every_noun_with_every_verb():
    """Made from the parsers: a command registered anywhere is listed (``import mlflow``, ``label plan`` were not)."""
    lines = build_parser().format_help().splitlines()
    for words, _ in COMMANDS:
        if len(words) == 3:
            line = next((x for x in lines if x.startswith(f"llmrubric {words[1]} ")), "")
            assert words[2] in line.split(" | ") + line.split(" ")[2:3], f"{' '.join(words)} not in {line!r}"
    assert any(x.startswith("llmrubric train | evaluate") for x in lines)
