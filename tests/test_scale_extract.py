"""Extraction across several OpenAI-compatible endpoints (loopback fake servers answering
with a tiny model's real logprobs): balancing, a slow and a killed replica, all endpoints
dying mid-run and resuming, bad endpoint lists."""

from __future__ import annotations

import time

import pandas as pd
import pytest
from support.fake_openai import FakeOpenAI
from support.paths import ROOT
from support.tiny_models import write_texts

from llmrubric.extract.backends.openai_backend import EndpointPool, OpenAIBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import extract
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("scale_extract")

KEYS = ["text_id", "question_id", "option"]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    texts = pd.read_json(write_texts(tmp_path_factory.mktemp("texts") / "t.jsonl", n=4), lines=True)
    tasks, _ = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    return tasks


def backend(urls, tok, **kw):
    settings = dict(
        endpoint="completions",
        api_key_env=None,
        top_logprobs=len(tok),
        concurrency=2,
        max_retries=4,
        timeout=5,
        backoff=0.02,
        pause_after=2,
        pause=0.2,
        whitespace_continuation=False,  # one request per prompt: the tests count requests per endpoint
    )
    return OpenAIBackend("tiny", urls, **{**settings, **kw})


def sorted_features(extraction):
    return extraction.features.sort_values(KEYS).reset_index(drop=True)


@pytest.fixture(scope="module")
def reference(tasks, llama, tok):
    """Features from one server."""
    with FakeOpenAI(llama, tok) as server:
        ex = extract(tasks, backend(server.url, tok), ResultCache(None), "api", progress=False)
    assert ex.summary["done"] == len(tasks)
    return sorted_features(ex)


@pytest.mark.slow
def test_replicas_answer_every_prompt_once_despite_a_slow_and_a_killed_one(tasks, reference, llama, tok, tmp_path):
    cache = ResultCache(tmp_path / "cache.sqlite")
    with (
        FakeOpenAI(llama, tok) as fast,
        FakeOpenAI(llama, tok, latency=0.3) as slow,
        FakeOpenAI(llama, tok, latency=0.02, die_after=3) as dying,
    ):
        client = backend([fast.url, slow.url, dying.url], tok)
        ex = extract(tasks, client, cache, "api", progress=False)
        answered = fast.answered + slow.answered + dying.answered
        assert ex.summary["done"] == len(tasks) and ex.failures.empty
        assert sorted(answered) == sorted(t.prompt for t in tasks)  # every prompt answered once, none twice
        assert len(dying.answered) == 3 and dying.dead
        assert len(slow.answered) < len(fast.answered)  # balanced by requests in flight
        pd.testing.assert_frame_equal(sorted_features(ex), reference)
        again = extract(tasks, backend([fast.url, slow.url], tok), cache, "api", progress=False)
        assert again.summary["cached"] == len(tasks) and again.summary["computed"] == 0
        assert len(fast.answered + slow.answered + dying.answered) == len(answered)
    pd.testing.assert_frame_equal(sorted_features(again), reference)


@pytest.mark.slow
def test_endpoints_dying_mid_run_leave_failures_with_reasons_that_resume(tasks, reference, llama, tok, tmp_path):
    cache = ResultCache(tmp_path / "cache.sqlite")
    with FakeOpenAI(llama, tok, die_after=6) as a, FakeOpenAI(llama, tok, die_after=6) as b:
        urls, ports = [a.url, b.url], [a.port, b.port]
        first = extract(tasks, backend(urls, tok, max_retries=2), cache, "api", progress=False)
    assert first.summary["done"] == 12 and first.summary["failed"] == len(tasks) - 12
    assert first.failures.status.eq("failed").all()
    assert first.failures.reason.str.contains(
        r"(?:Error|Disconnected) from http://127\.0\.0\.1:\d+/v1: .*\(after 3 attempts\)"
    ).all()
    with FakeOpenAI(llama, tok, port=ports[0]) as a, FakeOpenAI(llama, tok, port=ports[1]) as b:
        resumed = extract(tasks, backend(urls, tok), cache, "api", progress=False)
        failed = set(zip(first.failures.text_id, first.failures.question_id))
        assert sorted(a.answered + b.answered) == sorted(
            t.prompt for t in tasks if (t.text_id, t.question_id) in failed
        )
    assert resumed.summary["cached"] == 12 and resumed.summary["computed"] == len(tasks) - 12 and resumed.failures.empty
    pd.testing.assert_frame_equal(sorted_features(resumed), reference)


