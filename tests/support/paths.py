"""Where the repository and the shared LLM-Rubric release are (``LLM_RUBRIC_DATA``, as in ``conf/data/``)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("LLM_RUBRIC_DATA") or ROOT.parent / "shared" / "data" / "llm-rubric")
DIALSUMM = Path(os.environ.get("DIALSUMM_DATA") or ROOT.parent / "shared" / "data" / "dialsumm")
