"""Human answers as system scores and text labels, and the check that labelled texts were predicted."""

from __future__ import annotations

import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Question
from llmrubric.io.tables import source_of
from llmrubric.scoring.leaderboard.systems import SystemData


def human_labels(annotations: pd.DataFrame, question: Question) -> pd.Series:
    """text id → mean human answer (as the option value) on ``question``."""
    ann = annotations[annotations.question_id == question.id]
    values = ann.answer.map({k: v for k, v in zip(question.keys, question.values)}).astype(float)
    return values.groupby(ann.text_id).mean()


def human_leaderboard(annotations: pd.DataFrame, question: Question, texts: pd.DataFrame | None = None) -> pd.Series:
    """system → mean human answer over all annotations (as in LLM-Rubric Tables 4–5)."""
    ann = annotations[annotations.question_id == question.id]
    systems = ann.system_id if "system_id" in ann.columns else None
    if texts is not None and "system_id" in texts.columns:
        systems = ann.text_id.map(texts.drop_duplicates("text_id").set_index("text_id").system_id)
    if systems is None or systems.isna().any():
        raise InputError(
            "annotations need a system_id (column or texts table) for a human leaderboard",
            file=source_of(annotations),
            column="system_id",
        )
    values = ann.answer.map({k: v for k, v in zip(question.keys, question.values)}).astype(float)
    return values.groupby(systems.to_numpy()).mean().rename_axis("system")


def human_labels_by_round(annotations: pd.DataFrame, question: Question) -> pd.DataFrame:
    """One row per labelled (text, round) of ``question``: ``text_id, round, label`` (mean human
    answer as the option value) and ``row``, the annotations file row of its first answer."""
    ann = annotations[annotations.question_id == question.id]
    rounds = ann["round"].astype(str) if "round" in ann.columns else pd.Series("1", index=ann.index)
    values = ann.answer.map({k: v for k, v in zip(question.keys, question.values)}).astype(float)
    frame = pd.DataFrame({"text_id": ann.text_id.to_numpy(), "round": rounds.to_numpy(), "label": values.to_numpy()})
    frame["row"] = ann.index.to_numpy()
    return frame.groupby(["text_id", "round"], as_index=False, sort=True).agg(
        label=("label", "mean"), row=("row", "min")
    )


def check_labelled_texts(systems: list[SystemData], annotations: pd.DataFrame, question: Question) -> None:
    """Every annotated text of ``question`` must have predictions, else an error naming its annotations row."""
    known = {t for s in systems for t in s.text_ids}
    ann = annotations[annotations.question_id == question.id]
    unknown = ~ann.text_id.isin(known)
    if unknown.any():
        row = ann.index[unknown.to_numpy().argmax()]
        raise InputError(
            f"text {ann.at[row, 'text_id']!r} has human labels but no predictions of {question.id}",
            file=source_of(annotations),
            row=int(row),
            column="text_id",
        )
