"""An MLflow experiment's traces → annotations, features and texts.

A trace is a text (``text_id``: the trace id, or the tag :data:`TEXT_ID_TAG` where the trace carries
one; ``text``: its request and response; ``system_id``: the value of a tag the user names). A valid
``HUMAN`` feedback whose name is a rubric question (its id or name) is an annotation (judge: the
source id; the value checked against the question's options); an ``LLM_JUDGE`` feedback is a
feature block of the source id: the distribution in its metadata (:data:`DISTRIBUTION_KEY`, a JSON
object option → probability) or a point mass on its value. Several raters of one trace stay several
judges; a rater's later feedback on the same question replaces the earlier one (counted).
Feedback on other names, ``CODE`` feedback (scores written back) and feedback with an error are
counted, not read. A bad value is one error naming the trace and the assessment; nothing is returned.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Question, Rubric, option_key

HUMAN, LLM_JUDGE, CODE = "HUMAN", "LLM_JUDGE", "CODE"
DISTRIBUTION_KEY = "distribution"
TEXT_ID_TAG = "llmrubric.text_id"
PAGE = 500


@dataclass
class TraceTables:
    """The three tables read from traces, and what was counted on the way (``counts``)."""

    annotations: pd.DataFrame
    features: pd.DataFrame
    texts: pd.DataFrame
    counts: dict = field(default_factory=dict)
    other_names: list[str] = field(default_factory=list)  # names of the HUMAN / LLM_JUDGE feedback no question has


def experiment_id(client, experiment: str) -> str:
    """The id of ``experiment`` (a name, else an id) on the client's store; an error if it has none."""
    found = client.get_experiment_by_name(experiment)
    if found is None and experiment.isdigit():
        try:
            found = client.get_experiment(experiment)
        except Exception:  # the store says it has no such id
            found = None
    if found is None:
        raise InputError(f"no MLflow experiment {experiment!r} on {client.tracking_uri}", setting="--experiment")
    return found.experiment_id


def search_traces(
    client, experiment: str, trace_ids: list[str] | None = None, tag: tuple[str, str] | None = None
) -> list:
    """Every trace of ``experiment`` with its spans and assessments (only ``trace_ids`` when given, only those
    whose tag ``tag[0]`` is ``tag[1]`` when given), in request-time order."""
    eid = experiment_id(client, experiment)
    where = _tag_filter(*tag) if tag else None
    traces, token = [], None
    while True:
        page = client.search_traces(
            locations=[eid], filter_string=where, max_results=PAGE, page_token=token, order_by=["timestamp_ms ASC"]
        )
        traces += list(page)
        token = page.token
        if not token:
            break
    if trace_ids is not None:
        wanted = set(trace_ids)
        traces = [t for t in traces if t.info.trace_id in wanted]
    if tag:
        traces = [t for t in traces if t.info.tags.get(tag[0]) == tag[1]]
    return traces


def _tag_filter(name: str, value: str) -> str | None:
    """MLflow's filter string of traces whose tag ``name`` is ``value`` (None where no quoting holds both: the
    caller filters)."""
    if "`" in name:
        return None
    quote = next((q for q in ("'", '"') if q not in value), None)
    return f"tags.`{name}` = {quote}{value}{quote}" if quote else None


def read_traces(traces: list, rubric: Rubric, system_tag: str | None = None) -> TraceTables:
    """``traces`` (MLflow ``Trace`` objects) → :class:`TraceTables`; see the module docstring."""
    counts = {"traces": len(traces), "other_feedback": 0, "code_feedback": 0, "errors": 0, "replaced": 0}
    annotations, blocks, texts, other = [], {}, [], set()
    for trace in traces:
        text_id = trace_text_id(trace)
        texts.append(_text_row(trace, text_id, system_tag))
        latest: dict[tuple, tuple] = {}
        for a in sorted(trace.info.assessments, key=lambda a: a.create_time_ms or 0):
            kind = _kind(a, rubric, counts)
            if kind is None:
                if a.source.source_type in (HUMAN, LLM_JUDGE) and _question(rubric, a.name) is None:
                    other.add(a.name)
                continue
            question = _question(rubric, a.name)
            key = (kind, a.source.source_id, question.id)
            counts["replaced"] += key in latest
            latest[key] = (a, question)
        for (kind, source, qid), (a, question) in latest.items():
            if kind == HUMAN:
                annotations.append((text_id, source, qid, human_answer(a, question, trace)))
            else:
                blocks[(text_id, source, qid)] = judge_distribution(a, question, trace)
    counts.update(annotations=len(annotations), feature_blocks=len(blocks))
    tables = TraceTables(_annotations(annotations), _features(blocks), pd.DataFrame(texts), counts)
    tables.other_names = sorted(other)
    return tables


