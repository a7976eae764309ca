"""Answer distributions read from generated text, for servers without token logprobs (docs/extract.md,
"Modes without logprobs"): ``sampled`` (k answers at a temperature, counted), ``verbalized`` (one JSON object of
probabilities, checked and renormalised; one retry) and ``reasoned`` (k reasonings, each ending with a final
answer line, counted). Sampling goes in rounds of ``samples_per_request`` answers (the server's ``n``) until
``samples`` answers were drawn or, with a ``tolerance``, the block has answers in proportion to their spread
(:func:`llmrubric.extract.adaptive_stop.needs_more`); unparseable answers count towards ``samples``, so a judge
that never parses stops too. Each answer's status (:mod:`llmrubric.extract.answers`) is counted in the result's
``detail``, which also keeps the raw answers (the reasonings) in the cache.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from llmrubric.extract.adaptive_stop import needs_more, option_values
from llmrubric.extract.answers import choose, final_answer, refused, verbalized
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError

MODES = ("logprob", "sampled", "verbalized", "reasoned")
MAX_TOKENS = {"sampled": 8, "verbalized": 200, "reasoned": 512}  # a mode's default output budget per answer
STRUCTURED = ("json_schema", "json_object", "none")
KEPT_CHARACTERS = 4000  # of each raw answer in the cache
RANGES = {  # what each mode setting allows, as its error says
    "mode": " | ".join(MODES),
    "samples": "a whole number >= 1",
    "samples_per_request": "a whole number >= 1",
    "tolerance": "a number with 0 < tolerance < 1, or null",
    "temperature": "a number >= 0, or null",
    "max_tokens": "a whole number >= 1, or null",
    "sum_tolerance": "a number >= 0",
    "structured_output": " | ".join(STRUCTURED),
    "seed": "a whole number >= 0",
    "tolerance_weights": "weights >= 0, with a tolerance",
}


def whole(value, low: int) -> bool:
    """Whether ``value`` is a whole number (no bool) at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def number(value, low: float, high: float = math.inf, open_low: bool = False, open_high: bool = False) -> bool:
    """Whether ``value`` is a finite number (no bool) within ``low``..``high`` (bounds excluded where open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > low if open_low else value >= low) and (value < high if open_high else value <= high)


@dataclass(frozen=True)
class ModeSettings:
    """How a block is read (the extract settings of the same names; ``conf/extract/openai.yaml``).
    ``tolerance_weights``: question_id → its weight in the score (``extract weights``, the run's source's): a
    block's tolerance is ``tolerance / weight``; a question without one weighs 1."""

    mode: str = "logprob"
    samples: int = 10
    samples_per_request: int = 5
    tolerance: float | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    sum_tolerance: float = 0.1
    structured_output: str = "json_schema"
    seed: int = 0
    tolerance_weights: tuple[tuple[str, float], ...] | None = None

    def __post_init__(self):
        weights = self.tolerance_weights
        if weights is not None and not isinstance(weights, (Mapping, tuple)):
            raise InputError(
                f"extract setting tolerance_weights: {weights!r} is a file that extract features reads for its source"
            )
        if isinstance(weights, Mapping):
            weights = tuple(sorted((str(q), float(w)) for q, w in weights.items()))
            object.__setattr__(self, "tolerance_weights", weights)
        checks = {
            "mode": self.mode in MODES,
            "samples": whole(self.samples, 1),
            "samples_per_request": whole(self.samples_per_request, 1),
            "tolerance": self.tolerance is None or number(self.tolerance, 0, 1, open_low=True, open_high=True),
            "temperature": self.temperature is None or number(self.temperature, 0),
            "max_tokens": self.max_tokens is None or whole(self.max_tokens, 1),
            "sum_tolerance": number(self.sum_tolerance, 0),
            "structured_output": self.structured_output in STRUCTURED,
            "seed": whole(self.seed, 0),
            "tolerance_weights": weights is None or (self.tolerance is not None and all(w >= 0 for _, w in weights)),
        }
        for key, ok in checks.items():
            if not ok:
                raise InputError(f"extract setting {key}: {getattr(self, key)!r} is not allowed ({RANGES[key]})")

    def block_tolerance(self, question_id: str) -> float | None:
        """The tolerance of the question's blocks: ``tolerance / weight`` (infinite for weight 0: the block stops
        at :data:`~llmrubric.extract.adaptive_stop.MIN_SAMPLES` answers); None without a tolerance."""
        if self.tolerance is None or self.tolerance_weights is None:
            return self.tolerance
        weight = dict(self.tolerance_weights).get(question_id, 1.0)
        return float(self.tolerance) / weight if weight > 0 else math.inf

    @property
    def budget(self) -> int:
        return int(self.max_tokens or MAX_TOKENS.get(self.mode, 1))

    @property
    def heat(self) -> float:
        """The temperature: given, else 1 for the sampling modes and 0 for verbalized."""
        return float(self.temperature if self.temperature is not None else (0.0 if self.mode == "verbalized" else 1.0))

    def key(self) -> str:
        """What enters the cache key: every setting that changes an answer, and the instruction's template hash."""
        if self.mode == "logprob":
            return ""
        used = {k: v for k, v in asdict(self).items() if k not in ("max_tokens", "temperature")}
        if self.tolerance_weights is None:
            used.pop("tolerance_weights")  # the keys of runs without weights stay as they were
        if self.tolerance is not None:
            used["stop"] = "spread"  # the adaptive stop's rule (adaptive_stop.needs_more)
        if self.mode != "verbalized":
            used.pop("sum_tolerance"), used.pop("structured_output")
        instruction = f"|{instruction_template(self.mode).hash}" if self.mode != "sampled" else ""
        return f"|{json.dumps(used, sort_keys=True)}|T={self.heat:g}|max_tokens={self.budget}{instruction}"


