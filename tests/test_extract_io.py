"""Extractor I/O: OpenAI-compatible client on a loopback server, kill-and-resume, CLI,
test banks, the LLM-Rubric adapter and bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest
import torch
from support.fake_openai import FakeOpenAI
from support.paths import ROOT
from support.tiny_models import save_model, write_texts

from llmrubric.extract.backends.openai_backend import OpenAIBackend, map_top_logprobs
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate, text_hash
from llmrubric.extract.runner import extract
from llmrubric.extract.tasks import Task
from llmrubric.extract.testbank import Item, generate_questions, item_id, nuggetize, read_bank, write_bank
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import read_table, validate_features

RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"
REAL = ROOT.parent / "shared" / "data" / "llm-rubric" / "real" / "real_data.json"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, llama, tok):
    return save_model(llama, tok, tmp_path_factory.mktemp("tiny-llama"))


def task(qid, prompt, labels):
    return Task("t1", qid, prompt, tuple(labels), tuple(labels), "g", "h", text_hash(prompt, *labels))


def expected_api_probs(model, tok, prompt, labels, follow_whitespace=False):
    """What the client should report: mass of tokens whose stripped text uniquely begins a label; with
    ``follow_whitespace`` (completions) plus, for each whitespace-only token of probability >= 0.05, that
    probability times the labels' mass after it."""
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1].float(), -1)
    out = {lab: 0.0 for lab in labels}
    seen = {}
    for i in torch.argsort(p, descending=True).tolist():
        s = tok.decode([i])
        if s in seen:
            continue
        seen[s] = True
        hits = [lab for lab in labels if s.strip() and lab.startswith(s.strip())]
        if len(hits) == 1:
            out[hits[0]] += float(p[i])
        if follow_whitespace and s and not s.strip() and float(p[i]) >= 0.05:
            after = expected_api_probs(model, tok, prompt + s, labels)
            for lab in labels:
                out[lab] += float(p[i]) * after[lab]
    return out