def trace_text_id(trace) -> str:
    """The text id of a trace: its tag :data:`TEXT_ID_TAG`, else its trace id."""
    return str(trace.info.tags.get(TEXT_ID_TAG) or trace.info.trace_id)


def _text_row(trace, text_id: str, system_tag: str | None) -> dict:
    row = {"text_id": text_id, "trace_id": trace.info.trace_id, "text": trace_text(trace)}
    if system_tag:
        system = trace.info.tags.get(system_tag)
        if system in (None, ""):
            raise InputError(
                f"trace {trace.info.trace_id} has no tag {system_tag!r} (the system)", setting="--system-tag"
            )
        row["system_id"] = str(system)
    return row


def trace_text(trace) -> str:
    """The request and the response of a trace's root span, a JSON object of one string shown as that string."""
    request = _plain(trace.data.request if trace.data else trace.info.request_preview)
    response = _plain(trace.data.response if trace.data else trace.info.response_preview)
    return "\n".join(part for part in (request, response) if part)


def _plain(value: str | None) -> str:
    if not value:
        return ""
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return str(value)
    if isinstance(parsed, dict) and len(parsed) == 1 and isinstance(next(iter(parsed.values())), str):
        return next(iter(parsed.values()))
    return parsed if isinstance(parsed, str) else str(value)


def _kind(a, rubric: Rubric, counts: dict) -> str | None:
    """HUMAN or LLM_JUDGE for feedback to read; None (counted) for everything else."""
    if a.feedback is None or a.valid is False:
        return None
    source = a.source.source_type
    if source == CODE:
        counts["code_feedback"] += 1
        return None
    if source not in (HUMAN, LLM_JUDGE) or _question(rubric, a.name) is None:
        counts["other_feedback"] += 1
        return None
    if a.feedback.error is not None:
        counts["errors"] += 1
        return None
    return source


def _question(rubric: Rubric, name: str) -> Question | None:
    """The rubric question an assessment name stands for: its id, else its name."""
    if name in rubric:
        return rubric[name]
    return next((q for q in rubric.questions if q.name and q.name == name), None)


def _where(trace, a) -> str:
    return f"trace {trace.info.trace_id}, assessment {a.name!r} ({a.source.source_type} {a.source.source_id!r})"


def human_answer(a, question: Question, trace) -> str:
    """The option key of a HUMAN feedback's value; off the scale is an error naming the trace and the assessment."""
    value = a.feedback.value
    index = None if isinstance(value, (list, dict)) or value is None else question.index_of(value)
    if index is None:
        raise InputError(f"{_where(trace, a)}: value {value!r} is not an option of {question.id} {list(question.keys)}")
    return question.options[index].key


def judge_distribution(a, question: Question, trace) -> dict[str, float]:
    """An LLM_JUDGE feedback's distribution over the question's ``llm_options``: its metadata's
    :data:`DISTRIBUTION_KEY`, else a point mass on its value; an unknown option or a bad probability is an error."""
    options = list(question.llm_options)
    raw = (a.metadata or {}).get(DISTRIBUTION_KEY)
    if raw is None:
        key = None if isinstance(a.feedback.value, (list, dict)) else option_key(a.feedback.value)
        if key not in options:
            raise InputError(
                f"{_where(trace, a)}: value {a.feedback.value!r} is not an LLM option of {question.id} {options}"
            )
        return {o: float(o == key) for o in options}
    try:
        given = json.loads(raw) if isinstance(raw, str) else dict(raw)
        dist = {option_key(k): float(v) for k, v in given.items()}
    except (TypeError, ValueError, AttributeError) as e:
        raise InputError(
            f"{_where(trace, a)}: metadata {DISTRIBUTION_KEY!r} is not a JSON object of probabilities ({e})"
        ) from None
    bad = [k for k, p in dist.items() if k not in options or not math.isfinite(p) or p < 0]
    if bad:
        raise InputError(
            f"{_where(trace, a)}: {DISTRIBUTION_KEY} option {bad[0]!r} is not an LLM option of {question.id} {options} or its probability is not >= 0"
        )
    return {o: dist.get(o, 0.0) for o in options}


def _annotations(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["text_id", "judge_id", "question_id", "answer"])


def _features(blocks: dict) -> pd.DataFrame:
    rows = [(t, s, q, option, p) for (t, s, q), dist in blocks.items() for option, p in dist.items()]
    return pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"])
