"""Judge-calibrated IR scores: test-bank summaries as calibration features.

The per-item self-rating or nugget-support distributions of a passage (or answer) are
summarised into fixed blocks (``llmrubric.extract.summaries``: mean distribution, max-grade
distribution, expected coverage at each threshold, vital/all support rates); these are the
input x of the calibration network and human relevance (or quality) labels per assessor
are its targets (``conf/rubric/relevance.yaml``). The judge-free distribution of every passage (the
trusted judges' average) then gives its label by the checkpoint's label rule
(:mod:`llmrubric.model.core.label_rule`), replacing the uncalibrated max-grade label in qrels and leaderboards.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmrubric.extract.summaries import summarise
from llmrubric.io.predictions import probabilities
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, validate_annotations, validate_features
from llmrubric.model.core.label_rule import rule_of
from llmrubric.model.core.registry import Family
from llmrubric.scoring.scores import score_texts


def summary_features(features: pd.DataFrame, family: str, importance: dict[str, str] | None = None) -> pd.DataFrame:
    """Validated summary blocks (one fixed set per text) of the ``family`` item blocks."""
    summary = summarise(features, family, importance)
    summary.attrs["source"] = features.attrs.get("source", "<summaries>")
    return validate_features(summary)


def ir_tables(
    features: pd.DataFrame,
    family: str,
    judgments: pd.DataFrame,
    rubric: Rubric,
    importance: dict[str, str] | None = None,
) -> Tables:
    """Calibration tables: summaries of ``features`` as x, ``judgments`` (``text_id, judge_id,
    question_id, answer``) as targets; texts without summaries are dropped from the judgments."""
    feats = summary_features(features, family, importance)
    ann = validate_annotations(judgments, rubric)
    kept = ann[ann.text_id.isin(feats.text_id.unique())]
    kept.attrs["source"] = ann.attrs.get("source")
    return Tables(kept, feats)


def calibrated_labels(
    calibrator: Family,
    features: pd.DataFrame,
    family: str,
    texts: pd.DataFrame,
    importance: dict[str, str] | None = None,
    judges: list[str] | None = None,
) -> pd.DataFrame:
    """``query_id, doc_id, grade, relevance``: the judge-free expected label of each passage (``grade``)
    and the option value that the checkpoint's label rule gives the judges' average distribution
    (``relevance``; ``argmax`` for a checkpoint without a rule), ready for ``write_qrels``."""
    question = calibrator.rubric.main
    feats = summary_features(features, family, importance)
    result = score_texts(
        calibrator, feats, texts[["text_id"]], judges=judges, questions=[question.id], keep_predictions=True
    )
    scored = result.scores[result.scores.status != "no_features"]
    columns = [f"p_{k}" for k in question.keys]
    predicted = result.predictions if result.predictions is not None else pd.DataFrame(columns=["text_id", *columns])
    mixed = predicted.groupby("text_id")[columns].mean().reindex(scored.text_id)
    index = rule_of(calibrator).indices(probabilities(mixed, question), question.values)
    info = texts.drop_duplicates("text_id").set_index("text_id")
    doc = info["doc_id"] if "doc_id" in info.columns else pd.Series(info.index, index=info.index)
    out = pd.DataFrame(
        {
            "query_id": info.query_id.reindex(scored.text_id).astype(str).to_numpy(),
            "doc_id": doc.reindex(scored.text_id).astype(str).to_numpy(),
            "grade": scored["mean"].to_numpy(),
        }
    )
    out["relevance"] = np.asarray(question.values, dtype=float)[index].round().astype(int)
    return out
