"""docs/start-here.md shows the demo's own tables and says what each word is: its ``csv`` blocks are lines of the
file named just before each, its ``text`` block lines of ``llmrubric models list``; the README links it on its
first screen."""

from __future__ import annotations

import re
from contextlib import redirect_stdout
from io import StringIO

import pytest
from support.paths import ROOT

from llmrubric.cli import main

PAGE = ROOT / "docs" / "start-here.md"
README_FIRST_SCREEN = 40  # lines


def blocks(language: str) -> list[tuple[str, list[str]]]:
    """(the paragraph before, the lines) of each fenced block of ``language``."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.findall(rf"((?:[^\n]+\n)+)\n```{language}\n(.*?)\n```", text, flags=re.S)
    return [(before, body.splitlines()) for before, body in found]


def test_every_csv_block_is_lines_of_the_file_it_names():
    csv = blocks("csv")
    assert len(csv) == 3
    for before, lines in csv:
        name = re.findall(r"`(data/simulated/\w+\.csv)`", before)[-1]
        rows = (ROOT / name).read_text(encoding="utf-8").splitlines()
        assert lines[0] == rows[0], name  # the header
        assert set(lines[1:]) <= set(rows[1:]), name


def test_the_models_list_block_is_lines_of_its_output():
    out = StringIO()
    with redirect_stdout(out):
        assert main(["models", "list"]) == 0
    printed = {" ".join(line.split()) for line in out.getvalue().splitlines()}
    [(_, lines)] = blocks("text")
    assert len(lines) > 2 and all(" ".join(line.split()) in printed for line in lines)


def test_the_readme_links_it_on_its_first_screen():
    first = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:README_FIRST_SCREEN])
    assert "(docs/start-here.md)" in first


@pytest.mark.parametrize(
    "word",
    [
        "block",
        "judge",
        "source",
        "system",
        "question",
        "interval",
        "marginalises",
        "conformalised",
        "PPI++",
        "max-t",
        "trusted judges",
        "`bb_stack`",
        "`auto`",
        "`report`",
    ],
)
def test_it_says_what_each_word_is(word):
    assert f"**{word}**" in PAGE.read_text(encoding="utf-8")
