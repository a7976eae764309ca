"""What the docs claim about the code, checked against the code: ``schema show`` covers every table the README and
docs/data.md list, with the columns ``score texts`` writes; a categorical question's ``mean`` is NA, as the docs say,
and such a predictions table reads; docs/commands.md has a row for every command of the parser and every script at
the repository's root, and names the whole public API; docs/data.md fetches the release where the experiments read
it."""

from __future__ import annotations

import argparse
import ast
import re
from contextlib import redirect_stdout
from io import StringIO

import numpy as np
import pandas as pd
import pytest
import yaml
from support.paths import ROOT

import llmrubric
from llmrubric.cli import build_parser, main
from llmrubric.io.contracts import SPECS
from llmrubric.io.predictions import predictions_frame
from llmrubric.io.rubric import Rubric
from llmrubric.scoring.leaderboard import read_predictions
from llmrubric.scoring.scores import SCORE_COLUMNS

README, DATA, COMMANDS = ROOT / "README.md", ROOT / "docs" / "data.md", ROOT / "docs" / "commands.md"


def table_rows(path, heading: str) -> dict[str, str]:
    """First cell → second cell of the first Markdown table under ``heading``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rows, start = {}, lines.index(heading)
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("- "):
            rows[cells[0]] = cells[1]
    return rows


def schema_show() -> str:
    out = StringIO()
    with redirect_stdout(out):
        assert main(["schema", "show"]) == 0
    return out.getvalue()


@pytest.mark.parametrize(("path", "heading"), [(README, "## Table contracts"), (DATA, "## The tables")])
def test_schema_show_covers_every_table_the_docs_list(path, heading):
    listed = set(table_rows(path, heading)) - {"table"}
    shown = set(re.findall(r"^## (\w+)$", schema_show(), flags=re.M))
    assert listed and listed <= shown, listed - shown


def test_the_scores_contract_is_the_columns_score_texts_writes_and_data_md_lists_them():
    spec = SPECS["scores"]
    assert [name for name, _ in spec.columns] == list(spec.required) == SCORE_COLUMNS
    listed = table_rows(DATA, "## The tables")["scores"].split("`")[1]
    assert [c.strip() for c in listed.split(",")] == SCORE_COLUMNS
    assert "| lo | yes |" in schema_show() and "| hi | yes |" in schema_show()


def test_a_categorical_questions_mean_is_na_as_the_docs_say_and_its_predictions_read(tmp_path):
    rubric = Rubric.from_dict(
        {
            "name": "t",
            "questions": [{"id": "Q", "main": True, "options": [1, 2, 3]}, {"id": "C", "options": ["a", "b"]}],
        }
    )
    pairs = pd.DataFrame({"text_id": ["x", "y"], "judge_id": "j", "system_id": ["S", "T"]})
    probs = np.array([[[0.2, 0.3, 0.5], [0.4, 0.6, 0]], [[0.1, 0.1, 0.8], [0.5, 0.5, 0]]])
    frame = predictions_frame(pairs, list(rubric.questions), probs)
    categorical = frame[frame.question_id == "C"]
    assert categorical["mean"].isna().all() and categorical["var"].isna().all()
    assert frame[frame.question_id == "Q"]["mean"].notna().all()
    frame.to_csv(tmp_path / "predictions.csv", index=False)
    read = read_predictions(tmp_path / "predictions.csv")
    assert read[read.question_id == "C"]["mean"].isna().all() and len(read) == 4
    assert "| mean | yes | float, the expected answer on an ordered question; NA on a categorical question" in (
        schema_show()
    )
    for path, heading in ((DATA, "## The tables"), (README, "## Table contracts")):
        assert "`mean`, `var` are NA on a categorical question" in table_rows(path, heading)["predictions"], path


def parser_commands() -> set[str]:
    """``noun verb`` of every command of ``llmrubric`` (``noun`` for the Hydra apps, which have no verbs)."""
    nouns = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = set()
    for noun, parser in nouns.items():
        verbs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        found |= {f"{noun} {verb}" for verb in verbs[0].choices} if verbs else {noun}
    return found


def root_scripts() -> set[str]:
    """The repository root's Python files that run as a program (``if __name__ == "__main__"``)."""
    return {
        path.name
        for path in ROOT.glob("*.py")
        if any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
            for node in ast.parse(path.read_text()).body
        )
    }


def documented() -> tuple[set[str], set[str]]:
    """The commands and the scripts that docs/commands.md's table has rows for."""
    commands, scripts = set(), set()
    for cell in table_rows(COMMANDS, "## Commands"):
        names = re.findall(r"`([^`]+)`", cell)
        for name in names:
            if name.endswith(".py"):
                scripts.add(name)
            elif name.startswith("llmrubric "):
                commands.add(name.removeprefix("llmrubric "))
                noun = name.split()[1]
            else:  # `llmrubric import workbench` / `nuggetizer`
                commands.add(f"{noun} {name}")
    return commands, scripts


def test_commands_md_has_a_row_for_every_command_and_script():
    commands, scripts = documented()
    assert commands == parser_commands()
    assert scripts == root_scripts() == {"train.py", "evaluate.py"}


def test_commands_md_names_the_whole_public_api():
    text = COMMANDS.read_text(encoding="utf-8")
    paragraph = text[text.index("`llmrubric.__all__` lists the public API") :].split("\n\n")[0]
    assert set(re.findall(r"`(\w+)`", paragraph)) == set(llmrubric.__all__)


def test_data_md_fetches_the_release_where_the_experiments_read_it():
    """The fetch's DEST is the experiments' default folder, or the same block sets ``LLM_RUBRIC_DATA`` to it."""
    root = yaml.safe_load((ROOT / "conf" / "data" / "llm_rubric_real.yaml").read_text())["root"]
    default = re.fullmatch(r"\$\{oc\.env:LLM_RUBRIC_DATA,(.+)\}", root).group(1)
    for block in re.findall(r"```bash\n(.*?)```", DATA.read_text(encoding="utf-8"), flags=re.S):
        for dest in re.findall(r"llmrubric data fetch llm-rubric (\S+)", block):
            assert dest == default or f"LLM_RUBRIC_DATA={dest}" in block, dest
