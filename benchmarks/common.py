"""What the benchmark scripts share: the LLM-Rubric data folder they default to, how a run ends and how its
result is written (with the commit it measured)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmrubric.io.errors import InputError
from llmrubric.io.files import write_json

ROOT = Path(__file__).resolve().parents[1]


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
    """The code a run measures: ``commit`` (``git rev-parse --short HEAD``) and ``dirty`` (tracked files differ
    from it); ``"unknown"`` and None outside a git checkout. Take it when a run starts: HEAD may move meanwhile."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return {"commit": "unknown", "dirty": None}
    status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def write_result(report: dict, path: str | Path, version: dict | None = None) -> Path:
    """``report`` written atomically to ``path`` (:func:`llmrubric.io.files.write_json`) with ``meta.commit`` and
    ``meta.dirty`` of ``version`` (default: :func:`code_version` now)."""
    meta = {**report.get("meta", {}), **(version or code_version())}
    return write_json({**report, "meta": meta}, path)
