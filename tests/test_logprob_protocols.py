"""The OpenAI backend on responses recorded from llama.cpp's real server (``tests/data/llama_cpp/``,
written by ``benchmarks/real_llm.py --part server --record tests/data/llama_cpp`` with llama-cpp-python's server;
``native/``: the completions requests again, answered by llama.cpp's own server: SmolLM2-135M-Instruct, the first
text of ``data/demo_llm``, question Q0), replayed by a loopback server; and the bad input of
the protocol (no logprobs, too few, a context overflow, no server, a top_logprobs below the options).
These run without the optional group; the live server is ``test_llama_server.py``."""

from __future__ import annotations

import copy
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
from support.llama_server import free_port
from support.paths import ROOT

from llmrubric.cli import main
from llmrubric.extract.backends.openai_backend import OpenAIBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.prompts import text_hash
from llmrubric.extract.runner import extract
from llmrubric.extract.tasks import Task

RECORDED = Path(__file__).resolve().parent / "data" / "llama_cpp"
LABELS = ("1", "2", "3", "4")


def recording(name: str) -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())


def prompt_of(body: dict) -> str:
    return body["prompt"] if "prompt" in body else body["messages"][-1]["content"]


class Replay:
    """Answers each POST with the recording of its path whose prompt matches (any prompt with
    ``any_prompt``), with the recorded HTTP status; 404 otherwise."""

    def __init__(self, *recordings: dict, any_prompt: bool = False):
        self.recordings, self.any_prompt, self.requests = recordings, any_prompt, []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                replay.requests.append(body)
                path = self.path.removeprefix("/v1/")
                found = [
                    r
                    for r in replay.recordings
                    if r["path"] == path and (replay.any_prompt or prompt_of(r["request"]) == prompt_of(body))
                ]
                status, payload = 404, {"error": f"nothing recorded for {path}"}
                if found:
                    response = found[0]["response"]
                    status = response.get("http_status", 200)
                    payload = response.get("error") if "http_status" in response else response
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def task(prompt: str) -> Task:
    return Task("d01", "Q0", prompt, LABELS, LABELS, "d01", "h", text_hash(prompt, *LABELS))


def score(replay: Replay, endpoint: str, prompt: str, **kw):
    backend = OpenAIBackend("smollm2", replay.url, endpoint=endpoint, api_key_env=None, max_retries=0, **kw)
    [result] = list(backend.score([task(prompt)]))
    return result


def label_sums(top: dict[str, float]) -> dict[str, float]:
    """Hand oracle for one-digit labels: the mass of the returned tokens that are the label, with or without spaces."""
    return {label: sum(math.exp(v) for t, v in top.items() if t.strip() == label) for label in LABELS}


@pytest.mark.slow
def test_chat_recording_shape_and_parse():
    rec = recording("chat")
    content = rec["response"]["choices"][0]["logprobs"]["content"]
    assert len(content) == 1 and len(content[0]["top_logprobs"]) == 20  # a list of {token, logprob, bytes}
    top = {e["token"]: e["logprob"] for e in content[0]["top_logprobs"]}
    assert set(LABELS) <= set(top)  # SmolLM2's chat answer starts with the bare digit
    with Replay(rec) as replay:
        r = score(replay, "chat", prompt_of(rec["request"]))
    assert r.status == "ok", r.reason
    assert r.probs == pytest.approx(label_sums(top), rel=1e-9)
    assert r.prompt_tokens == rec["response"]["usage"]["prompt_tokens"]


@pytest.mark.slow
def test_completions_recording_follows_the_likely_whitespace_tokens():
    first = recording("completions")
    top = first["response"]["choices"][0]["logprobs"]["top_logprobs"][0]  # a dict token → logprob
    assert max(top, key=top.get) == " " and not set(LABELS) & set(top)  # ' 1' is ' ' + '1' for SmolLM2
    followed = [t for t, v in top.items() if t and not t.strip() and math.exp(v) >= 0.05]
    names = {" ": "space", "\n": "newline"}
    after = {t: recording(f"completions_after_{names[t]}") for t in followed}
    with Replay(first, *after.values()) as replay:
        r = score(replay, "completions", prompt_of(first["request"]))
        asked = [prompt_of(b) for b in replay.requests]
    assert asked == [prompt_of(first["request"])] + [prompt_of(first["request"]) + t for t in followed]
    expected = label_sums(top)
    for t, rec in after.items():
        then = label_sums(rec["response"]["choices"][0]["logprobs"]["top_logprobs"][0])
        expected = {k: expected[k] + math.exp(top[t]) * then[k] for k in LABELS}
    assert r.status == "ok", r.reason
    assert r.probs == pytest.approx(expected, rel=1e-9)
    with Replay(first) as replay:  # without following, no label is among the 20 tokens returned
        r = score(replay, "completions", prompt_of(first["request"]), whitespace_continuation=False)
    assert r.status == "incomplete" and set(r.probs.values()) == {None} and "mass unknown" in r.reason


