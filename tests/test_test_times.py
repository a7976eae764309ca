"""benchmarks/test_times.py reads pytest's own output: its summary line's seconds and the ``--durations`` lines of a
real pytest run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import test_times  # noqa: E402


@pytest.mark.slow  # a pytest run in a subprocess
def test_the_slowest_phases_and_the_seconds_come_from_a_real_pytest_run(tmp_path):
    (tmp_path / "test_sleepy.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(0.3)\n\ndef test_quick():\n    pass\n"
    )
    command = "-m pytest -p no:cacheprovider --durations=5 --durations-min=0.2 -q -o addopts=".split()
    result = subprocess.run([sys.executable, *command, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    found = test_times.slowest(result.stdout)
    assert [(r["phase"], r["test"].split("::")[-1]) for r in found] == [("call", "test_slow")]
    assert 0.3 <= found[0]["seconds"] < 5
    summary = next(line for line in result.stdout.splitlines() if " passed" in line)
    assert 0.3 <= test_times.pytest_seconds(summary) < 30
