"""Where the shipped settings are: ``conf/`` ships inside the package as ``llmrubric.conf``."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

CONF_PACKAGE = "llmrubric.conf"


CONF_PATH = f"pkg://{CONF_PACKAGE}"


VERSION_BASE = "1.3"


def conf_path(*parts: str) -> Path:
    """A file or folder of the shipped ``conf/`` (``conf_path("rubric", "llm_rubric.yaml")``),
    found with :mod:`importlib.resources` in a checkout and in an installed wheel alike."""
    return Path(str(importlib.resources.files(CONF_PACKAGE).joinpath(*parts)))