def failure_status(error: str) -> str:
    """The status of a block whose request got no answer: ``timeout``, ``server_down``, ``interrupted`` (by the
    start of the error, :class:`~llmrubric.extract.backends.openai_backend.EndpointPool`), else ``failed``."""
    for prefix, status in (("timeout:", "timeout"), ("server down:", "server_down"), ("interrupted:", "interrupted")):
        if error.startswith(prefix):
            return status
    return "failed"


def instruction_template(mode: str) -> PromptTemplate:
    """The instruction a mode adds after the family's prompt (``conf/prompts/mode_<mode>.j2``)."""
    return PromptTemplate(f"mode_{mode}")


def mode_prompt(task: Task, mode: str) -> str:
    """The prompt of ``task`` in ``mode``: the family's prompt (the text first, so a server caches the prefix
    across a block's requests), then the mode's instruction."""
    if mode in ("logprob", "sampled"):
        return task.prompt
    example = "{" + ", ".join(f'"{label}": <probability of {label}>' for label in task.labels) + "}"
    return task.prompt + "\n\n" + instruction_template(mode).render(labels=list(task.labels), example=example)


def request_seed(seed: int, task: Task, request: int) -> int:
    """A reproducible seed per (block, attempt, request): two requests of a block never share one, nor do the
    requests of a rerun that asks a block again (``task.attempt``)."""
    attempt = f"|attempt{task.attempt}" if task.attempt else ""  # a first attempt's seeds as they always were
    digest = hashlib.sha256(f"{seed}|{task.key}|{task.question_id}|{request}{attempt}".encode()).hexdigest()
    return int(digest[:8], 16)


def answer_schema(labels) -> dict:
    """A number per label, every label required (no ``minimum``/``maximum``: not every strict structured output
    takes them; :func:`llmrubric.extract.answers.verbalized` checks the values)."""
    return {
        "type": "object",
        "properties": {label: {"type": "number"} for label in labels},
        "required": list(labels),
        "additionalProperties": False,
    }


def response_format(kind: str, labels) -> dict | None:
    """OpenAI's ``json_schema`` structured output, the ``json_object`` form with a ``schema`` (llama.cpp's
    server turns it into a grammar), or none."""
    if kind == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": "answer_probabilities", "strict": True, "schema": answer_schema(labels)},
        }
    if kind == "json_object":
        return {"type": "json_object", "schema": answer_schema(labels)}
    return None


def choice_text(choice: dict) -> tuple[str, str]:
    """(the answer's text, its reasoning where the server returns one apart: ``reasoning_content``)."""
    if "message" in choice:
        message = choice.get("message") or {}
        return message.get("content") or "", message.get("reasoning_content") or message.get("reasoning") or ""
    return choice.get("text") or "", ""


