"""A data set's settings (``data.*``, ``conf/data/``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MISSING = "???"  # OmegaConf's mark of a setting without a default, which each file must set


@dataclass
class DataConfig:
    """A data set (``data.*``, ``conf/data/``): ``train`` and ``test`` are the ``_target_`` calls that
    load their tables (``llmrubric.io.tables.load_tables``, ``llmrubric.data.llm_rubric.load``);
    ``test`` None: the protocol splits the training texts. ``root``: a folder the calls may share."""

    name: str = MISSING
    train: Any = MISSING
    test: Any = None
    root: str | None = None
