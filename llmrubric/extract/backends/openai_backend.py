"""OpenAI-compatible servers (OpenAI, Azure OpenAI, vLLM): answer distributions from the
logprobs of the first generated token.

For each task one request asks for one token with ``top_logprobs``; the probability of a
label is the mass of the returned tokens that (stripped) begin that label and no other.
A label no returned token points to has unknown mass (it is below the smallest returned
probability): it is recorded as None and the result is ``incomplete``, never set to 0.
For a multi-token label the first token stands for the label (an upper bound of the full
continuation) — servers return no continuation scores through this API.
Rate limits (429), server errors (5xx) and timeouts are retried with exponential back-off
(honouring ``Retry-After``); a request that still fails is a ``failed`` result with its reason.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from llmrubric.errors import InputError
from llmrubric.extract.backends.base import Backend
from llmrubric.extract.tasks import Result, Task

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def map_top_logprobs(top: dict[str, float], labels: Sequence[str]) -> tuple[list[float | None], str]:
    """Label probabilities from one position's top logprobs; None where unknown, with why."""
    mass = [0.0] * len(labels)
    seen = [False] * len(labels)
    ambiguous = set()
    for token, logprob in top.items():
        text = token.strip()
        if not text:
            continue
        hits = [i for i, label in enumerate(labels) if label.startswith(text)]
        if len(hits) == 1:
            mass[hits[0]] += math.exp(logprob)
            seen[hits[0]] = True
        elif len(hits) > 1:
            ambiguous.update(hits)
    floor = math.exp(min(top.values())) if top else 1.0
    probs: list[float | None] = []
    unknown = []
    for i, label in enumerate(labels):
        if i in ambiguous or not seen[i]:
            probs.append(None)
            unknown.append(label)
        else:
            probs.append(mass[i])
    reason = ""
    if unknown:
        reason = f"mass unknown for {unknown}: absent from the {len(top)} top logprobs (each below {floor:.3g}) or ambiguous"
    return probs, reason


class OpenAIBackend(Backend):
    """Client for ``/chat/completions`` or ``/completions`` with logprobs.

    Args:
        model: model (or Azure deployment) name.
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1`` (vLLM).
        endpoint: ``chat`` or ``completions``.
        api_key_env: environment variable holding the key (none needed for a local server).
        azure_api_version: set for Azure: deployment URLs, ``api-key`` header.
        top_logprobs: how many alternatives to request (OpenAI allows up to 20).
        concurrency: requests in flight; max_retries, timeout, backoff, max_backoff: seconds.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        endpoint: str = "chat",
        api_key_env: str = "OPENAI_API_KEY",
        azure_api_version: str | None = None,
        top_logprobs: int = 20,
        concurrency: int = 4,
        max_retries: int = 5,
        timeout: float = 60.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        system_prompt: str | None = None,
    ):
        if endpoint not in ("chat", "completions"):
            raise InputError(f"endpoint must be 'chat' or 'completions', not {endpoint!r}")
        self.model, self.base_url, self.endpoint = model, base_url.rstrip("/"), endpoint
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self.azure_api_version = azure_api_version
        self.top_logprobs, self.concurrency = int(top_logprobs), max(1, int(concurrency))
        self.max_retries, self.timeout = int(max_retries), float(timeout)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.system_prompt = system_prompt
        self.stats = {"requests": 0, "retries": 0}

    @property
    def model_id(self) -> str:
        return f"openai:{self.base_url}|{self.model}|{self.endpoint}|top{self.top_logprobs}|sys={self.system_prompt!r}"

    def _url(self) -> str:
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        if self.azure_api_version:
            return f"{self.base_url}/openai/deployments/{self.model}/{path}?api-version={self.azure_api_version}"
        return f"{self.base_url}/{path}"

    def _body(self, prompt: str) -> dict:
        body = {"model": self.model, "max_tokens": 1, "temperature": 0}
        if self.endpoint == "chat":
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [{"role": "user", "content": prompt}]
            body.update(messages=messages, logprobs=True, top_logprobs=self.top_logprobs)
        else:
            body.update(prompt=prompt, logprobs=self.top_logprobs)
        return body

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["api-key" if self.azure_api_version else "Authorization"] = self.api_key if self.azure_api_version else f"Bearer {self.api_key}"
        request = urllib.request.Request(self._url(), data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read())

    def _top(self, response: dict) -> dict[str, float]:
        choice = response["choices"][0]
        if self.endpoint == "chat":
            entries = choice["logprobs"]["content"][0]["top_logprobs"]
            top: dict[str, float] = {}
            for e in entries:
                top[e["token"]] = max(top.get(e["token"], -math.inf), e["logprob"])
            return top
        return dict(choice["logprobs"]["top_logprobs"][0])

    def request(self, task: Task) -> Result:
        """One task, with retries; never raises for a server or network failure."""
        body = self._body(task.prompt)
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats["retries"] += 1
            self.stats["requests"] += 1
            wait = None
            try:
                response = self._post(body)
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode(errors="replace")
                last = f"HTTP {e.code}: {detail}"
                if e.code not in RETRY_STATUS:
                    return Result(task, None, "failed", last)
                retry_after = e.headers.get("Retry-After") if e.headers else None
                wait = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            else:
                try:
                    top = self._top(response)
                except (KeyError, IndexError, TypeError) as e:
                    return Result(task, None, "failed", f"response without logprobs ({type(e).__name__}: {e})")
                probs, reason = map_top_logprobs(top, task.labels)
                tokens = int(response.get("usage", {}).get("prompt_tokens", 0))
                status = "incomplete" if reason else "ok"
                return Result(task, dict(zip(task.options, probs)), status, reason, tokens, tokens)
            if attempt < self.max_retries:
                delay = min(self.max_backoff, wait if wait is not None else self.backoff * 2**attempt)
                log.debug("task %s/%s: %s; retry in %.1fs", task.text_id, task.question_id, last, delay)
                time.sleep(delay)
        return Result(task, None, "failed", f"{last} (after {self.max_retries + 1} attempts)")

    def score(self, tasks: Sequence[Task]) -> Iterator[Result]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            futures = [pool.submit(self.request, t) for t in tasks]
            for future in as_completed(futures):
                yield future.result()

    def generate(self, prompt: str, max_tokens: int = 512) -> str:
        """Greedy text completion (test-bank generation); raises InputError on failure."""
        body = self._body(prompt)
        body.update(max_tokens=max_tokens)
        body.pop("logprobs", None), body.pop("top_logprobs", None)
        try:
            response = self._post(body)
        except (urllib.error.URLError, socket.timeout, TimeoutError) as e:
            raise InputError(f"generation request to {self._url()} failed: {e}") from e
        choice = response["choices"][0]
        return choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
