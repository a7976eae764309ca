"""Feature blocks → one value per block and text: the inputs of the linear and ordinal families.

A block gives its expected answer (ordered numeric options), its probability (a block of one
option, e.g. a summary's ``covered`` fraction) or its normalised distribution less the last
option (categories). A block missing for a text is NaN, for the caller to fill or average over.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.io.rubric import Rubric
from llmrubric.model.core.encoding import Block, FeatureLayout
from llmrubric.model.core.memo import memoised


def block_columns(block: Block, p: np.ndarray, rubric: Rubric) -> np.ndarray:
    """(texts, columns) of one block's probabilities ``p`` (texts, options); NaN where the block is missing."""
    z = p.sum(axis=1, keepdims=True)
    if len(block.options) == 1:
        return np.where(z > 0, p, np.nan)
    dist = np.divide(p, z, out=np.full_like(p, np.nan), where=z > 0)
    question = rubric[block.question_id] if block.question_id in rubric else None
    try:
        values = np.array([float(o) for o in block.options])
    except ValueError:
        values = None
    if values is not None and (question is None or question.ordered):
        return dist @ values[:, None]
    return dist[:, :-1]


@memoised
def text_columns(
    layout: FeatureLayout, rubric: Rubric, features: pd.DataFrame, texts: list[str], absent_ok: bool = False
) -> np.ndarray:
    """(texts, columns) of every block of ``layout``, in layout order; NaN where a block is missing
    (``absent_ok``: see :meth:`FeatureLayout.matrix`)."""
    x = layout.matrix(features, texts, absent_ok).astype(np.float64)
    columns, offset = [], 0
    for block in layout.blocks:
        columns.append(block_columns(block, x[:, offset : offset + len(block.options)], rubric))
        offset += len(block.options)
    return np.hstack(columns) if columns else np.zeros((len(texts), 0))


def column_blocks(layout: FeatureLayout, rubric: Rubric) -> list[Block]:
    """The block of each column of :func:`text_columns` (a categorical block spans several)."""
    out = []
    for block in layout.blocks:
        width = block_columns(block, np.ones((1, len(block.options))), rubric).shape[1]
        out += [block] * width
    return out
