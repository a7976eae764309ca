"""The rubric argument of the public API: a :class:`~llmrubric.io.rubric.Rubric`, or the path of a rubric YAML."""

from __future__ import annotations

import os

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric


def as_rubric(rubric: Rubric | str | os.PathLike) -> Rubric:
    """``rubric`` as it is, or the rubric YAML at that path (:meth:`Rubric.load`); anything else is one
    :class:`InputError` line saying what was given."""
    if isinstance(rubric, Rubric):
        return rubric
    if isinstance(rubric, (str, os.PathLike)):
        return Rubric.load(rubric)
    raise InputError(
        f"a rubric is a Rubric or the path of a rubric YAML (str or Path), got {type(rubric).__name__}",
        setting="rubric",
    )
