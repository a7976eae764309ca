"""What an extraction would cost, before any request (``extract features --dry-run``; docs/extract.md, "Cost"):
requests, prompt tokens and output tokens of a source's tasks in its mode, and their price.

Prompt tokens are counted by a tokenizer where one is given (``tokenizer:``, or the transformers backend's model),
through its chat template on the chat endpoint as the server applies it, else estimated at
:data:`CHARS_PER_TOKEN` characters a token (said so in the plan). Output tokens and the sampling modes' requests
are upper bounds: a block asks at most ``ceil(samples / samples_per_request)`` requests of at most ``max_tokens``
tokens per answer (fewer with a ``tolerance``); a verbalized block asks 1 request, 2 with its retry. With
``context_tokens`` (the judge's context window) the prompts whose tokens plus their output budget exceed it are
counted: those requests fail (or, on llama.cpp's server, get a shortened answer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from llmrubric.extract.backends.generation import ModeSettings, mode_prompt
from llmrubric.extract.tasks import Task
from llmrubric.io.errors import InputError

CHARS_PER_TOKEN = 4.0
MODE_KEYS = ("samples", "samples_per_request", "tolerance", "temperature", "max_tokens", "sum_tolerance", "seed")


class TokenCounter:
    """A prompt's tokens as the model reads it: ``chat`` wraps it as a user message (after the ``system``
    prompt) with the tokenizer's chat template and the generation prompt; else the plain text with special tokens."""

    def __init__(self, tokenizer, chat: bool, system: str | None = None):
        self.tokenizer, self.chat, self.system = (
            tokenizer,
            chat and bool(getattr(tokenizer, "chat_template", None)),
            system,
        )

    def __call__(self, prompt: str) -> int:
        if self.chat:
            messages = ([{"role": "system", "content": self.system}] if self.system else []) + [
                {"role": "user", "content": prompt}
            ]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return len(self.tokenizer(prompt)["input_ids"])


def load_tokenizer(path: str | Path):
    """The tokenizer of a local model (HF folder or .gguf file, as ``--model``), as the extractor builds it
    (a GGUF's digits-first split: :func:`llmrubric.extract.models.split_digits_first`)."""
    import transformers

    from llmrubric.extract.models import gguf_pre_tokenizer, resolve, split_digits_first

    files = resolve(path)
    kwargs = {"gguf_file": files.gguf_file} if files.gguf_file else {}
    tokenizer = transformers.AutoTokenizer.from_pretrained(files.folder, **kwargs)
    split_digits_first(tokenizer, gguf_pre_tokenizer(files))
    return tokenizer


def check_price(price: dict | None) -> None:
    """Prices come as a pair (``price.prompt`` and ``price.output`` both, or neither), each a number >= 0 per
    million tokens: an InputError naming the setting otherwise."""
    price = price or {}
    given = {k: price.get(k) for k in ("prompt", "output") if price.get(k) is not None}
    if len(given) == 1:
        (have,), missing = given, ({"prompt", "output"} - set(given)).pop()
        raise InputError(
            f"extract setting price.{have} is given without price.{missing}: give both (0 where a kind of token is "
            "free), or neither"
        )
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(
                f"extract setting price.{key}: {value!r} is not allowed (a number >= 0 per million tokens)"
            )


def requests_per_block(mode: ModeSettings, server: bool) -> tuple[int, int]:
    """(requests, output tokens) a block asks at most."""
    if mode.mode == "logprob":
        return 1, int(server)
    if mode.mode == "verbalized":
        return 2, 2 * mode.budget
    return math.ceil(mode.samples / mode.samples_per_request), mode.samples * mode.budget


def over_context(per_request: Sequence[int], output: int, context: int | None, requests: int = 1) -> dict:
    """The longest prompt, and with a ``context`` window how many prompts plus ``output`` tokens exceed it and the
    prompt tokens of their ``requests`` each (in ``prompt_tokens``, though a server refuses them unpaid)."""
    figures = {"longest_prompt_tokens": max(per_request, default=0)}
    if context is not None:
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise InputError(f"extract setting context_tokens: {context!r} is not a whole number >= 1")
        over = [n for n in per_request if n + output > context]
        figures["context_tokens"] = context
        figures["prompts_over_context"] = len(over)
        figures["prompt_tokens_over_context"] = sum(over) * requests
    return figures


def plan(tasks: Sequence[Task], settings: dict, counter: TokenCounter | None, cached: int = 0) -> dict:
    """The dry run's figures for the ``tasks`` to ask under the extract ``settings`` (their mode, prices and
    endpoint); ``cached``: the prompts the cache already holds, which cost nothing."""
    mode = ModeSettings(
        settings.get("mode") or "logprob", **{k: settings[k] for k in MODE_KEYS if settings.get(k) is not None}
    )
    server = settings["backend"] == "openai"
    requests, output = requests_per_block(mode, server)
    prompts = [mode_prompt(t, mode.mode) for t in tasks]
    per_request = [counter(p) if counter else math.ceil(len(p) / CHARS_PER_TOKEN) for p in prompts]
    first = sum(per_request)
    price = settings.get("price") or {}
    fixed = requests if mode.mode in ("sampled", "reasoned") else 1  # without an early stop or a retry
    figures = {
        "mode": mode.mode,
        "blocks": len(tasks),
        "cached": cached,
        "requests": fixed * len(tasks),
        "requests_at_most": requests * len(tasks),
        "prompt_tokens": first * fixed,
        "prompt_tokens_at_most": first * requests,
        "prompt_tokens_counted_by": "tokenizer" if counter else f"estimate: {CHARS_PER_TOKEN:g} characters a token",
        **over_context(
            per_request, mode.budget if mode.mode != "logprob" else output, settings.get("context_tokens"), fixed
        ),
        "output_tokens_at_most": output * len(tasks),
    }
    if mode.mode == "logprob" and settings.get("endpoint") == "completions" and settings.get("whitespace_continuation"):
        figures["note"] = "completions with whitespace_continuation: some blocks ask one more request"
    check_price(price)
    if price.get("prompt") is not None:
        p, o = float(price["prompt"]), float(price["output"])
        figures["cost_at_most"] = (figures["prompt_tokens_at_most"] * p + figures["output_tokens_at_most"] * o) / 1e6
        figures["cost_prompt_tokens"] = figures["prompt_tokens"] * p / 1e6
        figures["price_per_million"] = {"prompt": p, "output": o}
    return figures
