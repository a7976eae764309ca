"""What the benchmark scripts share: the LLM-Rubric data folder they default to and how a run ends."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmrubric.io.errors import InputError

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
