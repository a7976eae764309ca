"""What the benchmark scripts share: the LLM-Rubric data folder they default to, how a run ends and how its
result is written (with the commit it measured)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from llmrubric.io.errors import InputError
from llmrubric.io.files import write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def llm_rubric_default() -> str:
    """The LLM-Rubric data folder: ``$LLM_RUBRIC_DATA``, else ``shared/data/llm-rubric`` beside the checkout."""
    return os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric"))


def exit_code(run, argv: list[str] | None) -> int:
    """``run(argv)``'s exit code; bad input is one line on stderr and exit code 2."""
    try:
        return run(argv)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def code_version() -> dict:
    """The code a run measures: ``commit`` (``git rev-parse --short HEAD``), ``dirty`` (tracked files differ from
    it, outside ``benchmarks/results``) and ``diff`` (a hash of those differences, '' when clean); ``"unknown"`` and None outside a git checkout.
    Take it when a run starts and hand it to :func:`write_result`, which compares it with the code at the end."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return {"commit": "unknown", "dirty": None, "diff": None}
    results = f":(exclude){RESULTS.relative_to(ROOT).as_posix()}"  # what the benchmarks write is not the code measured
    diff = subprocess.run([*git, "diff", "HEAD", "--binary", "--", ".", results], capture_output=True).stdout
    return {
        "commit": head.stdout.strip(),
        "dirty": bool(diff),
        "diff": hashlib.sha256(diff).hexdigest()[:12] if diff else "",
    }


def write_result(report: dict, path: str | Path, version: dict) -> Path:
    """``report`` written atomically to ``path`` (:func:`llmrubric.io.files.write_json`) with ``meta.commit``,
    ``meta.dirty`` (at the start) and ``meta.dirty_at_end`` and ``meta.diff``. ``version`` is :func:`code_version`
    taken when the run started; when the code at the end differs (another commit, or other tracked changes) the
    figures measured no one version: nothing is written and the error says what changed."""
    start, end = ({k: v.get(k) for k in ("commit", "dirty", "diff")} for v in (version, code_version()))
    if start != end:
        raise InputError(
            f"not written: the code changed while the run measured it (at its start commit {start['commit']}, "
            f"tracked changes {start['diff'] or 'none'}; at its end commit {end['commit']}, tracked changes "
            f"{end['diff'] or 'none'}); re-run it at one commit",
            file=str(path),
        )
    meta = {**report.get("meta", {}), **start, "dirty_at_end": end["dirty"]}
    return write_json({**report, "meta": meta}, path)
