"""Tables → MLflow traces, and calibrated scores → ``CODE`` feedback on their traces.

:func:`log_tables` is the inverse of :func:`llmrubric.mlflow_genai.read.read_traces`: one trace per
text (the text as the root span's request, tags :data:`~llmrubric.mlflow_genai.read.TEXT_ID_TAG` and
the system tag), a ``HUMAN`` feedback per annotation and an ``LLM_JUDGE`` feedback per feature
block (the most probable option as its value, the block in its metadata). :func:`log_scores` writes
a scores table (``llmrubric score texts``) onto the traces its texts came from. Both write to the
current tracking store (``mlflow.set_tracking_uri`` or ``MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.entities import AssessmentSource, Feedback
from tqdm.auto import tqdm

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.mlflow_genai.read import CODE, DISTRIBUTION_KEY, HUMAN, LLM_JUDGE, TEXT_ID_TAG

SCORE_NAME = "llmrubric/{question}"  # the name of a calibrated score's feedback
WRITERS = 8  # feedback logged at once (within MLflow's HTTP connection pool, llmrubric.mlflow_genai.store)


def log_tables(
    experiment_id: str, tables, rubric: Rubric, system_tag: str = "system_id", progress: bool = False
) -> dict[str, str]:
    """One trace per text of ``tables`` (annotations, features, texts) in ``experiment_id``, with its
    feedback; returns text id → trace id."""
    client = mlflow.MlflowClient()
    texts = tables.texts if tables.texts is not None else pd.DataFrame({"text_id": tables.features.text_id.unique()})
    trace_ids = {}
    for row in tqdm(texts.itertuples(index=False), total=len(texts), desc="traces", disable=not progress):
        tags = {TEXT_ID_TAG: str(row.text_id)}
        if getattr(row, "system_id", None) is not None:
            tags[system_tag] = str(row.system_id)
        span = client.start_trace(
            "text", inputs={"text": str(getattr(row, "text", "") or "")}, tags=tags, experiment_id=experiment_id
        )
        client.end_trace(span.trace_id)
        trace_ids[str(row.text_id)] = span.trace_id
    mlflow.flush_trace_async_logging()
    feedback = [
        dict(
            trace_id=trace_ids[str(row.text_id)],
            name=row.question_id,
            value=_value(row.answer),
            source=AssessmentSource(source_type=HUMAN, source_id=str(row.judge_id)),
        )
        for row in tables.annotations.itertuples(index=False)
    ]
    for (text_id, source, qid), block in tables.features.groupby(["text_id", "source", "question_id"], sort=False):
        if qid not in rubric:
            continue
        dist = dict(zip(block.option.astype(str), block.prob.astype(float)))
        feedback.append(
            dict(
                trace_id=trace_ids[str(text_id)],
                name=qid,
                value=_value(max(dist, key=dist.get)),
                source=AssessmentSource(source_type=LLM_JUDGE, source_id=str(source)),
                metadata={DISTRIBUTION_KEY: json.dumps(dist)},
            )
        )
    with ThreadPoolExecutor(WRITERS) as pool:  # one request per feedback: a few at once, as raters and judges do
        done = pool.map(lambda kwargs: mlflow.log_feedback(**kwargs), feedback)
        for _ in tqdm(done, total=len(feedback), desc="feedback", disable=not progress):
            pass
    return trace_ids


def _value(key: str):
    """An option key as the feedback value: a number where it is one."""
    try:
        number = float(key)
    except (TypeError, ValueError):
        return str(key)
    return int(number) if number.is_integer() else number


def log_scores(scores: pd.DataFrame, trace_ids: dict[str, str], checkpoint: str | Path, progress: bool = False) -> int:
    """A ``CODE`` feedback (source: the checkpoint's file name) per scored (text, question) of ``scores``
    on the text's trace: the calibrated judge-free ``mean`` as the value, its interval and status in the
    metadata. Every text must have a trace (an error names the first that has none, before any write);
    returns how many were written."""
    missing = sorted(set(scores.text_id.astype(str)) - set(trace_ids))
    if missing:
        raise InputError(
            f"text {missing[0]!r} ({len(missing)} in all) has no trace in the experiment", setting="--log-to-traces"
        )
    source = AssessmentSource(source_type=CODE, source_id=Path(checkpoint).name)
    rows = [row for row in scores.itertuples(index=False) if math.isfinite(float(row.mean))]  # unscored: nothing
    with ThreadPoolExecutor(WRITERS) as pool:
        done = pool.map(
            lambda row: mlflow.log_assessment(trace_ids[str(row.text_id)], score_feedback(row, source)), rows
        )
        for _ in tqdm(done, total=len(rows), desc="log scores", disable=not progress):
            pass
    return len(rows)


def score_feedback(row, source: AssessmentSource) -> Feedback:
    """The feedback of one scores row (text, question)."""
    meta = {"lo": row.lo, "hi": row.hi, "status": row.status, "judges": row.judges}
    interval = f"[{row.lo:.3f}, {row.hi:.3f}]" if _finite(row.lo) and _finite(row.hi) else "none"
    return Feedback(
        name=SCORE_NAME.format(question=row.question_id),
        value=float(row.mean),
        source=source,
        rationale=f"calibrated judge-free score of {source.source_id} (mean over {row.judges} judges); interval {interval}",
        metadata={k: str(v) for k, v in meta.items()},
    )


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
