"""The modes without logprobs against llama.cpp's own OpenAI-compatible server (``llmrubric models serve``,
SmolLM2-135M-Instruct in 2 slots, the optional group ``server``; skipped with the reason when it is not installed):
the three modes end to end through ``llmrubric extract features`` on real LLM-Rubric dialogues, their features
trained and scored; the reasoned mode on the server's own reasoning parser (``reasoning_content``); each failure the
weak model can be brought to (an answer outside the options, an unparseable one, a truncated reasoning, invalid
JSON); the adaptive stop of a confident judge; and a dry run's prompt tokens against the server's ``usage``.
A timeout and a refusal: tests/test_extract_modes.py."""

from __future__ import annotations

import functools
import json
import re

import numpy as np
import pandas as pd
import pytest
import yaml
from support.llama_server import LlamaServer, unavailable
from support.paths import ROOT

from llmrubric.cli import main
from llmrubric.extract.adapters import llm_rubric_real_texts
from llmrubric.extract.backends.openai_backend import OpenAIBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.prompts import text_hash
from llmrubric.extract.runner import MODE_STATUSES, extract
from llmrubric.extract.tasks import Task
from llmrubric.io.tables import validate_features

REASON = unavailable()
if REASON:
    pytest.skip(REASON, allow_module_level=True)

