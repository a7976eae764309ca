"""The README's quickstart runs as written: its commands are read from README.md and run, in order, in a
temporary folder laid out like a checkout (``conf/``, ``train.py``, ``evaluate.py``) on the shipped simulated
data, each in this process as its entry point runs it (``llmrubric.cli.main``; ``train.py`` and ``evaluate.py``
with Hydra's parsing of ``sys.argv``). The only changes: the placeholder ``PATH`` of ``--model`` is a tiny local
model (the simulated texts get a dialogue each, since the shipped table has none), and ``train.py`` /
``evaluate.py`` get four more overrides that make them quick (``trainer=fast``, the main question's intervals only,
one network per ensemble, three inner folds of ``auto``), as does the Python snippet's ``AutoCalibrator``: the same
commands and code paths."""

from __future__ import annotations

import json
import shlex
from contextlib import chdir
from pathlib import Path

import pandas as pd
import pytest
from support.paths import ROOT
from support.scripts import run_script
from support.settings import FAST, FAST_OVERRIDES, MAIN_INTERVALS
from support.tiny_models import save_model

import llmrubric
from llmrubric.cli import main

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
HEADING = "## Quickstart with your own data"
SCRIPTS = ("train.py", "evaluate.py")
CHECKOUT = (*SCRIPTS, "conf")  # what the commands name in the repository
QUICK = [*FAST_OVERRIDES, "++model.ensemble=1", "model.auto.folds=3"]  # added to train.py and evaluate.py
QUICK_AUTO = {"ensemble": 1, "auto": {**MAIN_INTERVALS, "folds": 3}}  # the same for the snippet's AutoCalibrator
SIMULATED = ROOT / "data" / "simulated"
SNIPPET_TEXTS_PER_SYSTEM = 20  # the README's first snippet runs on these many texts of each simulated system
TEXTS_PER_SYSTEM, NEW_PER_SYSTEM = 6, 2  # annotated texts to train on, new texts to score (4 systems each)


def first_snippet() -> str:
    """The README's first ``python`` block, as written."""
    text = README.read_text(encoding="utf-8")
    return text.split("```python\n", 1)[1].split("\n```", 1)[0]


class QuickAutoCalibrator(llmrubric.AutoCalibrator):
    """``AutoCalibrator`` with the quick settings of :data:`QUICK` where the caller gives none."""

    def __init__(self, rubric, model=None, trainer=None, **kwargs):
        super().__init__(rubric, QUICK_AUTO if model is None else model, FAST if trainer is None else trainer, **kwargs)


def test_the_first_snippet_runs_as_written_on_the_embedded_data(tmp_path, monkeypatch):
    """Its code unchanged, run where a newcomer runs it (a checkout's root: ``conf/``, ``data/simulated/``), on the
    first ``SNIPPET_TEXTS_PER_SYSTEM`` texts of each system of the embedded data (all 300 take minutes), with
    ``llmrubric.AutoCalibrator`` quick as the commands' models are (:data:`QUICK`)."""
    monkeypatch.setattr(llmrubric, "AutoCalibrator", QuickAutoCalibrator)
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    data = tmp_path / "data" / "simulated"
    data.mkdir(parents=True)
    texts = pd.read_csv(SIMULATED / "texts.csv").groupby("system_id").head(SNIPPET_TEXTS_PER_SYSTEM)
    texts.to_csv(data / "texts.csv", index=False)
    for name in ("annotations", "features"):
        table = pd.read_csv(SIMULATED / f"{name}.csv")
        table[table.text_id.isin(texts.text_id)].to_csv(data / f"{name}.csv", index=False)
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(compile(first_snippet(), str(README), "exec"), names)
    tables, predictions = names["tables"], names["predictions"]
    assert set(tables.texts.text_id) == set(texts.text_id)
    pairs = tables.annotations[["text_id", "judge_id"]].drop_duplicates()
    assert set(predictions.question_id) == set(names["rubric"].ids)
    assert len(predictions[predictions.question_id == "Q0"]) == len(pairs)
    assert isinstance(names["model"], QuickAutoCalibrator)
    assert sum(names["model"].weights_.values()) == pytest.approx(1.0)


def quickstart() -> list[list[str]]:
    """The argv of each command in the first ``bash`` block under the quickstart heading."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i in range(lines.index(HEADING), len(lines)) if lines[i].strip() == "```bash") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "```")
    commands, pending = [], ""
    for line in lines[start:end]:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        argv = shlex.split(pending + line, comments=True)
        pending = ""
        if argv:
            commands.append(argv)
    return commands


def run(argv: list[str], model: Path) -> int:
    """``argv`` run in this process, with the tiny model for ``--model PATH``; its exit code."""
    args = [str(model) if a == "PATH" and before == "--model" else a for before, a in zip(argv, argv[1:])]
    if argv[0] == ".venv/bin/llmrubric":
        return main(args)
    assert argv[0] == ".venv/bin/python" and args[0] in SCRIPTS, argv
    return run_script(args[0], [*args[1:], *QUICK])


def write_texts(ids: pd.Series, path: Path) -> None:
    """The simulated texts ``ids`` with a short dialogue each."""
    texts = pd.read_csv(SIMULATED / "texts.csv").set_index("text_id").loc[ids].reset_index()
    texts["text"] = [f"user: how do I reset my password ({t})? assistant: open the settings page." for t in ids]
    texts.to_csv(path, index=False)


@pytest.fixture
def checkout(tmp_path, tok, llama):
    """A folder with the repository's conf/ and apps, the user's files and a tiny model; the steps' extra
    input (``new_texts.csv`` and its features) made as step 1 says."""
    for name in CHECKOUT:
        (tmp_path / name).symlink_to(ROOT / name)
    texts = pd.read_csv(SIMULATED / "texts.csv").groupby("system_id").head(TEXTS_PER_SYSTEM + NEW_PER_SYSTEM)
    new = texts.groupby("system_id").tail(NEW_PER_SYSTEM).text_id
    train = texts.text_id[~texts.text_id.isin(new)]
    write_texts(train, tmp_path / "texts.csv")
    write_texts(new, tmp_path / "new_texts.csv")
    annotations = pd.read_csv(SIMULATED / "annotations.csv")
    annotations[annotations.text_id.isin(train)].to_csv(tmp_path / "annotations.csv", index=False)
    return tmp_path, save_model(llama, tok, tmp_path / "tiny-llm")


def test_the_quickstart_commands_run_as_written(checkout):
    folder, model = checkout
    commands = quickstart()
    assert [c[0] for c in commands] == [".venv/bin/llmrubric", *[".venv/bin/python"] * 2, *[".venv/bin/llmrubric"] * 2]
    extract = commands[0]
    new_features = [
        {"texts.csv": "new_texts.csv", "features.parquet": "new_features.parquet"}.get(a, a) for a in extract
    ]
    with chdir(folder):
        for argv in [extract, new_features, *commands[1:]]:
            assert run(argv, model) == 0, shlex.join(argv)

    run_dir = folder / "outputs" / "mine"
    assert (run_dir / "fold0.safetensors").is_file() and json.loads((run_dir / "metrics.json").read_text())["methods"]
    scores = pd.read_csv(folder / "scores.csv")
    new_ids = set(pd.read_csv(folder / "new_texts.csv").text_id)
    assert set(scores.text_id) == new_ids and scores["mean"].notna().all()
    assert set(pd.read_parquet(folder / "predictions.parquet").text_id) == new_ids
    assert any((folder / "board").iterdir())
