"""The blocks of one extraction family in a features table: question ids ``<family>:<item>``."""

from __future__ import annotations

import pandas as pd

from llmrubric.io.errors import InputError


def family_rows(features: pd.DataFrame, family: str) -> pd.DataFrame:
    """The feature rows of ``family``'s blocks (question ids that start with ``<family>:``)."""
    return features[features.question_id.astype(str).str.startswith(f"{family}:")]


def one_source(rows: pd.DataFrame, family: str, source: str | None, file: str) -> pd.DataFrame:
    """The rows of ``source``, or of the only source there is; several and none chosen is an error."""
    sources = sorted(rows.source.unique())
    if source is None and len(sources) > 1:
        raise InputError(f"{family} blocks come from several sources {sources}; choose one", file=file, column="source")
    return rows[rows.source == (source or sources[0])]


def block_table(rows: pd.DataFrame) -> pd.DataFrame:
    """(text, question) × option probabilities; an option a block lacks is NA."""
    return rows.pivot_table(index=["text_id", "question_id"], columns="option", values="prob", aggfunc="first")
