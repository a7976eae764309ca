"""docs/errors.md says what the code prints: every example message of it (a code span that starts with
``error:`` or ``setting``) is produced here by the command a user would run, and compared with the doc."""

from __future__ import annotations

import re

import pytest
from support.paths import ROOT
from support.scripts import run_script

from llmrubric.cli import main as cli_main

DOC = ROOT / "docs" / "errors.md"
TEMPLATES = ("error: FILE, row R, column C: what is wrong", "error: setting NAME: what is wrong")
SIM = ROOT / "data" / "simulated"
DATA = [f"data.train.{t}={SIM / f'{t}.csv'}" for t in ("annotations", "features", "texts")]
BAD_YAML = "name: mine\nquestions:\n  - id: A\n    options: [1, 2, 3]\n  - {id: B, options: [1, 2]\n"
TYPO_YAML = "name: mine\nquestions:\n  - id: A\n    mian: true\n    options: [1, 2, 3]\n"

# each example of the doc: the entry point, its arguments and the files it reads (written in the working folder)
EXAMPLES = {
    "setting trainer.lr: 'abc' is not a number": ("train.py", ["trainer.lr=abc"], {}),
    "setting --alpha: 2.0 is outside (0, 1)": (
        "cli",
        ["leaderboard", "build", "p.csv", "--out-dir", "o", "--alpha", "2.0"],
        {},
    ),
    "error: unrecognized arguments: --quantlie 0.8; did you mean --quantile?; usage: llmrubric score texts [...]": (
        "cli",
        ["score", "texts", "m.safetensors", "f.csv", "--out", "s.csv", "--quantlie", "0.8"],
        {},
    ),
    "setting model: 'forest' is not an option of model (options: auto, combined, network, ordinal, paper)": (
        "train.py",
        ["model=forest"],
        {},
    ),
    "setting trainer.lrr: Key 'lrr' not in 'TrainConfig'; did you mean 'lr'?": ("train.py", ["trainer.lrr=0.1"], {}),
    "error: mine.yaml, setting quantlie: Key 'quantlie' not in 'ScoringConfig'; did you mean 'quantile'?": (
        "cli",
        ["leaderboard", "build", "p.csv", "--out-dir", "o", "--config", "mine.yaml"],
        {"mine.yaml": "quantlie: 0.8\n"},
    ),
    "error: mine.yaml, line 6, column 1: not valid YAML: expected ',' or '}', but got '<stream end>' "
    "(while parsing a flow mapping at line 5, column 5)": ("train.py", ["rubric=mine.yaml"], {"mine.yaml": BAD_YAML}),
    "error: mine.yaml: question 1 (A): unknown key 'mian'; did you mean 'main'? (the keys are [...])": (
        "evaluate.py",
        ["rubric=mine.yaml"],
        {"mine.yaml": TYPO_YAML},
    ),
    "setting system_groups: 1 is outside [2, inf]": ("train.py", ["protocol=system_groups", "system_groups=1"], {}),
    "setting system_groups: 9 groups of 4 systems (use 2 to 4)": (
        "train.py",
        ["experiment=demo", "logger=none", "protocol=system_groups", "system_groups=9", "run_dir=run", *DATA],
        {},
    ),
    "setting grouping_seeds: 0 is outside [1, inf]": ("train.py", ["protocol=system_groups", "grouping_seeds=0"], {}),
    "setting model.auto.candidates: unknown candidate(s) ['forest']; known: [...]": (
        "train.py",
        ["model.auto.candidates=[forest]"],
        {},
    ),
}


def doc_examples() -> list[str]:
    """The example messages of docs/errors.md: its code spans that start with ``error:`` or ``setting``."""
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", DOC.read_text(), flags=re.S)]
    return [s for s in spans if s.startswith(("error: ", "setting ")) and s not in TEMPLATES]


def test_every_example_of_the_doc_is_produced_here():
    assert sorted(doc_examples()) == sorted(EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_the_example_is_the_message_printed(example, tmp_path, capsys, monkeypatch):
    entry, args, files = EXAMPLES[example]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    try:
        code = cli_main(args) if entry == "cli" else run_script(entry, args)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, err
    expected = example if example.startswith("error: ") else f"error: {example}"
    pattern = re.escape(expected).replace(re.escape("[...]"), ".+")  # [...]: what the doc leaves out
    assert re.fullmatch(pattern, errors[0]), f"docs/errors.md: {expected}\nprinted:         {errors[0]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files), "a failed run wrote something"
