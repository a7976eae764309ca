"""The canonical long tables' contracts (DESIGN.md): the columns each table must and may have,
which are ids, and what NA means in each, shown by ``llmrubric schema show``."""

from __future__ import annotations

from dataclasses import dataclass

PROB_TOLERANCE = 1e-6  # per option: probabilities written with 6 decimals may sum to 1 + options × 1e-6
# a block summing to more than that but at most 1 + API_SUM_TOLERANCE is an API's rounded log-probabilities
# (GPT-4o-mini's reach 1.00004): renormalised to 1 and counted; above it, an error
API_SUM_TOLERANCE = 1e-3
NA_ANSWERS = ("", "NA")  # an answer cell that is empty or NA: the row is absent (dropped and counted)


@dataclass(frozen=True)
class TableSpec:
    """A table contract: required and optional columns, which are ids (read as strings), and
    what each column holds (``columns``: name → type and what NA means), shown by ``llmrubric schema show``."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    na_absent: tuple[str, ...] = ()  # NA in these columns: the row is absent (dropped, counted, warned)
    na_allowed: tuple[str, ...] = ()  # required columns whose cells may be NA (a categorical question's mean)


SPECS = {
    "annotations": TableSpec(
        ("text_id", "judge_id", "question_id", "answer"),
        ("system_id", "round"),
        ("text_id", "judge_id", "question_id", "system_id", "round"),
        (
            ("text_id", "string id; NA is an error"),
            ("judge_id", "string id; NA is an error"),
            ("question_id", "string, a rubric question id; NA is an error"),
            (
                "answer",
                "an option value or label of the question; empty or NA: the row is absent (dropped, counted in a warning)",
            ),
            ("system_id", "string id; NA: system unknown"),
            ("round", "string, a judge's repeated annotation of a text; NA: round 1"),
        ),
        ("answer",),
    ),
    "features": TableSpec(
        ("text_id", "source", "question_id", "option", "prob"),
        ("samples",),
        ("text_id", "source", "question_id", "option"),
        (
            ("text_id", "string id; NA is an error"),
            ("source", "string, the LLM (model, prompt variant) that answered; NA is an error"),
            ("question_id", "string, a rubric question id or any other block name; NA is an error"),
            ("option", "an option of the question (a rubric question's llm_options); NA is an error"),
            (
                "prob",
                f"float >= 0; a block (text, source, question) sums to at most 1 + options × {PROB_TOLERANCE:g} "
                f"(unnormalised) or, an API's rounded log-probabilities, at most 1 + {API_SUM_TOLERANCE:g} (renormalised to 1, "
                "counted in a warning); an absent block, or a block of 2+ options that are all 0, is missing (marginalised when predicting, counted in a warning); "
                "a one-option block is a value, 0 included; NA is an error",
            ),
            (
                "samples",
                "int >= 1, the number of parsed answers a sampled or reasoned block was counted from (its `prob` "
                "are the answer counts over it); one value per block; NA: a distribution read otherwise (logprobs, "
                "a verbalized distribution)",
            ),
        ),
    ),
    "texts": TableSpec(
        ("text_id",),
        ("system_id", "query_id", "text"),
        ("text_id", "system_id", "query_id"),
        (
            ("text_id", "string id; NA is an error"),
            ("system_id", "string id; NA: system unknown"),
            ("query_id", "string id; NA: not paired by query"),
            ("text", "string, the text itself; NA: not given"),
        ),
    ),
    "predictions": TableSpec(
        ("text_id", "judge_id", "question_id", "mean", "var"),
        ("system_id", "label", "lo", "hi"),
        ("text_id", "judge_id", "question_id"),
        (
            ("text_id", "string id; NA is an error"),
            ("judge_id", "string id; NA is an error"),
            ("question_id", "string id; NA is an error"),
            (
                "p_<option>",
                "float in [0, 1], one column per option; a question's columns sum to 1 (± 1e-3); NA: not an option of that question",
            ),
            ("mean", "float, the expected answer on an ordered question; NA on a categorical question (no scale)"),
            ("var", "float, the variance of the answer's distribution; NA where `mean` is"),
            ("system_id", "string id; NA: system unknown"),
            ("round", "string; NA: round 1"),
            (
                "label",
                "string, an option of the ordered main question given by the model's label rule (evaluate.py); NA on other questions",
            ),
            (
                "lo",
                "float, the lower end of the answer's conformal interval at the coverage asked (`coverage`, default "
                "0.9) on a question the model has a calibration of (model=auto: every question answered, "
                "`model.auto.intervals`); NA on other questions",
            ),
            ("hi", "float, the upper end of that interval; NA where `lo` is"),
            (
                "set",
                "string, the answer's conformal prediction set at that coverage, options joined by `|`, where the "
                "calibrated question is categorical; NA on other questions (the column only then)",
            ),
        ),
        na_allowed=("mean", "var"),
    ),
    "scores": TableSpec(  # written by `llmrubric score texts` (llmrubric.scoring.scores.SCORE_COLUMNS, in this order)
        (
            "text_id",
            "system_id",
            "question_id",
            "mean",
            "lo",
            "hi",
            "max",
            "quantile",
            "judges",
            "status",
            "missing_blocks",
        ),
        (),
        ("text_id", "system_id", "question_id"),
        (
            ("text_id", "string id; NA is an error"),
            ("system_id", "string id; NA: system unknown"),
            ("question_id", "string, an ordered rubric question (a categorical question has no judge-free score)"),
            (
                "mean",
                "float, the judge-free score: the mean over the trusted judges of each judge's expected answer; "
                "NA where the text has no features (status no_features)",
            ),
            (
                "lo",
                "float, the lower end of the mean's conformal interval at the coverage asked (`--coverage`, default "
                "0.9) on a question the model has a calibration of (model=auto: every question answered, "
                "`model.auto.intervals`); NA on other questions, for a model without one, and where `mean` is NA",
            ),
            ("hi", "float, the upper end of that interval; NA where `lo` is"),
            ("max", "float, the largest of the trusted judges' expected answers; NA where `mean` is"),
            (
                "quantile",
                "float, the `--quantile` (default 0.9) quantile of the trusted judges' expected answers; NA where "
                "`mean` is",
            ),
            ("judges", "int, the number of trusted judges the score is over; 0 where the text has no features"),
            (
                "status",
                "string: `ok`; `masked`, some feature blocks absent and marginalised (named in `missing_blocks`); "
                "`no_features`, not scored",
            ),
            ("missing_blocks", "string, the absent feature blocks, `;`-separated; empty: none; `all`: no features"),
        ),
        na_allowed=("system_id", "mean", "lo", "hi", "max", "quantile", "missing_blocks"),
    ),
}


def schema_text() -> str:
    """The table contracts as Markdown, from :data:`SPECS` (the validators' own specs)."""
    lines = []
    for kind, spec in SPECS.items():
        lines += [f"## {kind}", "", "| column | required | type and NA |", "| --- | --- | --- |"]
        lines += [f"| {name} | {'yes' if name in spec.required else 'no'} | {text} |" for name, text in spec.columns]
        lines.append("")
    return "\n".join(lines)
