"""The ``llmrubric <noun> <verb>`` grammar: every command parses, old flat names are gone, a broken
command module is an error."""

from __future__ import annotations

import re

import pytest

from llmrubric import cli
from llmrubric.cli import build_parser, main

GRAMMAR = {
    "data": ["fetch", "simulate", "summary", "texts"],
    "models": ["list", "fetch", "serve"],
    "extract": ["features", "bank", "summaries", "weights"],
    "score": ["texts"],
    "leaderboard": ["build", "correlate"],
    "label": ["suggest", "plan"],
    "judges": ["add"],
    "ir": ["qrels", "trec-eval", "nuggets", "grounded-qa"],
    "import": ["workbench", "nuggetizer", "mlflow"],
    "export": ["mlflow"],
    "rubric": ["plan"],
    "schema": ["show"],
}
HYDRA_APPS = ["train", "evaluate"]  # verbs of their own: everything after them goes to Hydra
OLD = [
    ["extract-texts", "dialogues.json", "--out", "texts.csv"],
    ["extract-bank", "queries.csv", "--out", "bank.jsonl"],
    ["extract-summaries", "items.csv", "--family", "self_rating", "--out", "s.csv"],
    ["extract", "texts.csv", "--out", "features.csv"],
    ["score", "model.safetensors", "features.csv", "--out", "scores.csv"],
    ["leaderboard", "predictions.csv", "--out-dir", "board"],
    ["rank-correlation", "a.csv", "b.csv"],
    ["qrels", "--grades", "grades.csv", "--out", "q.txt"],
    ["trec-eval", "--qrels", "q.txt", "--runs", "run.txt", "--out-dir", "eval"],
    ["nuggets", "--answers", "a.csv", "--bank", "b.jsonl", "--assignments", "l.csv", "--out-dir", "n"],
    ["grounded-qa", "questions.jsonl", "predictions.json", "--out", "out.json"],
]


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0, argv
    return capsys.readouterr().out


def _choices(usage: str) -> list[str]:
    """The sub-commands that a ``usage:`` line lists as ``{a,b,…}``."""
    return re.search(r"\{([^}]+)\}", usage).group(1).split(",")


def test_nouns_and_verbs_are_exactly_the_grammar(capsys):
    nouns = [noun for noun in GRAMMAR if noun != "schema"]
    assert _choices(_help([], capsys)) == [*nouns, *HYDRA_APPS, "schema"]
    for noun, verbs in GRAMMAR.items():
        assert _choices(_help([noun], capsys)) == verbs, noun


@pytest.mark.parametrize("noun,verb", [(n, v) for n, verbs in GRAMMAR.items() for v in verbs])
def test_every_verb_has_help(noun, verb, capsys):
    out = _help([noun, verb], capsys)
    assert out.startswith(f"usage: llmrubric {noun} {verb} ")


@pytest.mark.parametrize("argv", OLD, ids=lambda argv: argv[0])
def test_an_old_flat_name_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_noun_without_a_verb_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["schema"])
    assert exit_.value.code == 2 and "required: verb" in capsys.readouterr().err


def test_a_command_module_that_fails_to_import_is_an_error(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "llmrubric.no_such_commands"))
    with pytest.raises(RuntimeError, match="llmrubric.no_such_commands"):
        build_parser()
