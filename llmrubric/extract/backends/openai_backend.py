"""OpenAI-compatible servers (OpenAI, Azure OpenAI, vLLM): answer distributions from the
logprobs of the first generated token.

For each task one request asks for one token with ``top_logprobs``; the probability of a
label is the mass of the returned tokens that (stripped) begin that label and no other, so
``"1"`` and ``" 1"`` both count for label ``1``. A label no returned token points to has
unknown mass (it is below the smallest returned probability): it is recorded as None and the
result is ``incomplete``, never set to 0. For a multi-token label the first token stands for
the label (an upper bound of the full continuation) — servers return no continuation scores
through this API. On the completions endpoint a whitespace-only token among the returned ones
with probability at least ``whitespace_min_prob`` (tokenizers that spell ``" 1"`` as ``" "`` +
``"1"``, e.g. SmolLM2's) is followed: the prompt plus that token is asked once more and its
labels' mass, times the token's probability, is added (``whitespace_continuation``). The protocols of real servers: ``docs/extract.md``.

``base_url`` may list several replicas of one model (e.g. vLLM servers): each request goes
to the live endpoint with the fewest requests in flight, at most ``concurrency`` per endpoint
(:class:`EndpointPool`). Rate limits (429), server errors (5xx), dropped connections and
timeouts are retried with exponential back-off and jitter (honouring ``Retry-After``), on
another endpoint where one is free; an endpoint failing ``pause_after`` times in a row is
paused (``pause`` seconds, doubling while it keeps failing) and then probed with one request.
A request that still fails is a ``failed`` result with its reason (retried on the next run). When no endpoint has
answered for ``down_after`` seconds while requests fail, the server is down: every request not yet answered ends at
once as a ``server_down`` result (a request in flight first gets its ``timeout``). :meth:`OpenAIBackend.stop` (Ctrl-C)
sends nothing more: the requests in flight are answered, the rest end as ``interrupted``.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from llmrubric.extract.backends.base import Backend
from llmrubric.extract.backends.generation import ModeReader, ModeSettings, failure_status, number, whole
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def _label_mass(top: dict[str, float], labels: Sequence[str]) -> tuple[list[float], list[bool], set[int]]:
    """Per label: the mass of the returned tokens that (stripped) begin it and no other label, whether
    any did; and the labels a returned token begins along with another one (ambiguous)."""
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
    return mass, seen, ambiguous


def map_top_logprobs(top: dict[str, float], labels: Sequence[str]) -> tuple[list[float | None], str]:
    """Label probabilities from one position's top logprobs; None where unknown, with why."""
    return combine([(1.0, top, "")], labels)


def combine(
    parts: Sequence[tuple[float, dict[str, float], str]], labels: Sequence[str]
) -> tuple[list[float | None], str]:
    """Label probabilities from one or several positions: ``(weight, top logprobs, what)`` each (the
    first token; then each followed whitespace token, its probability the weight). A label's mass is
    the weighted sum over the parts that returned it (a part that did not adds less than its weight
    times its smallest returned probability); None where no part returned it or a token is ambiguous."""
    total = [0.0] * len(labels)
    seen = [False] * len(labels)
    ambiguous: set[int] = set()
    for weight, top, _ in parts:
        mass, hit, both = _label_mass(top, labels)
        total = [t + weight * m for t, m in zip(total, mass)]
        seen = [a or b for a, b in zip(seen, hit)]
        ambiguous |= both
    unknown = [i for i in range(len(labels)) if not seen[i] or i in ambiguous]
    if not unknown:
        return list(total), ""
    top = parts[0][1]
    floor = math.exp(min(top.values())) if top else 1.0
    after = "".join(f" or {what}" for _, _, what in parts[1:])
    reason = (
        f"mass unknown for {[labels[i] for i in unknown]}: absent from the {len(top)} top logprobs (each below "
        f"{floor:.3g}){after} or ambiguous"
    )
    return [None if i in unknown else total[i] for i in range(len(labels))], reason