PROMPTS = [f"Conversation: user: reset password {i}?\nQuestion: how likely{'?' * i}\nAnswer:" for i in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_openai_client_reports_real_model_logprobs(llama, tok, endpoint):
    labels = ["1", "2", "3", "4"]
    with FakeOpenAI(llama, tok) as server:
        backend = OpenAIBackend(
            "tiny", server.url, endpoint=endpoint, api_key_env=None, top_logprobs=len(tok), concurrency=3
        )
        results = list(backend.score([task(f"Q{i}", p, labels) for i, p in enumerate(PROMPTS)]))
    assert len(results) == 4
    for r in results:
        assert r.status == "ok", r.reason
        expected = expected_api_probs(llama, tok, r.task.prompt, labels, follow_whitespace=endpoint == "completions")
        for lab in labels:
            assert r.probs[lab] == pytest.approx(expected[lab], rel=1e-3, abs=1e-7)


@pytest.mark.slow
def test_openai_retries_rate_limits_and_timeouts(llama, tok):
    with FakeOpenAI(llama, tok, fail_first=3, stall_first=1, stall_s=1.5) as server:
        backend = OpenAIBackend(
            "tiny",
            server.url,
            endpoint="completions",
            api_key_env=None,
            top_logprobs=len(tok),
            concurrency=1,
            max_retries=6,
            timeout=0.5,
            backoff=0.01,
        )
        [r] = list(backend.score([task("Q0", PROMPTS[0], ["1", "2"])]))
    assert r.status == "ok", r.reason
    assert backend.stats["retries"] == 4


@pytest.mark.slow
def test_openai_failure_is_recorded_never_zero(llama, tok):
    with FakeOpenAI(llama, tok, fail_first=100) as server:
        backend = OpenAIBackend("tiny", server.url, endpoint="chat", api_key_env=None, max_retries=2, backoff=0.01)
        tasks = [task("Q0", PROMPTS[0], ["1", "2"])]
        ex = extract(tasks, backend, ResultCache(None), "api", progress=False)
    assert ex.features.empty
    assert ex.failures.status.tolist() == ["failed"] and "HTTP 429" in ex.failures.reason[0]
    assert ex.summary["failed"] == 1


@pytest.mark.slow
def test_openai_absent_option_mass_is_unknown(llama, tok):
    with FakeOpenAI(llama, tok) as server:
        backend = OpenAIBackend("tiny", server.url, endpoint="completions", api_key_env=None, top_logprobs=4)
        ex = extract([task("Q0", PROMPTS[0], ["1", "2", "3", "4"])], backend, ResultCache(None), "api", progress=False)
        backend.top_logprobs, sent = 3, server.requests
        with pytest.raises(
            InputError, match="extract setting top_logprobs: 3 is fewer than the 4 options of question 'Q0'"
        ):
            list(backend.score([task("Q0", PROMPTS[0], ["1", "2", "3", "4"])]))
        assert server.requests == sent  # refused before any request
    assert ex.features.empty
    assert ex.failures.status.tolist() == ["incomplete"] and "mass unknown" in ex.failures.reason[0]
    probs, reason = map_top_logprobs({" 4": math.log(0.5), "3": math.log(0.2)}, ["1", "2", "3", "4"])
    assert probs == [None, None, pytest.approx(0.2), pytest.approx(0.5)] and "['1', '2']" in reason
    probs, _ = map_top_logprobs(
        {"support": -1.0, "partial": -2.0, "not": -3.0}, ["support", "partial_support", "not_support"]
    )
    assert probs == pytest.approx([math.exp(-1), math.exp(-2), math.exp(-3)])


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import pandas as pd
    from llmrubric.extract.backends.transformers_backend import TransformersBackend
    from llmrubric.extract.cache import ResultCache
    from llmrubric.extract.families import likert_tasks
    from llmrubric.extract.prompts import PromptTemplate
    from llmrubric.extract.runner import extract
    from llmrubric.io.rubric import Rubric

    class Slow(TransformersBackend):
        def score(self, tasks):
            for r in super().score(tasks):
                time.sleep(0.15)
                yield r

    model, texts, cache, rubric = sys.argv[1:5]
    rubric = Rubric.load(rubric)
    tasks, skipped = likert_tasks(pd.read_json(texts, lines=True), rubric, PromptTemplate("llm_rubric"))
    extract(tasks, Slow(path=model, batch_size=1), ResultCache(cache), "s", skipped, rubric, progress=False)
    """
)


@pytest.mark.slow
def test_killed_run_resumes_without_recomputation(model_dir, tmp_path):
    texts = write_texts(tmp_path / "t.jsonl", n=6)
    cache = tmp_path / "c.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", RESUME_SCRIPT, str(model_dir), str(texts), str(cache), str(RUBRIC)], env=env
    )
    try:
        deadline = time.time() + 120
        done = 0
        while time.time() < deadline and proc.poll() is None:
            if cache.exists():
                with sqlite3.connect(cache) as db:
                    try:
                        done = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
                    except sqlite3.OperationalError:
                        done = 0
                if done >= 8:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with sqlite3.connect(cache) as db:
        stored = db.execute("SELECT COUNT(*) FROM results WHERE status='ok'").fetchone()[0]
    rubric = Rubric.load(RUBRIC)
    tasks, skipped = likert_tasks(pd.read_json(texts, lines=True), rubric, PromptTemplate("llm_rubric"))
    assert 8 <= stored < len(tasks)
    resumed = extract(
        tasks, TransformersBackend(path=str(model_dir)), ResultCache(cache), "s", skipped, rubric, progress=False
    )
    assert resumed.summary["cached"] == stored and resumed.summary["computed"] == len(tasks) - stored
    fresh = extract(
        tasks, TransformersBackend(path=str(model_dir)), ResultCache(None), "s", skipped, rubric, progress=False
    )
    pd.testing.assert_frame_equal(
        resumed.features.sort_values(["text_id", "question_id", "option"]).reset_index(drop=True),
        fresh.features.sort_values(["text_id", "question_id", "option"]).reset_index(drop=True),
        rtol=1e-5,
    )


@pytest.mark.slow
def test_cli_end_to_end(model_dir, tmp_path):
    from llmrubric.cli import main

    texts = write_texts(tmp_path / "texts.jsonl", n=3)
    out = tmp_path / "features.parquet"
    argv = [
        "extract",
        "features",
        str(texts),
        "--rubric",
        str(RUBRIC),
        "--backend",
        "transformers",
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "--no-progress",
    ]
    argv += ["--min-label-mass", "0"]  # a random model spreads its mass over the whole vocabulary
    assert main(argv) == 0
    features = validate_features(read_table(out, "features"), Rubric.load(RUBRIC))
    assert features.text_id.nunique() == 3
    failures = read_table(tmp_path / "features.failures.parquet", "texts")
    assert set(failures.status) == {"not_applicable"}
    summary = json.loads((tmp_path / "features.summary.json").read_text())
    assert summary["computed"] == 3 * 9 - 4
    assert main(argv) == 0
    assert json.loads((tmp_path / "features.summary.json").read_text())["cached"] == 23
    config = tmp_path / "x.yaml"
    config.write_text(
        f"backend: transformers\nmodel: {model_dir}\nrubric: {RUBRIC}\noverflow: refuse\nmax_length: 64\n"
    )
    assert (
        main(
            [
                "extract",
                "features",
                str(texts),
                "--config",
                str(config),
                "--out",
                str(tmp_path / "f2.csv"),
                "--no-progress",
            ]
        )
        == 2
    )
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("f2."))
    assert written == ["f2.csv.cache.sqlite"]  # an all-failed run writes no output, its cache keeps the reasons
    refused = ResultCache(tmp_path / "f2.csv.cache.sqlite")
    reasons = [r for (r,) in refused.db.execute("SELECT reason FROM results WHERE status = 'failed'")]
    assert len(reasons) == 23 and all("more than the context" in r for r in reasons)


def test_overflow_truncates_from_the_middle_with_warning(llama, tok, tmp_path):
    rubric = Rubric.from_dict({"questions": [{"id": "Q0", "prompt": "How good?", "options": [1, 2, 3, 4]}]})
    long = "start " + "filler words here " * 60 + " end"
    texts = pd.DataFrame({"text_id": ["a"], "text": [long]})
    tasks, _ = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    ex = extract(tasks, TransformersBackend(llama, tok, max_length=500), ResultCache(None), "s", progress=False)
    assert len(ex.features) == 4
    assert ex.failures.status.tolist() == ["truncated"] and "from the middle" in ex.failures.reason[0]
    ex = extract(
        tasks,
        TransformersBackend(llama, tok, max_length=500, overflow="refuse"),
        ResultCache(None),
        "s",
        progress=False,
    )
    assert ex.features.empty and ex.failures.status.tolist() == ["failed"]


def test_bad_input_is_a_clear_error(llama, tok, tmp_path):
    template = PromptTemplate("llm_rubric")
    with pytest.raises(InputError, match="text"):
        template.render(question="q", options=[], labels=["1"])
    (tmp_path / "bad.j2").write_text("Hello {{ nme }}")
    with pytest.raises(InputError, match="nme"):
        PromptTemplate("bad", tmp_path).render(name="x")
    with pytest.raises(InputError, match="no options"):
        Rubric.from_dict({"questions": [{"id": "Q0", "prompt": "p", "options": []}]})
    rubric = Rubric.load(RUBRIC)
    with pytest.raises(InputError, match="empty text.*t1"):
        likert_tasks(pd.DataFrame({"text_id": ["t0", "t1"], "text": ["fine", "  "]}), rubric, template)
    for bad in ({"batch_size": 0}, {"prefix_batch_size": 0}, {"prefix_batch_size": "two"}):
        with pytest.raises(InputError, match=f"{next(iter(bad))} must be a whole number"):
            TransformersBackend(llama, tok, **bad)
    backend = TransformersBackend(llama, tok)
    with pytest.raises(InputError, match="collide"):
        list(backend.score([task("Q0", "Answer:", ["support", "support_more"])]))
    with pytest.raises(InputError, match="collide"):
        list(backend.score([task("Q0", "Answer:", ["1", "1"])]))


def test_test_bank_round_trip_and_malformed_lines(tmp_path):
    items = [
        Item.new("q1", "question", "What resets a password?"),
        Item.new("q1", "nugget", "settings page", "okay", gold="x"),
    ]
    assert items[0].item_id == item_id("q1", "What resets a password?")
    path = write_bank(items, tmp_path / "bank.jsonl")
    back, warnings = read_bank(path)
    assert back == items and back[1].extra == {"gold": "x"} and not warnings
    lines = path.read_text().splitlines()
    edited = json.loads(lines[0])
    edited["text"] = "Which page resets a password?"
    path.write_text(
        "\n".join(
            [json.dumps(edited), lines[1], "{not json", json.dumps({"query_id": "q2", "text": "t", "kind": "essay"})]
        )
        + "\n"
    )
    with pytest.raises(InputError, match="row 3"):
        read_bank(path)
    back, warnings = read_bank(path, on_error="skip")
    assert [i.item_id for i in back] == [items[0].item_id, items[1].item_id] and back[0].text.startswith("Which")
    assert len(warnings) == 2 and "line 4" in warnings[1]


def test_generation_from_prompts():
    prompts = []

    def scripted(prompt):
        prompts.append(prompt)
        if "Generate 3 concise" in prompt:
            return 'Sure: ["What is X?", "Why X?", "What is X?"]'
        if "Updated Nugget List" in prompt:
            return (
                "['X is a tool', 'X runs locally']"
                if "Initial Nugget List: []" in prompt
                else '["X is a tool", "X runs locally", "X is old"]'
            )
        return '["okay", "vital", "okay"]'

    questions = generate_questions(scripted, "q1", "what is X", n=3)
    assert [q.text for q in questions] == ["What is X?", "Why X?"]
    nuggets = nuggetize(scripted, "q1", "what is X", [f"passage {i}" for i in range(12)], per_turn=10)
    assert [n.text for n in nuggets] == ["X runs locally", "X is a tool", "X is old"]
    assert [n.importance for n in nuggets] == ["vital", "okay", "okay"]
    assert "[11] passage 10" not in prompts[1] and "[2] passage 11" in prompts[2]


@pytest.mark.skipif(not REAL.is_file(), reason="LLM-Rubric real dialogues not available")
def test_real_dialogue_adapter(tmp_path):
    from llmrubric.extract.adapters import llm_rubric_real_texts

    texts = llm_rubric_real_texts(REAL)
    assert len(texts) == 223 and texts.text_id.is_unique
    assert texts.text.str.startswith("assistant: ").all() and texts.text.str.contains("\nuser: ").all()
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([{"_id": "a", "messages": "[{'role': 'user', 'content': 'x'}"}]))
    with pytest.raises(InputError, match="row 1.*messages"):
        llm_rubric_real_texts(broken)


@pytest.mark.skipif(not REAL.is_file(), reason="LLM-Rubric real dialogues not available")
def test_cli_extract_texts_writes_the_real_dialogues(tmp_path):
    from llmrubric.cli import main

    out = tmp_path / "texts.csv"
    assert main(["data", "texts", str(REAL), "--out", str(out)]) == 0
    texts = read_table(out, "texts")
    assert len(texts) == 223 and texts.text_id.is_unique and texts.text.str.contains("\nuser: ").all()
    assert main(["data", "texts", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.csv")]) != 0
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.slow
def test_cli_extract_bank_reports_unusable_model_output_and_bad_queries(model_dir, tmp_path, capsys):
    from llmrubric.cli import main

    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"query_id": "q1", "query": "how do I reset my password"}) + "\n")
    out = tmp_path / "bank.jsonl"
    argv = [
        "extract",
        "bank",
        str(queries),
        "--backend",
        "transformers",
        "--model",
        str(model_dir),
        "--n",
        "2",
        "--out",
        str(out),
    ]
    assert main(argv) == 2, "an untrained model's output holds no list of questions"
    assert "query q1" in capsys.readouterr().err and not out.exists()
    queries.write_text(json.dumps({"query_id": "q1", "text": "no query column"}) + "\n")
    assert main(argv) == 2
    assert "'query' column" in capsys.readouterr().err and not out.exists()


@pytest.mark.slow
def test_extract_configs_are_composed_by_hydra_with_overrides(tmp_path):
    from llmrubric.apps.extract import load_config

    vllm = load_config(ROOT / "conf" / "extract" / "vllm.yaml", ["model=m", "concurrency=2"])
    assert vllm["backend"] == "openai" and vllm["endpoint"] == "completions" and vllm["top_logprobs"] == 20
    assert vllm["model"] == "m" and vllm["concurrency"] == 2
    assert load_config(ROOT / "conf" / "extract" / "transformers.yaml")["prefix_reuse"] is True
    with pytest.raises(InputError, match="transformers.yaml.*cannot compose"):
        load_config(ROOT / "conf" / "extract" / "transformers.yaml", ["no_such_key=1"])
    with pytest.raises(InputError, match="not found"):
        load_config(tmp_path / "missing.yaml")