pytestmark = [pytest.mark.llm, pytest.mark.llama_server, pytest.mark.xdist_group("smollm2")]
CONFIG = ROOT / "conf" / "extract" / "llama_cpp.yaml"
# SmolLM2's own chat template (the same prompts) that also knows a reasoning model's <think> block, so that the
# server's reasoning parser (reasoning_format deepseek) moves such a block into reasoning_content
THINKING = ROOT / "tests" / "data" / "llama_cpp" / "smollm2_thinking.jinja"
MODES = {  # small budgets: a few answers of a few tokens
    "sampled": ["--samples", "2", "--max-tokens", "4"],
    "verbalized": ["--max-tokens", "40", "--sum-tolerance", "10"],
    "reasoned": ["--samples", "2", "--max-tokens", "40"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with LlamaServer(tmp_path_factory.mktemp("llama") / "server.log", chat_template=THINKING) as s:
        yield s


def run_cli(argv, capsys) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def cli_args(server, texts, rubric, out) -> list[str]:
    return ["extract", "features", str(texts), "--config", str(CONFIG), "--set", f"base_url={server.url}"] + [
        "--rubric",
        str(rubric),
        "--out",
        str(out),
        "--no-progress",
    ]


@pytest.mark.slow  # about 15 requests of up to 40 tokens, some under a grammar, then a training
def test_the_three_modes_answer_through_the_cli_and_their_features_train_and_score(
    server, shared_root, rubric, tmp_path, capsys
):
    from llmrubric import make_model
    from llmrubric.data import llm_rubric

    texts = llm_rubric_real_texts(shared_root / "real" / "real_data.json")
    texts = texts.assign(n=texts.text.str.len()).sort_values(["n", "text_id"]).head(3)[["text_id", "text"]]
    texts.to_csv(tmp_path / "t.csv", index=False)
    only_q0 = {**rubric.to_dict(), "questions": [q for q in rubric.to_dict()["questions"] if q["id"] == "Q0"]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(only_q0))
    tables = []
    for mode, extra in MODES.items():
        out = tmp_path / f"{mode}.csv"
        code = main([*cli_args(server, tmp_path / "t.csv", tmp_path / "r.yaml", out), "--mode", mode, *extra])
        printed = capsys.readouterr()
        if code == 2 and mode != "sampled":  # SmolLM2 rarely ends a reasoning with its answer line (40 tokens) and
            # often writes no valid JSON distribution (docs/extract.md: its parse rates): then one line, nothing written
            assert re.match(r"error: .*no features were obtained: 3 blocks without a result", printed.err), printed.err
            assert not out.exists() and any(status in printed.err for status in MODE_STATUSES), printed.err
            continue
        assert code == 0, printed.err
        summary = json.loads(printed.out.strip().splitlines()[-1])
        asked = 3 * (2 if mode != "verbalized" else 1)
        run = summary["this_run"]
        assert summary["done"] >= 1 and run["requests"] >= asked and run["output_tokens"] > 0, summary
        assert sum(summary["answers"].values()) >= asked and run["prompt_tokens"] > 0
        failures = pd.read_csv(tmp_path / f"{mode}.failures.csv")
        absent = failures[failures.status != "unparsed_answers"]  # the rest are present blocks that lost answers
        assert len(absent) == 3 - summary["done"] and absent.status.map(summary.get).gt(0).all()
        assert len(failures) - len(absent) == summary["unparsed_answers"]
        features = pd.read_csv(out)
        assert set(features.source) == {f"smollm2/llm_rubric:{mode}" + ("-k2" if mode != "verbalized" else "")}
        if mode == "verbalized":
            assert "samples" not in features.columns
        else:
            assert features.samples.between(1, 2).all()
            assert features.groupby("text_id").samples.nunique().eq(1).all()  # one value per block
            assert summary["answers"]["parsed"] == features.groupby("text_id").samples.first().sum()
        tables.append(features)
    combined = pd.concat(tables, ignore_index=True)
    combined.to_csv(tmp_path / "all.csv", index=False)
    assert len(validate_features(combined.copy(), rubric)) == len(combined)
    data = llm_rubric.load(shared_root, "real", rubric, features=tmp_path / "all.csv")
    model = make_model("ridge_judge", rubric).fit(data)
    predicted = model.predict(data)
    probs = predicted[[f"p_{v}" for v in range(1, 5)]].to_numpy()
    assert len(predicted) == len(data.annotations) > 0 and set(predicted.text_id) <= set(texts.text_id)
    # a value a judge never gave in these few texts has no probability (NaN); the rest sum to 1
    assert abs(np.nansum(probs, axis=1) - 1).max() < 1e-6 and predicted["mean"].between(1, 4).all()


def task(prompt: str, labels=("1", "2", "3", "4")) -> Task:
    return Task("t", "q", prompt, tuple(labels), tuple(labels), "t", "h", text_hash(prompt, *labels))


def read(server, tasks, mode, cache=None, endpoint="chat", **settings):
    backend = OpenAIBackend(
        "smollm2", server.url, endpoint=endpoint, api_key_env=None, concurrency=1, mode=mode, **settings
    )
    return extract(tasks, backend, cache if cache is not None else ResultCache(None), f"s:{mode}", progress=False)


LARGEST = "Which is the largest: '1', '2', '3' or '4'? Only print it.\nAnswer:"  # SmolLM2's greedy completion: " 4"


def test_the_reasoned_mode_reads_the_servers_own_reasoning_parser(server):
    """SmolLM2 writes a reasoning model's form under a grammar (``<think>…</think>``, then the answer line): the
    server moves the block into ``reasoning_content``, and the reasoned mode reads the answer from the content and
    keeps the reasoning; with ``reasoning_format: none`` the block stays in the content, and the answer is the same."""
    grammar = 'root ::= "<think>" [a-z] [a-z ]{0,40} "</think>\\nAnswer: " [1-4]'
    messages = [{"role": "user", "content": LARGEST}]
    body = {"model": "smollm2", "messages": messages, "max_tokens": 60, "temperature": 0, "grammar": grammar}
    parsed = server.post("chat/completions", body)["choices"][0]
    inline = server.post("chat/completions", {**body, "reasoning_format": "none"})["choices"][0]
    reasoning = parsed["message"].get("reasoning_content") or ""
    assert reasoning.strip() and "<think>" not in parsed["message"]["content"], parsed
    assert "<think>" in inline["message"]["content"] and not inline["message"].get("reasoning_content"), inline
    reader = OpenAIBackend("smollm2", server.url, api_key_env=None, mode="reasoned").reader
    index, status, kept = reader.sample_status(parsed, ("1", "2", "3", "4"))
    assert status == "parsed" and kept.startswith(reasoning) and parsed["message"]["content"].endswith(f" {index + 1}")
    assert reader.sample_status(inline, ("1", "2", "3", "4"))[:2] == (index, status)


def test_each_failure_the_weak_model_can_be_brought_to_is_counted_never_a_value(server):
    """Greedy answers: a question offering 'A'-'D' whose prompt lists numbers, a prompt that asks for prose, a
    reasoning of two tokens, a verbalized answer of six tokens without a grammar."""
    outside = read(
        server, [task(LARGEST, ("A", "B", "C", "D"))], "sampled", endpoint="completions", samples=2, temperature=0
    )
    assert outside.summary["outside_options"] == 1 and outside.summary["answers"] == {"outside_options": 2}
    prose = read(server, [task("Write one sentence about the sea.")], "sampled", samples=2, temperature=0)
    assert prose.summary["unparseable"] == 1 and prose.summary["answers"] == {"unparseable": 2}
    short = read(server, [task(LARGEST)], "reasoned", samples=2, max_tokens=2)
    assert short.summary["truncated_reasoning"] == 1 and short.summary["answers"] == {"truncated_reasoning": 2}
    broken = read(server, [task(LARGEST)], "verbalized", structured_output="none", max_tokens=6)
    assert broken.summary["invalid_json"] == 1 and broken.summary["answers"] == {"invalid_json": 2}
    for ex in (outside, prose, short, broken):
        assert ex.features.empty and ex.summary["done"] == 0 and len(ex.failures) == 1


def test_a_confident_judge_stops_early_and_one_that_never_parses_stops_at_the_maximum(server):
    """Greedy answers agree: their spread 0, shrunk toward 0.5, is sqrt(0.25 / n), within 0.15 n from 3 answers."""
    cache = ResultCache(None)
    settings = {"samples": 10, "samples_per_request": 1, "tolerance": 0.15, "temperature": 0}
    confident = read(server, [task(LARGEST)], "sampled", cache, "completions", **settings)
    assert confident.summary["this_run"]["requests"] == 3 and confident.summary["mean_samples"] == 3
    assert confident.features.prob.max() == 1.0 and confident.features.samples.eq(3).all()
    again = read(
        server, [task(LARGEST)], "sampled", cache, "completions", **settings
    )  # resumed: the block comes from the cache
    assert again.summary["cached"] == 1 and again.summary["this_run"]["requests"] == 0
    pd.testing.assert_frame_equal(again.features, confident.features)
    lost = read(
        server,
        [task("Write one sentence about the sea.")],
        "sampled",
        samples=3,
        samples_per_request=1,  # the server takes n up to its 2 slots (HTTP 400 above)
        tolerance=0.15,
        temperature=0,
    )
    assert lost.summary["this_run"]["requests"] == 3 and lost.summary["unparseable"] == 1


def test_a_dry_runs_prompt_tokens_are_the_servers_usage(server, tmp_path, capsys, monkeypatch):
    """The two shortest demo texts on two questions; both dry runs count with the config's tokenizer (the GGUF's),
    read once for the test (about 5 s a read)."""
    from llmrubric.extract import cost

    monkeypatch.setattr(cost, "load_tokenizer", functools.cache(cost.load_tokenizer))
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv")
    texts = texts.assign(n=texts.text.str.len()).sort_values(["n", "text_id"]).head(2)[["text_id", "text"]]
    texts.to_csv(tmp_path / "t.csv", index=False)
    rubric = {
        "name": "r",
        "questions": [
            q
            for q in yaml.safe_load((ROOT / "conf" / "rubric" / "llm_rubric.yaml").read_text())["questions"]
            if q["id"] in ("Q0", "Q1")
        ],
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rubric))
    argv = cli_args(server, tmp_path / "t.csv", tmp_path / "r.yaml", tmp_path / "f.csv")
    (plan,) = run_cli([*argv, "--dry-run"], capsys).values()
    assert not (tmp_path / "f.csv").exists() and plan["prompt_tokens_counted_by"] == "tokenizer"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real = run_cli([*argv, "--track", store], capsys)
    run = real["this_run"]
    assert run["requests"] == plan["requests"] == 4 and run["output_tokens"] == 4
    assert abs(plan["prompt_tokens"] - run["prompt_tokens"]) <= 0.05 * run["prompt_tokens"]
    import mlflow

    (logged,) = mlflow.MlflowClient(store).search_runs(
        [mlflow.MlflowClient(store).get_experiment_by_name("llmrubric-extract").experiment_id]
    )
    metrics = logged.data.metrics
    assert logged.data.params["mode"] == "logprob" and logged.data.tags["source"] == "smollm2/llm_rubric"
    assert {k: metrics[f"this_run.{k}"] for k in ("requests", "prompt_tokens", "output_tokens")} == {
        k: run[k] for k in ("requests", "prompt_tokens", "output_tokens")
    }
    assert plan["cached"] == 0 and plan["context_tokens"] == 8192 and plan["prompts_over_context"] == 0
    assert run["prompt_tokens"] / run["requests"] <= plan["longest_prompt_tokens"] < run["prompt_tokens"]
    (resumed,) = run_cli([*argv, "--dry-run"], capsys).values()  # the cache holds every block now: nothing to pay
    assert (resumed["cached"], resumed["blocks"], resumed["requests"], resumed["prompt_tokens"]) == (4, 0, 0, 0)