@pytest.mark.slow
def test_pool_sends_to_the_least_busy_live_endpoint_and_pauses_a_failing_one():
    pool = EndpointPool(["http://a", "http://b"], limit=2, pause_after=2, pause=0.2)
    a, b = pool.endpoints
    assert [pool.acquire().url for _ in range(3)] == ["http://a", "http://b", "http://a"]
    assert pool.acquire(avoid=a) is b
    pool.release(a, ok=False)
    pool.release(a, ok=False)
    assert a.paused_until > time.monotonic() and a.in_flight == 0
    pool.release(b, ok=True)
    assert pool.acquire() is b  # a is paused, b has room again
    start = time.monotonic()
    pool.release(b, ok=True)
    pool.release(b, ok=True)
    assert pool.acquire() is b and pool.acquire() is b
    assert pool.acquire() is a and time.monotonic() - start >= 0.15  # waited for a's pause to end
    pool.release(b, ok=True)
    assert pool.acquire() is b  # a takes one probe at a time until it answers
    pool.release(a, ok=True)
    assert a.failures == 0 and pool.acquire() is a
    both = EndpointPool(["http://a", "http://b"], limit=1, pause_after=1, pause=5)
    for _ in range(2):
        both.release(both.acquire(), ok=False)
    assert both.acquire() is None  # every endpoint paused after failing: the attempt fails at once
    one = EndpointPool(["http://a"], limit=1)
    one.release(one.acquire(), ok=False, retry_after=0.2)
    start = time.monotonic()
    assert one.acquire() is one.endpoints[0] and time.monotonic() - start >= 0.15  # a Retry-After is waited for


def test_bad_endpoint_lists_are_one_line_errors_before_any_request(tasks, tok):
    with pytest.raises(InputError, match=r"base_url\[1\]: 'htp:/127.0.0.1:8000' is not an http\(s\) URL"):
        backend(["http://127.0.0.1:8000/v1", "htp:/127.0.0.1:8000"], tok)
    with pytest.raises(InputError, match=r"base_url\[0\]: 'http://127.0.0.1:99999/v1' is not a valid URL"):
        backend(["http://127.0.0.1:99999/v1"], tok)
    with pytest.raises(InputError, match="listed twice"):
        backend(["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"], tok)
    cache = ResultCache(None)
    down = backend(["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"], tok)
    with pytest.raises(
        InputError,
        match=r"no endpoint is reachable: http://127.0.0.1:1/v1 \(ConnectionRefusedError.*http://127.0.0.1:2/v1",
    ):
        extract(tasks, down, cache, "api", progress=False)
    assert cache.count() == 0 and down.stats["requests"] == 0


def test_cli_takes_an_endpoint_list_and_refuses_a_malformed_one(tmp_path, capsys):
    from llmrubric.apps.extract import load_config
    from llmrubric.cli import main
    from llmrubric.extract.backends import make_backend_from

    config = load_config(
        ROOT / "conf" / "extract" / "vllm.yaml",
        ["model=m", "base_url=[http://127.0.0.1:8001/v1,http://127.0.0.1:8002/v1]"],
    )
    client = make_backend_from(config)
    assert client.urls == ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"] and client.pool.limit == 16
    texts = write_texts(tmp_path / "t.jsonl", n=1)
    out = tmp_path / "f.csv"
    argv = [
        "extract",
        "features",
        str(texts),
        "--config",
        str(ROOT / "conf" / "extract" / "vllm.yaml"),
        "--set",
        "model=m",
        "--set",
        "base_url=[http://127.0.0.1:8001/v1,http//127.0.0.1:8002/v1]",
        "--rubric",
        str(ROOT / "conf" / "rubric" / "llm_rubric.yaml"),
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "base_url[1]: 'http//127.0.0.1:8002/v1' is not an http(s) URL" in err[0]
    assert not list(tmp_path.glob("f*"))
