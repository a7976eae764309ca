"""``train.py`` / ``evaluate.py`` run as a user runs them, in this process, so that Hydra parses the overrides as
on the command line: :func:`run` (exit code and output) and :func:`run_script` (exit code); :func:`snapshot` of the
files a run leaves."""

from __future__ import annotations

import hashlib
import os
import runpy
import subprocess
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

from .paths import ROOT


def run(script, *args) -> subprocess.CompletedProcess:
    """``python <script> args…`` from the repository root, in this process (:func:`run_script`: the same Hydra
    parsing, no second start-up of torch); its exit code and what it printed, as a completed process."""
    out, err, cwd = StringIO(), StringIO(), os.getcwd()
    os.chdir(ROOT)
    try:
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = run_script(script, [str(a) for a in args])
    finally:
        os.chdir(cwd)
    return subprocess.CompletedProcess([sys.executable, script, *args], code, out.getvalue(), err.getvalue())


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
    """Every file under ``folder``, Hydra's config copy and logs included (a failed run writes none of them):
    content hash and mode."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(folder))] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)
    return out