def check_urls(base_url: str | Sequence[str]) -> list[str]:
    """The endpoint list: one or more distinct http(s) base URLs; InputError naming the bad one."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
        raise InputError("extract setting base_url: no endpoint given")
    out = []
    for i, url in enumerate(urls):
        where = "base_url" if isinstance(base_url, str) else f"base_url[{i}]"
        try:
            parts = urllib.parse.urlsplit(str(url))
            parts.port  # noqa: B018 (raises ValueError for a bad port)
        except ValueError as e:
            raise InputError(f"extract setting {where}: {url!r} is not a valid URL ({e})") from e
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(
                f"extract setting {where}: {url!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1"
            )
        out.append(str(url).rstrip("/"))
    if len(set(out)) != len(out):
        raise InputError(
            f"extract setting base_url: an endpoint is listed twice: {sorted({u for u in out if out.count(u) > 1})}"
        )
    return out


@dataclass
class Endpoint:
    """One server: its requests in flight, consecutive failures and pause."""

    url: str
    in_flight: int = 0
    sent: int = 0
    answered: int = 0
    failures: int = 0
    pauses: int = 0
    paused_until: float = 0.0
    throttled: bool = False  # paused by the server's Retry-After, not by failures


class EndpointPool:
    """Replicas of one model. :meth:`acquire` blocks until an endpoint is live (not paused) and
    below its ``limit`` of requests in flight, and returns the one with the fewest in flight;
    :meth:`release` records the outcome. ``pause_after`` failures in a row pause an endpoint for
    ``pause`` seconds, doubled at each further pause up to ``max_pause``; once the pause is over
    it takes one request at a time until one succeeds. :meth:`halted` says why nothing more is sent: no endpoint
    answered for ``down_after`` seconds while requests failed (the server is down), or :meth:`stop`."""

    def __init__(
        self,
        urls: Sequence[str],
        limit: int,
        pause_after: int = 3,
        pause: float = 10.0,
        max_pause: float = 300.0,
        down_after: float = 120.0,
    ):
        self.endpoints = [Endpoint(u) for u in urls]
        self.limit, self.pause_after, self.pause, self.max_pause = (
            max(1, int(limit)),
            max(1, int(pause_after)),
            float(pause),
            float(max_pause),
        )
        self.down_after = float(down_after)
        self.cond = threading.Condition()
        self.last_failure = ""
        self.last_answer = time.monotonic()  # of any endpoint (a Retry-After is an answer)
        self.failing = False  # a request failed since the last answer
        self.stopped = False
        self.interrupted: Callable[[], bool] = lambda: False  # Ctrl-C reached the process (Backend.watch)

    def start(self) -> None:
        """A run begins: its wait for a first answer starts now."""
        with self.cond:
            self.last_answer, self.failing = time.monotonic(), False

    def stop(self) -> None:
        """Send nothing more (Ctrl-C): every waiting request ends."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def check_reachable(self, timeout: float) -> None:
        """An InputError if no endpoint accepts a connection within ``timeout`` seconds; unreachable ones are paused."""
        down = {e.url: why for e in self.endpoints if (why := reachable(e.url, timeout))}
        if len(down) == len(self.endpoints):
            raise InputError(
                "extract setting base_url: no endpoint is reachable: "
                + "; ".join(f"{u} ({why})" for u, why in down.items())
            )
        for e in self.endpoints:
            if e.url in down:
                e.failures, e.paused_until = self.pause_after, time.monotonic() + self.pause
                log.warning("endpoint %s is unreachable (%s): paused for %.1f s", e.url, down[e.url], self.pause)

    def _down_in(self, now: float) -> float:
        """Seconds until the server counts as down (0: it is; infinite while nothing failed since an answer)."""
        return max(0.0, self.last_answer + self.down_after - now) if self.failing else math.inf

    def _stopped(self) -> bool:
        """Stopped, or Ctrl-C has reached the process (then stopped from now on); under :attr:`cond`."""
        self.stopped = self.stopped or self.interrupted()
        return self.stopped

    def halted(self) -> str:
        """'' while requests may be sent; else why not, starting ``interrupted:`` or ``server down:``."""
        with self.cond:
            if self._stopped():
                return "interrupted: stopped before this request was sent (Ctrl-C)"
            if self._down_in(time.monotonic()) == 0:
                return (
                    f"server down: no endpoint answered for {self.down_after:g} s (down_after) while requests failed "
                    f"(last: {self.last_failure})"
                )
            return ""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a retry's back-off), less when the pool halts meanwhile."""
        end = time.monotonic() + seconds
        with self.cond:
            while not self.stopped and (now := time.monotonic()) < end and self._down_in(now) > 0:
                self.cond.wait(min(end - now, self._down_in(now)))

    def _capacity(self, e: Endpoint) -> int:
        return 1 if e.failures >= self.pause_after else self.limit

    def acquire(self, avoid: Endpoint | None = None) -> Endpoint | None:
        """The live endpoint with the fewest requests in flight (another than ``avoid`` where one is
        free), waiting while all live ones are full or while a server asked to wait (Retry-After);
        None when every endpoint is paused after failing or the pool is :meth:`halted`."""
        with self.cond:
            while True:
                now = time.monotonic()
                if self._stopped() or self._down_in(now) == 0:
                    return None
                live = [e for e in self.endpoints if e.paused_until <= now]
                if not live and not any(e.throttled for e in self.endpoints):
                    return None
                free = [e for e in live if e.in_flight < self._capacity(e)]
                if free:
                    e = min(free, key=lambda e: (e is avoid, e.in_flight, e.sent))
                    e.in_flight += 1
                    e.sent += 1
                    return e
                waits = [e.paused_until - now for e in self.endpoints if e.paused_until > now] + [self._down_in(now)]
                self.cond.wait(min(waits) if min(waits) < math.inf else None)

    def release(self, e: Endpoint, ok: bool, retry_after: float | None = None, reason: str = "") -> None:
        """``ok``: the server answered (even with an error of the request); otherwise the endpoint
        failed. A ``Retry-After`` pauses it for that long without counting as a failure."""
        with self.cond:
            e.in_flight -= 1
            now = time.monotonic()
            if ok or retry_after is not None:
                self.last_answer, self.failing = now, False
            if ok:
                e.answered += 1
                e.failures = e.pauses = 0
                e.throttled = False
            elif retry_after is not None:
                e.paused_until = max(e.paused_until, now + retry_after)
                e.throttled = True
            else:
                self.last_failure, self.failing = reason, True
                e.failures += 1
                if e.failures >= self.pause_after and e.paused_until <= now:
                    seconds = min(self.max_pause, self.pause * 2**e.pauses)
                    e.pauses += 1
                    e.paused_until, e.throttled = now + seconds, False
                    log.warning(
                        "endpoint %s paused for %.1f s after %d failures in a row (last: %s)",
                        e.url,
                        seconds,
                        e.failures,
                        reason,
                    )
            self.cond.notify_all()