class ModeReader:
    """Reads one task in a mode through an :class:`~llmrubric.extract.backends.openai_backend.OpenAIBackend`
    (its ``send``, with retries on the endpoint pool, and its request ``body``)."""

    def __init__(self, backend, settings: ModeSettings):
        self.backend, self.settings = backend, settings

    def body(self, prompt: str, n: int, temperature: float, seed: int, fmt: dict | None = None) -> dict:
        b = self.backend
        body = {"model": b.model, "max_tokens": self.settings.budget, "temperature": temperature, "seed": seed}
        if n > 1:
            body["n"] = n
        if b.endpoint == "chat":
            system = [{"role": "system", "content": b.system_prompt}] if b.system_prompt else []
            body["messages"] = system + [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if fmt is not None:
            body["response_format"] = fmt
        return body

    def read(self, task: Task) -> Result:
        if self.settings.mode == "verbalized":
            return self.read_verbalized(task)
        return self.read_sampled(task)

    def failed(self, task: Task, error: str, detail: dict) -> Result:
        """A block cut short by a request without an answer: its record so far, ``partial`` (a rerun resumes it)."""
        detail = {**detail, "partial": True}
        return Result(
            task, None, failure_status(error), error, detail["prompt_tokens"], detail["prompt_tokens"], detail=detail
        )

    def start(self, task: Task) -> dict:
        """A block's record: empty, or the one of the earlier run that was cut short (``task.resume``)."""
        earlier = task.resume or {}
        detail = {"mode": self.settings.mode, "attempt": task.attempt}
        for key in ("requests", "prompt_tokens", "output_tokens", "drawn"):
            detail[key] = int(earlier.get(key, 0))
        detail.update(statuses=dict(earlier.get("statuses", {})), answers=list(earlier.get("answers", [])))
        detail["counts"] = {o: int(earlier.get("counts", {}).get(o, 0)) for o in task.options}
        return detail

    def sample_status(self, choice: dict, labels) -> tuple[int | None, str, str]:
        """(the option's index or None, the answer's status, the raw text kept)."""
        text, reasoning = choice_text(choice)
        kept = (reasoning + "\n" + text if reasoning else text)[:KEPT_CHARACTERS]
        if refused(choice):
            return None, "refusal", kept
        if self.settings.mode == "reasoned":
            if choice.get("finish_reason") == "length":
                return None, "truncated_reasoning", kept
            text = final_answer(text)
        index, status = choose(text, labels)
        return index, status, kept

    def read_sampled(self, task: Task) -> Result:
        """Rounds of answers until ``samples`` were drawn or the adaptive stop at the block's tolerance
        (:meth:`ModeSettings.block_tolerance`) says enough (from the answers of a block cut short, if resumed)."""
        s, prompt = self.settings, mode_prompt(task, self.settings.mode)
        detail = self.start(task)
        counts, statuses = [detail["counts"][o] for o in task.options], Counter(detail["statuses"])
        drawn, values, tolerance = detail["drawn"], option_values(task.options), s.block_tolerance(task.question_id)
        while drawn < s.samples and (tolerance is None or needs_more(counts, tolerance, s.samples, values)):
            n = min(s.samples_per_request, s.samples - drawn)
            response, error = self.backend.send(task, self.body(prompt, n, s.heat, request_seed(s.seed, task, drawn)))
            if response is None:
                counted = {"counts": dict(zip(task.options, counts)), "statuses": dict(statuses), "drawn": drawn}
                return self.failed(task, error, {**detail, **counted})
            add_usage(detail, response)
            choices = (response.get("choices") or [])[:n]
            for choice in choices:
                index, status, kept = self.sample_status(choice, task.labels)
                statuses[status] += 1
                detail["answers"].append(kept)
                if index is not None:
                    counts[index] += 1
            if not choices:  # an answer without choices is one unparseable answer
                statuses["unparseable"] += 1
            drawn += max(1, len(choices))  # a server that ignores n returns one answer a request
        parsed = sum(counts)
        detail.update(samples=parsed, counts=dict(zip(task.options, counts)), statuses=dict(statuses), drawn=drawn)
        if not parsed:
            worst = max((k for k in statuses if k != "parsed"), key=statuses.get)
            return Result(
                task,
                None,
                worst,
                f"none of the {drawn} answers names an option ({dict(statuses)})",
                detail["prompt_tokens"],
                detail["prompt_tokens"],
                detail=detail,
            )
        probs = {o: c / parsed for o, c in zip(task.options, counts)}
        return Result(task, probs, "ok", "", detail["prompt_tokens"], detail["prompt_tokens"], detail=detail)

    def read_verbalized(self, task: Task) -> Result:
        """One request for a JSON object of probabilities; one retry (greedy answers are redrawn at temperature 1),
        then the block is absent with the last answer's status. A rerun (``task.attempt``) draws both at
        temperature 1 where the first was greedy (that answer is known); a resumed block keeps its first answer."""
        s, prompt = self.settings, mode_prompt(task, "verbalized")
        fmt = response_format(s.structured_output, task.labels)
        detail = self.start(task)
        detail.pop("counts"), detail.pop("drawn")
        statuses, answers = Counter(detail["statuses"]), detail["answers"]
        status = "invalid_json"
        for request in range(len(answers), 2):
            heat = s.heat if (request == 0 and not task.attempt) or s.heat > 0 else 1.0
            response, error = self.backend.send(
                task, self.body(prompt, 1, heat, request_seed(s.seed, task, request), fmt)
            )
            if response is None:
                return self.failed(task, error, {**detail, "statuses": dict(statuses)})
            add_usage(detail, response)
            choice = (response.get("choices") or [{}])[0]
            text = choice_text(choice)[0]
            answers.append(text[:KEPT_CHARACTERS])
            probs, status = (None, "refusal") if refused(choice) else verbalized(text, task.labels, s.sum_tolerance)
            statuses[status] += 1
            if probs is not None:
                detail.update(statuses=dict(statuses))
                return Result(
                    task,
                    dict(zip(task.options, probs)),
                    "ok",
                    "",
                    detail["prompt_tokens"],
                    detail["prompt_tokens"],
                    detail=detail,
                )
        detail.update(statuses=dict(statuses))
        reason = f"no valid distribution in 2 answers ({dict(statuses)}; sum_tolerance {s.sum_tolerance:g})"
        return Result(task, None, status, reason, detail["prompt_tokens"], detail["prompt_tokens"], detail=detail)


def add_usage(detail: dict, response: dict) -> None:
    usage = response.get("usage") or {}
    detail["requests"] += 1
    detail["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
    detail["output_tokens"] += int(usage.get("completion_tokens") or 0)
