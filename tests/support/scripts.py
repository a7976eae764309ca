"""``train.py`` / ``evaluate.py`` run as a user runs them: in a subprocess (:func:`run`) or in this process
(:func:`run_script`, so that Hydra parses the overrides as on the command line); :func:`snapshot` of the
files a run leaves."""

from __future__ import annotations

import hashlib
import os
import runpy
import subprocess
import sys
from pathlib import Path

from .paths import ROOT


def run(script, *args):
    """``python <script> args…`` in a subprocess in the repository root; the completed process."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def run_script(script: str, overrides: list[str]) -> int:
    """``python <script> overrides…`` in this process; its exit code."""
    argv = [str(ROOT / script), *overrides]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
        return 0
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = old


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (but Hydra's config copy and logs): content hash and mode."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and rel.parts[0] != "hydra" and "hydra" not in rel.parts[:-1] and path.suffix != ".log":
            out[str(rel)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)
    return out