RANGES = {  # the pool's and requests' settings: (check, what it allows)
    "top_logprobs": (lambda v: whole(v, 1), "a whole number >= 1"),
    "concurrency": (lambda v: whole(v, 1), "a whole number >= 1"),
    "max_retries": (lambda v: whole(v, 0), "a whole number >= 0"),
    "timeout": (lambda v: number(v, 0, open_low=True), "seconds > 0"),
    "backoff": (lambda v: number(v, 0), "seconds >= 0"),
    "max_backoff": (lambda v: number(v, 0), "seconds >= 0"),
    "pause_after": (lambda v: whole(v, 1), "a whole number >= 1"),
    "pause": (lambda v: number(v, 0), "seconds >= 0"),
    "max_pause": (lambda v: number(v, 0), "seconds >= 0"),
    "down_after": (lambda v: number(v, 0, open_low=True), "seconds > 0"),
    "whitespace_min_prob": (lambda v: number(v, 0, 1), "a probability, 0 to 1"),
}


def check_ranges(**settings) -> None:
    """An InputError naming the first setting out of its range, and the range."""
    for key, value in settings.items():
        ok, allowed = RANGES[key]
        if not ok(value):
            raise InputError(f"extract setting {key}: {value!r} is not allowed ({allowed})")


def reachable(url: str, timeout: float = 5.0) -> str:
    """'' if a TCP connection to the URL's host and port opens, else why not."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
        return ""
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def first_top_logprobs(response: dict, endpoint: str) -> dict[str, float]:
    """The first answer token's top log-probabilities, by token (the best of a token listed twice)."""
    logprobs = response["choices"][0]["logprobs"]
    if endpoint == "chat" or "content" in logprobs:  # llama.cpp's server answers completions in chat's form
        top: dict[str, float] = {}
        for e in logprobs["content"][0]["top_logprobs"]:
            top[e["token"]] = max(top.get(e["token"], -math.inf), e["logprob"])
        return top
    return dict(logprobs["top_logprobs"][0])