@pytest.mark.slow
def test_native_completions_recording_in_the_chat_form_follows_the_likely_whitespace_tokens():
    """llama.cpp's own server (``llmrubric models serve``) answers completions in the chat answer's form."""
    first = recording("native/completions")
    entries = first["response"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]  # a list, as chat's
    top = {e["token"]: e["logprob"] for e in entries}
    followed = [t for t, v in top.items() if t and not t.strip() and math.exp(v) >= 0.05]
    names = {" ": "space", "\n": "newline"}
    after = {t: recording(f"native/completions_after_{names[t]}") for t in followed}
    assert followed and not set(LABELS) & set(top)  # ' 1' is ' ' + '1' for SmolLM2
    with Replay(first, *after.values()) as replay:
        r = score(replay, "completions", prompt_of(first["request"]))
    expected = label_sums(top)
    for t, rec in after.items():
        content = rec["response"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        then = label_sums({e["token"]: e["logprob"] for e in content})
        expected = {k: expected[k] + math.exp(top[t]) * then[k] for k in LABELS}
    assert r.status == "ok", r.reason
    assert r.probs == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_a_response_without_logprobs_fails_naming_the_endpoint():
    rec = recording("chat_without_top_logprobs")
    assert rec["response"]["choices"][0]["logprobs"] is None  # llama.cpp: logprobs: true alone returns none
    with Replay(rec, any_prompt=True) as replay:
        r = score(replay, "chat", "any prompt")
        url = f"{replay.url}/chat/completions"
    assert r.status == "failed" and r.probs is None
    assert r.reason.startswith(f"the response of {url} has no token logprobs")


@pytest.mark.slow
def test_fewer_top_logprobs_than_options_is_incomplete_naming_the_endpoint():
    rec = copy.deepcopy(recording("chat"))
    entries = rec["response"]["choices"][0]["logprobs"]["content"][0]
    entries["top_logprobs"] = entries["top_logprobs"][:2]
    with Replay(rec, any_prompt=True) as replay:
        r = score(replay, "chat", "any prompt")
        url = f"{replay.url}/chat/completions"
    assert r.status == "incomplete" and set(r.probs.values()) == {None}
    assert r.reason.startswith(f"{url} returned 2 top logprobs, fewer than the 4 options (top_logprobs = 20")


@pytest.mark.slow
def test_context_overflow_fails_per_prompt_and_is_retried_by_the_next_run(tmp_path):
    rec = recording("completions_overflow")
    assert rec["response"]["http_status"] == 400
    with Replay(rec, any_prompt=True) as replay:
        backend = OpenAIBackend("smollm2", replay.url, endpoint="completions", api_key_env=None, max_retries=3)
        cache = ResultCache(tmp_path / "c.sqlite")
        ex = extract([task("a long prompt")], backend, cache, "s", progress=False)
        assert len(replay.requests) == 1  # a 400 is not retried
        again = extract([task("a long prompt")], backend, cache, "s", progress=False)
        assert len(replay.requests) == 2 and again.summary["computed"] == 1  # failed results are asked again
    assert ex.failures.status.tolist() == ["failed"]
    assert ex.failures.reason[0].startswith(f"HTTP 400 from {replay.url}/completions: ")
    assert "maximum context length" in ex.failures.reason[0]


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.csv"
    pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(1).to_csv(path, index=False)
    return path


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    return err


def test_a_server_that_is_not_up_is_one_line_error(texts, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "f.csv"
    err = one_line_error(
        capsys,
        [
            "extract",
            "features",
            str(texts),
            "--config",
            str(ROOT / "conf/extract/llama_cpp.yaml"),
            "--set",
            f"base_url={url}",
            "--rubric",
            str(ROOT / "conf/rubric/llm_rubric.yaml"),
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert f"extract setting base_url: no endpoint is reachable: {url} (ConnectionRefusedError" in err
    assert not out.exists()


@pytest.mark.slow
def test_top_logprobs_below_the_options_is_one_line_error(texts, tmp_path, capsys):
    with Replay(recording("chat")) as replay:
        err = one_line_error(
            capsys,
            [
                "extract",
                "features",
                str(texts),
                "--config",
                str(ROOT / "conf/extract/llama_cpp.yaml"),
                "--set",
                f"base_url={replay.url}",
                "--top-logprobs",
                "3",
                "--rubric",
                str(ROOT / "conf/rubric/llm_rubric.yaml"),
                "--out",
                str(tmp_path / "f.csv"),
                "--no-progress",
            ],
        )
        assert replay.requests == []
    assert "extract setting top_logprobs: 3 is fewer than the 4 options of question 'Q0'" in err
