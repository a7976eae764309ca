"""The labelling loop in MLflow: a review queue of the texts to label, a label schema per rubric question.

:func:`queue_texts` creates (or reuses) one ``feedback`` label schema per rubric question (name: the
question id, the assessment name reviewers' answers are stored under; a single-choice input of the
question's option labels, or keys where a label is too long; the prompt as the instruction) and a custom review queue with those schemas,
and attaches the chosen traces. Reviewers' answers are ``HUMAN`` feedback on the traces, read back by
``llmrubric import mlflow --queue``. Review queues and label schemas are in MLflow's tracking store
(SQL stores and servers, MLflow >= 3.14); on Databricks they route to its review app instead.
"""

from __future__ import annotations

from mlflow.exceptions import MlflowException
from mlflow.genai import label_schemas, review_queues

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Question, Rubric

PAGE = 500
MAX_OPTION_CHARS = 64  # MLflow's limit on an InputCategorical option


def schema_options(question: Question) -> list[str]:
    """The choices a reviewer sees: the option labels, or the option keys where labels repeat or are longer
    than MLflow allows (the labels are then in the instruction, :func:`schema_instruction`)."""
    labels = [o.label.strip() for o in question.options]
    fits = len(set(labels)) == len(labels) and max(map(len, labels)) <= MAX_OPTION_CHARS
    return labels if fits else list(question.keys)


def schema_instruction(question: Question) -> str:
    """The question's prompt, with the scale (key: label) where the choices are the option keys."""
    if schema_options(question) != list(question.keys) or all(o.label.strip() == o.key for o in question.options):
        return question.prompt
    return question.prompt + "\n" + "\n".join(f"{o.key}: {o.label.strip()}" for o in question.options)


def rubric_schemas(rubric: Rubric, experiment_id: str) -> list[str]:
    """The ids of one label schema per rubric question in ``experiment_id`` (created where absent)."""
    ids = []
    for q in rubric.questions:
        try:
            schema = label_schemas.get_label_schema(q.id, experiment_id=experiment_id)
        except MlflowException:
            schema = label_schemas.create_label_schema(
                q.id,
                type="feedback",
                input=label_schemas.InputCategorical(options=schema_options(q)),
                instruction=schema_instruction(q),
                experiment_id=experiment_id,
            )
        else:
            if list(getattr(schema.input, "options", [])) != schema_options(q):
                raise InputError(
                    f"label schema {q.id!r} of experiment {experiment_id} offers {getattr(schema.input, 'options', None)}, "
                    f"not the rubric's {schema_options(q)}",
                    setting="--queue",
                )
        ids.append(schema.schema_id)
    return ids


def queue_texts(
    experiment_id: str, queue: str, rubric: Rubric, trace_ids: list[str], users: list[str] | None = None
) -> str:
    """Attach ``trace_ids`` to the review queue ``queue`` of ``experiment_id`` (created with the rubric's
    label schemas where absent); returns the queue id."""
    schema_ids = rubric_schemas(rubric, experiment_id)
    try:
        found = review_queues.get_review_queue(name=queue, experiment_id=experiment_id)
    except MlflowException:
        found = review_queues.create_review_queue(
            queue, queue_type="custom", users=users or [], schema_ids=schema_ids, experiment_id=experiment_id
        )
    review_queues.add_items_to_review_queue(found.queue_id, item_ids=list(trace_ids))
    return found.queue_id


def queue_trace_ids(experiment_id: str, queue: str) -> list[str]:
    """The trace ids attached to the review queue ``queue`` of ``experiment_id``; an error if it has none."""
    try:
        found = review_queues.get_review_queue(name=queue, experiment_id=experiment_id)
    except MlflowException:
        raise InputError(f"experiment {experiment_id} has no review queue {queue!r}", setting="--queue") from None
    ids, token = [], None
    while True:
        page = review_queues.list_review_queue_items(found.queue_id, max_results=PAGE, page_token=token)
        ids += [item.item_id for item in page]
        token = page.token
        if not token:
            return ids
