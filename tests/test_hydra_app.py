"""The start of the Hydra apps (llmrubric.config.hydra_app): Hydra's record of a run is staged and moved into
run_dir only when the run succeeds; ``--help`` is short and names the user's choices, not the internal schemas."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmrubric.config.hydra_app import app_help, run_app


def fake_app(outcome: str):
    """A stand-in for a ``hydra.main`` task: writes Hydra's record where Hydra would (``hydra.run.dir``), then
    returns or fails as a user error does (SystemExit 2)."""

    def task():
        staging = Path(next(a for a in sys.argv if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        (staging / "hydra" / "train").mkdir(parents=True)
        (staging / "hydra" / "train" / "config.yaml").write_text(f"run: {outcome}\n")
        (staging / "train.log").write_text(f"{outcome} run\n")
        if outcome == "failed":
            sys.exit(2)

    return task


def test_a_failed_run_leaves_the_finished_runs_record_and_a_good_one_replaces_it(tmp_path, capsys):
    run = tmp_path / "run"
    overrides = [f"run_dir={run}", "logger=none"]
    run_app(fake_app("first"), "train", overrides)
    assert (run / "hydra" / "train" / "config.yaml").read_text() == "run: first\n"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as failed:
        run_app(fake_app("failed"), "train", overrides)
    assert failed.value.code == 2
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()} == before
    run_app(fake_app("second"), "train", overrides)
    assert (run / "hydra" / "train" / "config.yaml").read_text() == "run: second\n"
    assert (run / "train.log").read_text() == "first run\nsecond run\n"  # the log keeps every finished run
    assert sorted(p.name for p in run.iterdir()) == ["hydra", "train.log"]


def test_a_failed_first_run_creates_no_run_dir(tmp_path):
    with pytest.raises(SystemExit):
        run_app(fake_app("failed"), "train", [f"run_dir={tmp_path / 'new' / 'run'}"])
    assert list(tmp_path.iterdir()) == []


def test_help_is_short_and_lists_the_users_choices(capsys):
    text = app_help("train")
    assert text.startswith("usage: llmrubric train [key=value ...]") and len(text.splitlines()) < 40
    assert "model=auto|combined|default|network|ordinal|paper  default: auto" in text
    assert "schemas" not in text and "  seed=0" in text and "--cfg job" in text
    run_app(None, "train", ["--help"])  # printed before anything is composed or imported
    assert capsys.readouterr().out.strip() == text
