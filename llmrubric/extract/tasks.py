"""What the extractor asks and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    """One prompt whose next-token distribution over ``labels`` is wanted.

    ``group`` names the texts whose prompts share a prefix (one text, or one passage for
    test-bank items); ``options`` are the option keys written to the features table and
    ``labels`` the strings the model is asked to produce, in the same order.
    ``text`` is the long variable that appears verbatim in the prompt (a too-long prompt
    is truncated inside it); ``key`` hashes the prompt and labels (the cache key).
    ``attempt`` counts the earlier runs that read the block to no result (its requests' seeds count it, so a
    rerun draws new answers); ``resume`` is the record of a block cut short (Ctrl-C, a server down), whose
    answers a rerun keeps and completes. Neither is part of the key.
    """

    text_id: str
    question_id: str
    prompt: str
    options: tuple[str, ...]
    labels: tuple[str, ...]
    group: str
    template_hash: str
    key: str = ""
    text: str = field(default="", compare=False, repr=False)
    attempt: int = field(default=0, compare=False)
    resume: dict | None = field(default=None, compare=False, repr=False)


@dataclass
class Result:
    """The answer to one task.

    ``probs`` maps option key → probability, or → None where the mass is unknown (an
    option absent from an API's top logprobs). ``status`` is ``ok``, ``incomplete``
    (some mass unknown) or ``failed`` (``probs`` is None and ``reason`` says why); the modes without
    logprobs add ``unparseable``, ``invalid_json`` and ``timeout`` (docs/extract.md). ``detail`` holds a
    sampled, verbalized or reasoned block's record: answer counts, ``samples``, per-answer statuses,
    requests, output tokens and the raw answers (kept in the cache for inspection).
    """

    task: Task
    probs: dict[str, float | None] | None
    status: str = "ok"
    reason: str = ""
    prompt_tokens: int = 0
    computed_tokens: int = 0
    warning: str = ""
    detail: dict = field(default_factory=dict)