class OpenAIBackend(Backend):
    """Client for ``/chat/completions`` or ``/completions`` with logprobs.

    Args:
        model: model (or Azure deployment) name.
        base_url: e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1`` (vLLM), or a
            list of replicas of the same model; the first names the deployment in the cache key,
            so replicas added after it share its cached results.
        endpoint: ``chat`` or ``completions``.
        api_key_env: environment variable holding the key (none needed for a local server).
        azure_api_version: set for Azure: deployment URLs, ``api-key`` header.
        top_logprobs: how many alternatives to request (OpenAI and vLLM's default allow up to 20); at
            least the number of options.
        whitespace_continuation, whitespace_min_prob: completions endpoint: follow whitespace-only first
            tokens at least this likely (module doc).
        concurrency: requests in flight per endpoint.
        max_retries, timeout, backoff, max_backoff: retries per request; seconds.
        pause_after, pause, max_pause: failures in a row that pause an endpoint; seconds.
        down_after: seconds without an answer from any endpoint, while requests fail, after which the server is
            down and the blocks not yet answered end as ``server_down``.
        mode, mode_settings: ``logprob`` (the default), or ``sampled``, ``verbalized``, ``reasoned`` with the
            settings of :class:`~llmrubric.extract.backends.generation.ModeSettings` (read from generated text).
    """

    def __init__(
        self,
        model: str,
        base_url: str | Sequence[str] = "https://api.openai.com/v1",
        endpoint: str = "chat",
        api_key_env: str = "OPENAI_API_KEY",
        azure_api_version: str | None = None,
        top_logprobs: int = 20,
        concurrency: int = 4,
        max_retries: int = 5,
        timeout: float = 60.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        pause_after: int = 3,
        pause: float = 10.0,
        max_pause: float = 300.0,
        down_after: float = 120.0,
        system_prompt: str | None = None,
        whitespace_continuation: bool = True,
        whitespace_min_prob: float = 0.05,
        mode: str = "logprob",
        **mode_settings,
    ):
        if endpoint not in ("chat", "completions"):
            raise InputError(f"endpoint must be 'chat' or 'completions', not {endpoint!r}")
        check_ranges(
            top_logprobs=top_logprobs,
            concurrency=concurrency,
            max_retries=max_retries,
            timeout=timeout,
            backoff=backoff,
            max_backoff=max_backoff,
            pause_after=pause_after,
            pause=pause,
            max_pause=max_pause,
            down_after=down_after,
            whitespace_min_prob=whitespace_min_prob,
        )
        self.urls = check_urls(base_url)
        self.model, self.base_url, self.endpoint = model, self.urls[0], endpoint
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self.azure_api_version = azure_api_version
        self.top_logprobs, self.concurrency = int(top_logprobs), max(1, int(concurrency))
        self.max_retries, self.timeout = int(max_retries), float(timeout)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.pool = EndpointPool(self.urls, self.concurrency, pause_after, pause, max_pause, down_after)
        self.system_prompt = system_prompt
        self.whitespace_continuation = bool(whitespace_continuation) and endpoint == "completions"
        self.whitespace_min_prob = float(whitespace_min_prob)
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "output_tokens": 0}
        self._lock = threading.Lock()
        self.mode = ModeSettings(mode, **mode_settings)
        self.reader = ModeReader(self, self.mode) if mode != "logprob" else None

    @property
    def model_id(self) -> str:
        if self.reader is not None:
            return f"openai:{self.base_url}|{self.model}|{self.endpoint}|sys={self.system_prompt!r}|{self.mode.mode}{self.mode.key()}"
        ws = f"|ws{self.whitespace_min_prob:g}" if self.whitespace_continuation else ""
        return (
            f"openai:{self.base_url}|{self.model}|{self.endpoint}|top{self.top_logprobs}|sys={self.system_prompt!r}{ws}"
        )

    def _url(self, base_url: str | None = None) -> str:
        base = base_url or self.base_url
        path = "chat/completions" if self.endpoint == "chat" else "completions"
        if self.azure_api_version:
            return f"{base}/openai/deployments/{self.model}/{path}?api-version={self.azure_api_version}"
        return f"{base}/{path}"

    def _body(self, prompt: str) -> dict:
        body = {"model": self.model, "max_tokens": 1, "temperature": 0}
        if self.endpoint == "chat":
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
                {"role": "user", "content": prompt}
            ]
            body.update(messages=messages, logprobs=True, top_logprobs=self.top_logprobs)
        else:
            body.update(prompt=prompt, logprobs=self.top_logprobs)
        return body

    def _post(self, body: dict, base_url: str | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["api-key" if self.azure_api_version else "Authorization"] = (
                self.api_key if self.azure_api_version else f"Bearer {self.api_key}"
            )
        request = urllib.request.Request(
            self._url(base_url), data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read())

    def _count(self, retry: bool) -> None:
        with self._lock:
            self.stats["requests"] += 1
            self.stats["retries"] += int(retry)

    def _add_usage(self, response) -> None:
        """The tokens of an answered request, from its ``usage`` field (the run summary's figures)."""
        usage = (response.get("usage") if isinstance(response, dict) else None) or {}
        with self._lock:
            self.stats["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
            self.stats["output_tokens"] += int(usage.get("completion_tokens") or 0)

    def _attempt(self, body: dict, endpoint: Endpoint) -> tuple[dict | None, str, float | None, bool]:
        """One request to ``endpoint``: (its response, or None; the error; its Retry-After; whether the error is
        final, i.e. not worth a retry). A timeout's error starts with ``timeout:``."""
        try:
            response = self._post(body, endpoint.url)
        except urllib.error.HTTPError as e:
            error = f"HTTP {e.code} from {self._url(endpoint.url)}: {e.read()[:300].decode(errors='replace')}"
            if e.code not in RETRY_STATUS:
                self.pool.release(endpoint, ok=True)
                return None, error, None, True
            header = e.headers.get("Retry-After") if e.headers else None
            retry_after = float(header) if header and header.replace(".", "", 1).isdigit() else None
            self.pool.release(endpoint, ok=False, retry_after=retry_after, reason=error)
            return None, error, retry_after, False
        except (
            OSError,
            http.client.HTTPException,
            json.JSONDecodeError,
        ) as e:  # refused, dropped, timed out, cut short
            error = f"{type(e).__name__} from {endpoint.url}: {getattr(e, 'reason', e)}"
            if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
                error = f"timeout: no answer within {self.timeout:g} s ({error})"
            self.pool.release(endpoint, ok=False, reason=error)
            return None, error, None, False
        self.pool.release(endpoint, ok=True)
        self._add_usage(response)
        return response, "", None, False

    def send(self, task: Task, body: dict) -> tuple[dict | None, str]:
        """POST ``body`` with retries on the least busy live endpoint: (the response with ``"url"``, '') or (None,
        why). An attempt while every endpoint is paused fails at once (and waits its back-off); nothing is sent
        once the pool is halted (why: ``server down: ...`` or ``interrupted: ...``)."""
        last, previous = "", None
        for attempt in range(self.max_retries + 1):
            endpoint = self.pool.acquire(avoid=previous)
            retry_after = None
            if endpoint is None and (halt := self.pool.halted()):
                return None, halt
            if endpoint is None:
                last = f"every endpoint is paused after failing (last: {self.pool.last_failure})"
            else:
                self._count(retry=attempt > 0)
                response, last, retry_after, final = self._attempt(body, endpoint)
                if response is not None:
                    return {**response, "url": endpoint.url}, ""
                if final:
                    return None, last
                previous = endpoint
            if attempt < self.max_retries:
                delay = (
                    retry_after
                    if retry_after is not None
                    else random.uniform(0.5, 1.0) * min(self.max_backoff, self.backoff * 2**attempt)
                )
                log.debug("task %s/%s: %s; retry in %.2fs", task.text_id, task.question_id, last, delay)
                self.pool.sleep(delay)
        return None, f"{last} (after {self.max_retries + 1} attempts)"

    def _fetch(self, task: Task, prompt: str) -> tuple[dict | None, str]:
        """The top logprobs after ``prompt`` (with ``"prompt_tokens"`` and ``"url"``): (answer, '') or (None, why)."""
        response, error = self.send(task, self._body(prompt))
        if response is None:
            return None, error
        try:
            top = first_top_logprobs(response, self.endpoint)
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            setting = "top_logprobs with logprobs: true" if self.endpoint == "chat" else "logprobs"
            return (
                None,
                f"the response of {self._url(response['url'])} has no token logprobs ({type(e).__name__}: {e}); the "
                f"request asked for them ({setting} = {self.top_logprobs}): does this server return logprobs?",
            )
        tokens = response.get("usage") or {}
        return {"top": top, "prompt_tokens": int(tokens.get("prompt_tokens") or 0), "url": response["url"]}, ""

    def request(self, task: Task) -> Result:
        """One task (and its whitespace continuations, or its mode's requests); never raises for a server or network
        failure."""
        if self.reader is not None:
            return self.reader.read(task)
        answer, error = self._fetch(task, task.prompt)
        if answer is None:
            return Result(task, None, failure_status(error), error)
        top, tokens = answer["top"], answer["prompt_tokens"]
        if len(top) < len(task.labels):
            return Result(
                task,
                dict.fromkeys(task.options),
                "incomplete",
                f"{self._url(answer['url'])} returned {len(top)} top logprobs, fewer than the {len(task.labels)} "
                f"options (top_logprobs = {self.top_logprobs}; the server's cap, e.g. vLLM's --max-logprobs?)",
                tokens,
                tokens,
            )
        parts = [(1.0, top, "")]
        if self.whitespace_continuation:
            for token, logprob in top.items():
                if token and not token.strip() and math.exp(logprob) >= self.whitespace_min_prob:
                    after, error = self._fetch(task, task.prompt + token)
                    if after is None:
                        return Result(task, None, failure_status(error), f"after {token!r}: {error}")
                    parts.append((math.exp(logprob), after["top"], f"after {token!r}"))
                    tokens += after["prompt_tokens"]
        probs, reason = combine(parts, task.labels)
        return Result(
            task,
            dict(zip(task.options, probs)),
            "incomplete" if reason else "ok",
            reason,
            answer["prompt_tokens"],
            tokens,
        )

    def check(self) -> None:
        """Before any request (and a run's cache): :meth:`EndpointPool.check_reachable`."""
        self.pool.check_reachable(min(self.timeout, 5.0))

    def score(self, tasks: Sequence[Task]) -> Iterator[Result]:
        if not tasks:
            return
        widest = max(tasks, key=lambda t: len(t.labels))
        if self.reader is None and self.top_logprobs < len(widest.labels):
            raise InputError(
                f"extract setting top_logprobs: {self.top_logprobs} is fewer than the {len(widest.labels)} options of "
                f"question {widest.question_id!r}: the mass of the others would be unknown; ask for at least "
                f"{len(widest.labels)} (OpenAI and vLLM's default allow 20)"
            )
        self.check()
        self.pool.start()
        with ThreadPoolExecutor(self.concurrency * len(self.urls)) as pool:
            futures = [pool.submit(self.request, t) for t in tasks]
            finished = False
            try:
                for future in as_completed(futures):
                    yield future.result()
                finished = True
            finally:  # a consumer that stops early (an error, a second Ctrl-C): nothing more is sent
                if not finished:
                    self.stop()

    def stop(self) -> None:
        """Send no new request (Ctrl-C): the requests in flight are answered, every other task ends ``interrupted``."""
        self.pool.stop()

    def watch(self, interrupted: Callable[[], bool]) -> None:
        self.pool.interrupted = interrupted

    def generate(self, prompt: str, max_tokens: int = 512) -> str:
        """Greedy text completion (test-bank generation) on the least busy endpoint; raises InputError on failure."""
        body = self._body(prompt)
        body.update(max_tokens=max_tokens)
        body.pop("logprobs", None), body.pop("top_logprobs", None)
        endpoint = self.pool.acquire()
        if endpoint is None:
            raise InputError(f"generation request: {self.pool.halted() or 'every endpoint is paused after failing'}")
        try:
            response = self._post(body, endpoint.url)
        except (urllib.error.URLError, TimeoutError) as e:
            raise InputError(f"generation request to {self._url(endpoint.url)} failed: {e}") from e
        finally:
            self.pool.release(endpoint, ok=True)
        choice = response["choices"][0]
        return choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
