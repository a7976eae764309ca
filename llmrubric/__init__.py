"""llmrubric: calibrated, judge-specific evaluation scores from an LLM's answer distributions.

The public API, imported on first use so that ``import llmrubric`` (and the CLI) stays light:

- tables and rubrics: :class:`Rubric`, :func:`load_tables`, :func:`read_table`, :func:`write_table`
- the models: :class:`AutoCalibrator` (the shipped default, ``model=auto``), :class:`NetworkCalibrator`
  (the calibration network alone), :class:`Levelled` (any model with the system level), :func:`make_model` (any
  name of ``llmrubric models list``), :func:`load_model` (any checkpoint)
- scores and leaderboards: :func:`score_texts`, :func:`build_leaderboard`, :func:`rank_correlation`
- data: :func:`simulate`
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "Rubric": "llmrubric.io.rubric",
    "Tables": "llmrubric.io.tables",
    "load_tables": "llmrubric.io.tables",
    "read_table": "llmrubric.io.tables",
    "write_table": "llmrubric.io.files",
    "AutoCalibrator": "llmrubric.model.auto",
    "NetworkCalibrator": "llmrubric.model.families.network.calibrator",
    "Levelled": "llmrubric.model.families.levelled",
    "load_model": "llmrubric.model.core.checkpoints",
    "score_texts": "llmrubric.scoring.scores",
    "rank_correlation": "llmrubric.scoring.leaderboard",
    "simulate": "llmrubric.data.simulate",
}
_RENAMED = {
    "build_leaderboard": ("llmrubric.scoring.leaderboard", "build"),
    "make_model": ("llmrubric.model.core.registry", "make"),
}

__all__ = sorted([*_PUBLIC, *_RENAMED])


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if name in _RENAMED:
        module, attr = _RENAMED[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'llmrubric' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
