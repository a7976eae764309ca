"""A newcomer's mistakes (issue 62), each through the command line: exactly one line on stderr, exit 2, no
traceback, and nothing written, not even in the finished run folder a failed run is pointed at (its files'
bytes and modification times are compared before and after, and no file or folder appears beside them).

Most cases run ``llmrubric`` (:func:`llmrubric.cli.main`) or ``train.py`` / ``evaluate.py`` in this process, as
tests/test_bad_input.py does; three run as real subprocesses, started together, to check the same from a user's
shell (each start of Python with torch costs seconds).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from support.paths import ROOT
from support.scripts import run_script

from llmrubric.cli import main as cli_main

pytestmark = pytest.mark.slow
SIM = ROOT / "data" / "simulated"
BAD_YAML = "name: mine\nquestions:\n  - id: A\n    options: [1, 2, 3]\n  - {id: B, options: [1, 2]\n"
TYPO_YAML = (
    "name: mine\nquestions:\n  - id: A\n    mian: true\n    options: [1, 2, 3]\n  - id: B\n    options: [1, 2]\n"
)
RUN_FILES = {  # a finished run's folder: what a failed run pointed at it must leave as it is
    "fold0.safetensors": b"checkpoint bytes",
    "folds.csv": b"text_id,fold\nt0001,0\n",
    "hydra/train/config.yaml": b"seed: 0\n",
    "hydra/train/overrides.yaml": b"- experiment=demo\n",
    "hydra/train/hydra.yaml": b"hydra: {}\n",
    "train.log": b"[train][INFO] - checkpoints and folds written\n",
    "metrics.json": b"{}\n",
}


def finished_run(d: Path) -> Path:
    run = d / "run"
    for name, data in RUN_FILES.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)
    return run


def table(d: Path, name: str, change: Callable[[pd.DataFrame], pd.DataFrame] | None = None) -> Path:
    """A copy of the simulated data's table ``name`` in ``d``, after ``change``."""
    df = pd.read_csv(SIM / f"{name}.csv", dtype=str, keep_default_na=False)
    path = d / f"{name}.csv"
    (change(df) if change else df).to_csv(path, index=False)
    return path


def app(entry: str, data: dict | None = None, *extra: str):
    """A ``train.py``/``evaluate.py`` case on the demo experiment and the finished run folder, with the simulated
    tables (``data``: table → a function of the case folder giving its path, a changed copy)."""

    def make(d: Path) -> list[str]:
        paths = {
            t: (data or {}).get(t, lambda d, t=t: SIM / f"{t}.csv")(d) for t in ("annotations", "features", "texts")
        }
        return [
            "experiment=demo",
            "logger=none",
            f"run_dir={finished_run(d)}",
            *(f"data.train.{t}='{p}'" for t, p in paths.items()),
            *extra,
        ]

    return entry, make


def with_file(name: str, content: bytes | str, entry: str, args: Callable[[Path, Path], list[str]]):
    """A case reading the file ``name`` of the case folder, written with ``content``."""

    def make(d: Path) -> list[str]:
        path = d / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return args(d, path)

    return entry, make


def features(change):
    return {"features": lambda d: table(d, "features", change)}


def annotations(change):
    return {"annotations": lambda d: table(d, "annotations", change)}


def set_prob(row: int, value: str):
    def change(df):
        df = df.copy()
        df.loc[df.index[row - 1], "prob"] = value
        return df

    return change


def duplicated_header(d: Path) -> Path:
    path = table(d, "features")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0] + ",prob", *(line + ",0.5" for line in lines[1:])]) + "\n")
    return path


def score(*extra: str, checkpoint=None):
    """``llmrubric score texts`` of the simulated features, with a checkpoint file that is not one by default."""

    def make(d: Path) -> list[str]:
        ckpt = checkpoint(d) if checkpoint else d / "missing.safetensors"
        return ["score", "texts", str(ckpt), str(SIM / "features.csv"), "--out", str(d / "out" / "s.csv"), *extra]

    return "cli", make


def new_run(d: Path) -> list[str]:
    """A failed run pointed at a run folder that does not exist yet: neither it nor its parent is created."""
    return ["experiment=demo", "logger=none", f"run_dir={d / 'new' / 'run'}", "data.train.annotations=nope.csv"]


@dataclass
class Case:
    id: str
    entry: str
    make: Callable[[Path], list[str]]
    needles: tuple[str, ...]


def case(id: str, how: tuple[str, Callable], *needles: str) -> Case:
    return Case(id, how[0], how[1], needles)


CASES = [
    # the issue's own
    case(
        "missing-annotations-on-a-finished-run",
        app("train.py", {"annotations": lambda d: d / "nope.csv"}),
        "nope.csv",
        "not found",
    ),
    case(
        "evaluate-missing-features-on-a-finished-run",
        app("evaluate.py", {"features": lambda d: d / "nope.csv"}),
        "nope.csv",
    ),
    case(
        "rubric-yaml-error-train",
        with_file("mine.yaml", BAD_YAML, "train.py", lambda d, p: [f"rubric={p}", f"run_dir={finished_run(d)}"]),
        "mine.yaml, line 6, column 1",
        "not valid YAML",
    ),
    case(
        "rubric-yaml-error-llmrubric",
        with_file(
            "mine.yaml",
            BAD_YAML,
            "cli",
            lambda d, p: ["data", "summary", "--llm-rubric", str(d), "--split", "real", "--rubric", str(p)],
        ),
        "mine.yaml, line 6, column 1",
    ),
    case(
        "rubric-unknown-key",
        with_file("mine.yaml", TYPO_YAML, "train.py", lambda d, p: [f"rubric={p}", f"run_dir={finished_run(d)}"]),
        "unknown key 'mian'",
        "did you mean 'main'?",
    ),
    case("rubric-path-missing", app("train.py", None, "rubric=/some/path.yaml"), "/some/path.yaml", "not found"),
    case(
        "unknown-flag",
        score("--quantlie", "0.8"),
        "--quantlie",
        "did you mean --quantile?",
        "usage: llmrubric score texts",
    ),
    case("unknown-model-choice", app("train.py", None, "model=forest"), "setting model", "'forest'", "options: auto"),
    case("unknown-setting", app("train.py", None, "trainer.lrr=0.1"), "trainer.lrr", "did you mean 'lr'?"),
    case("learning-rate-not-a-number", app("train.py", None, "trainer.lr=abc"), "trainer.lr", "'abc' is not a number"),
    # ten more
    case("features-duplicated-header", app("train.py", {"features": duplicated_header}), "features.csv", "prob"),
    case(
        "features-block-sums-to-1.5",
        app("train.py", features(set_prob(1, str(float(pd.read_csv(SIM / "features.csv").prob[0]) + 0.5)))),
        "features.csv",
        "row",
    ),
    case("features-negative-prob", app("train.py", features(set_prob(3, "-0.2"))), "features.csv", "row 3", "prob"),
    case(
        "annotations-unknown-question",
        app("train.py", annotations(lambda df: df.assign(question_id=df.question_id.replace("Q3", "Q99")))),
        "Q99",
        "question_id",
    ),
    case(
        "annotations-text-without-features",
        app("train.py", annotations(lambda df: df.assign(text_id=df.text_id.replace("t0001", "t9999")))),
        "t9999",
    ),
    case(
        "annotations-not-utf8",
        app(
            "train.py",
            {"annotations": lambda d: write(d / "ann.csv", "text_id,judge_id\ncaf\xe9,J1\n".encode("latin-1"))},
        ),
        "ann.csv",
    ),
    case(
        "annotations-empty-file",
        app("train.py", {"annotations": lambda d: write(d / "ann.csv", b"")}),
        "ann.csv",
        "empty",
    ),
    case("annotations-is-a-folder", app("train.py", {"annotations": lambda d: d}), "folder"),
    case("coverage-1.5", app("train.py", None, "coverage=1.5"), "coverage", "1.5"),
    case("score-coverage-1.5", score("--coverage", "1.5"), "--coverage", "1.5"),
    case(
        "checkpoint-not-a-checkpoint",
        score(checkpoint=lambda d: write(d / "m.safetensors", b"not a checkpoint")),
        "m.safetensors",
    ),
    case(
        "rubric-not-utf8",
        with_file("mine.yaml", "name: caf\xe9\n".encode("latin-1"), "train.py", lambda d, p: [f"rubric={p}"]),
        "mine.yaml",
        "UTF-8",
    ),
    case("new-run-dir-not-created", ("train.py", new_run), "nope.csv"),
]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def state(folder: Path) -> dict:
    """Every file and folder under ``folder``: a file's bytes (hash) and modification time, a folder's name."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        if p.is_file()
        else "dir"
        for p in sorted(folder.rglob("*"))
    }


def one_line_exit_2(code, err: str, needles) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def test_the_issues_inputs_and_ten_more_are_here():
    assert len(CASES) >= 20 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    monkeypatch.chdir(tmp_path)
    args = [str(a) for a in case.make(tmp_path)]
    before = state(tmp_path)
    try:
        code = cli_main(args) if case.entry == "cli" else run_script(case.entry, args)
    except SystemExit as e:
        code = e.code
    one_line_exit_2(code, capsys.readouterr().err, case.needles)
    assert state(tmp_path) == before, "a file or folder was written or changed"


SUBPROCESS = ["missing-annotations-on-a-finished-run", "rubric-yaml-error-train", "unknown-flag"]


def test_from_a_shell_too(tmp_path):
    """Three of the cases as a user runs them, as real processes started together."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    started = []
    for case in (c for c in CASES if c.id in SUBPROCESS):
        d = tmp_path / case.id
        d.mkdir()
        args = [str(a) for a in case.make(d)]
        command = (
            [sys.executable, "-m", "llmrubric.cli", *args]
            if case.entry == "cli"
            else [sys.executable, str(ROOT / case.entry), *args]
        )
        before = state(d)
        started.append(
            (
                case,
                d,
                before,
                subprocess.Popen(command, cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            )
        )
    for case, d, before, process in started:
        _, err = process.communicate(timeout=300)
        one_line_exit_2(process.returncode, err, case.needles)
        assert state(d) == before, f"{case.id}: a file or folder was written or changed"
