"""The modes without logprobs (docs/extract.md, "Modes without logprobs"): how generated answers are read and
counted, the cache keys and records of the modes, the samples column, the dry run's plan, and the failures a local
socket provokes (a server that never answers in time, a refusal in OpenAI's documented shape). The modes against
the real llama.cpp server: tests/test_llama_modes.py."""

from __future__ import annotations

import json
import socket

import pandas as pd
import pytest
from support.judge_server import REFUSAL, judge
from support.paths import ROOT

from llmrubric.cli import main
from llmrubric.extract.answers import choose, final_answer, refused, verbalized
from llmrubric.extract.backends import make_backend_from
from llmrubric.extract.backends.base import Backend
from llmrubric.extract.backends.generation import ModeSettings, mode_prompt
from llmrubric.extract.backends.openai_backend import OpenAIBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.cost import plan
from llmrubric.extract.prompts import text_hash
from llmrubric.extract.runner import extract
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError
from llmrubric.io.tables import validate_features

LABELS = ("1", "2", "3", "4")


def task(text_id="t1", qid="Q0"):
    prompt = f"Conversation: hi from {text_id}\nQuestion: good?\nAnswer:"
    return Task(text_id, qid, prompt, LABELS, LABELS, text_id, "h", text_hash(prompt, *LABELS))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3", (2, "parsed")),
        (" 4. Very likely", (3, "parsed")),
        ("**2**", (1, "parsed")),
        ("7", (None, "outside_options")),
        ("12", (None, "outside_options")),
        ("Maybe.", (None, "outside_options")),
        ("The answer depends on the user", (None, "unparseable")),
        ("1 + 1 = 2", (None, "unparseable")),
        ("3 - likely", (2, "parsed")),
        ("", (None, "unparseable")),
        ("1.\n2.", (None, "several_options")),  # SmolLM2 lists the options: no answer, never its first
        ("1, 2, 3", (None, "several_options")),
        ("2 or 3", (None, "several_options")),
        ("1. Not at all\n2. Somewhat\n3. Mostly", (None, "several_options")),
        ("3\n\nThe user was helped by 2 people", (2, "parsed")),
    ],
)
def test_a_short_answer_is_an_option_or_a_counted_status(text, expected):
    assert choose(text, LABELS) == expected


def test_the_longest_label_that_fits_wins_and_words_are_options_too():
    assert choose("not_support, clearly", ("support", "not_support")) == (1, "parsed")
    assert choose("Support", ("support", "not_support")) == (0, "parsed")
    assert choose("supported", ("support", "not_support")) == (None, "outside_options")


def test_a_reasoning_is_read_at_its_last_answer_line():
    assert final_answer("Answer: maybe 1\nThe user got help.\nAnswer: 3") == " 3"
    assert final_answer("It is fine.\n\n4") == "4"
    assert choose(final_answer("Thinking...\nFinal answer: 2."), LABELS) == (1, "parsed")


def test_a_verbalized_distribution_is_checked_and_renormalised():
    probs, status = verbalized('{"1": 0.1, "2": 0.2, "3": 0.3, "4": 0.42}', LABELS, 0.05)
    assert status == "parsed" and probs == pytest.approx([0.1 / 1.02, 0.2 / 1.02, 0.3 / 1.02, 0.42 / 1.02])
    assert verbalized('```json\n{"1": 1, "2": 0, "3": 0, "4": 0}\n```', LABELS, 0.0)[1] == "parsed"
    assert verbalized('{"1": 0.5, "2": 0.5}', LABELS, 0.1) == (None, "invalid_json")
    assert verbalized('{"1": 0.5, "2": 0.5, "3": 0.1', LABELS, 0.1) == (None, "invalid_json")
    assert verbalized('{"1": -0.1, "2": 0.6, "3": 0.3, "4": 0.2}', LABELS, 0.1) == (None, "invalid_probabilities")
    assert verbalized('{"1": 0.5, "2": 0.5, "3": 0.5, "4": 0.5}', LABELS, 0.1) == (None, "invalid_probabilities")
    assert verbalized('{"1": true, "2": 0, "3": 0, "4": 0}', LABELS, 0.1) == (None, "invalid_probabilities")


def test_a_refusal_is_what_the_server_flags():
    assert refused({"finish_reason": "content_filter", "message": {"content": ""}})
    assert refused({"finish_reason": "stop", "message": {"content": None, "refusal": "I can't help with that."}})
    assert not refused({"finish_reason": "stop", "message": {"content": "3", "refusal": None}})


def test_a_bad_mode_setting_is_one_line_naming_it():
    with pytest.raises(InputError, match="extract setting mode: 'sample' is not allowed"):
        ModeSettings("sample")
    with pytest.raises(InputError, match="extract setting tolerance"):
        ModeSettings("sampled", tolerance=2.0)
    with pytest.raises(InputError, match="mode 'sampled' reads generated answers from a server"):
        make_backend_from({"backend": "transformers", "model": "m", "mode": "sampled"})


def test_the_cache_key_holds_the_mode_and_its_settings():
    ids = {
        OpenAIBackend("m", "http://127.0.0.1:9/v1", **kw).model_id
        for kw in (
            {},
            {"mode": "sampled"},
            {"mode": "sampled", "samples": 20},
            {"mode": "sampled", "temperature": 0.7},
            {"mode": "sampled", "tolerance": 0.1},
            {"mode": "reasoned"},
            {"mode": "reasoned", "max_tokens": 64},
            {"mode": "verbalized"},
            {"mode": "verbalized", "structured_output": "none"},
        )
    }
    assert len(ids) == 9
    assert OpenAIBackend("m", "http://127.0.0.1:9/v1", mode="sampled", sum_tolerance=0.3).model_id in ids


def test_a_mode_prompt_is_the_family_prompt_then_its_instruction():
    t = task()
    assert mode_prompt(t, "sampled") == t.prompt
    for mode, words in (("verbalized", "JSON object"), ("reasoned", "think step by step")):
        prompt = mode_prompt(t, mode)
        assert prompt.startswith(t.prompt) and words in prompt and "'4'" in prompt


def test_a_sampled_block_keeps_its_record_in_the_cache_and_writes_samples(tmp_path):
    detail = {"mode": "sampled", "samples": 3, "counts": {"1": 0, "2": 1, "3": 2, "4": 0}, "answers": ["3", "2", "3"]}
    detail["statuses"] = {"parsed": 3, "unparseable": 1}
    sampled = Result(task("a"), {"1": 0.0, "2": 1 / 3, "3": 2 / 3, "4": 0.0}, detail=detail)
    logprob = Result(task("b"), {"1": 0.1, "2": 0.2, "3": 0.3, "4": 0.4})
    cache = ResultCache(tmp_path / "c.sqlite")
    for r in (sampled, logprob):
        cache.put("m", r)
    assert cache.get("m", task("a")).detail == detail and cache.get("m", task("b")).detail == {}
    other = ResultCache(tmp_path / "d.sqlite")
    assert other.merge(tmp_path / "c.sqlite") == 2 and other.get("m", task("a")).detail == detail
    ex = extract([task("a"), task("b")], _Cached(), cache, "s:sampled", progress=False)
    features = validate_features(ex.features)
    samples = features.groupby("text_id").samples.agg(["min", "max", lambda s: s.isna().all()])
    assert samples.loc["a", "min"] == samples.loc["a", "max"] == 3 and samples.loc["b"].iloc[2]
    assert ex.summary["mean_samples"] == 3 and ex.summary["answers"] == {"parsed": 3, "unparseable": 1}
    assert ex.failures[["text_id", "status"]].values.tolist() == [["a", "unparsed_answers"]]
    assert ex.failures.reason[0] == "1 of 4 answers were not read ({'unparseable': 1})"


class _Cached(Backend):
    """A backend that answers nothing: extract reads the cache only."""

    model_id = "m"
    stats = None

    def score(self, tasks):
        assert not tasks
        return iter(())


def test_the_dry_run_plans_requests_tokens_and_cost_per_mode():
    tasks = [task(f"t{i}") for i in range(3)]
    base = {"backend": "openai", "endpoint": "chat", "price": {"prompt": 1.0, "output": 10.0}}
    logprob = plan(tasks, {**base, "mode": "logprob"}, None)
    chars = sum(len(t.prompt) for t in tasks)
    assert logprob["requests"] == 3 and logprob["prompt_tokens"] >= chars / 4
    assert logprob["prompt_tokens_counted_by"].startswith("estimate")
    sampled = plan(tasks, {**base, "mode": "sampled", "samples": 10, "samples_per_request": 4}, len)
    assert sampled["requests"] == 9 and sampled["prompt_tokens"] == 3 * chars
    assert sampled["output_tokens_at_most"] == 3 * 10 * 8 and sampled["prompt_tokens_counted_by"] == "tokenizer"
    assert sampled["cost_at_most"] == pytest.approx((3 * chars + 10 * 240) / 1e6)
    verbal = plan(tasks, {**base, "mode": "verbalized"}, len)
    assert verbal["requests"] == 3 and verbal["requests_at_most"] == 6
    assert "prompts_over_context" not in verbal and verbal["longest_prompt_tokens"] == len(
        mode_prompt(tasks[0], "verbalized")
    )


def test_the_dry_run_counts_the_prompts_that_with_their_output_exceed_the_context():
    tasks = [task("t1"), task("a much longer text id, t22")]
    lengths = [len(t.prompt) for t in tasks]
    settings = {"backend": "openai", "mode": "sampled", "max_tokens": 8}
    assert plan(tasks, settings, len)["longest_prompt_tokens"] == max(lengths)
    over = lambda context, **kw: plan(tasks, {**settings, **kw, "context_tokens": context}, len)["prompts_over_context"]
    assert over(max(lengths) + 8) == 0 and over(max(lengths) + 7) == 1 and over(min(lengths) + 7) == 2
    assert over(max(lengths) + 1, mode="logprob") == 0 and over(max(lengths), mode="logprob") == 1  # 1 output token
    with pytest.raises(InputError, match="extract setting context_tokens: 0 is not"):
        over(0)
    figures = plan(tasks, {**settings, "samples": 6, "samples_per_request": 2, "context_tokens": max(lengths)}, len)
    assert figures["prompt_tokens_over_context"] == 3 * max(lengths)  # the longer prompt, its 3 requests


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(2)
    texts.to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / "f.csv"
    argv = ["extract", "features", str(tmp_path / "t.csv"), "--config", str(ROOT / "conf" / "extract" / "openai.yaml")]
    argv += ["--rubric", str(ROOT / "conf" / "rubric" / "llm_rubric.yaml"), "--out", str(out), "--mode", "reasoned"]
    argv += ["--set", "price.prompt=0.15", "--set", "price.output=0.6", "--dry-run"]
    assert main([*argv, "--set", "context_tokens=0"]) == 2
    assert capsys.readouterr().err.strip() == "error: extract setting context_tokens: 0 is not a whole number >= 1"
    assert main([*argv, "--set", "context_tokens=600"]) == 0  # each prompt and its 512 tokens of reasoning
    (source, figures), *rest = json.loads(capsys.readouterr().out.strip().splitlines()[-1]).items()
    assert not rest and source == "gpt-4o-mini/llm_rubric:reasoned-k10"
    assert figures["prompt_tokens"] / figures["requests"] <= figures["longest_prompt_tokens"]  # the mean, the most
    assert figures["prompts_over_context"] == figures["blocks"] and figures["context_tokens"] == 600
    assert figures["requests"] == figures["blocks"] * 2 and figures["output_tokens_at_most"] == figures["blocks"] * 5120
    assert figures["cost_at_most"] > figures["cost_prompt_tokens"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_a_server_that_never_answers_in_time_is_a_timeout_never_a_value():
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        backend = OpenAIBackend("m", url, api_key_env=None, mode="sampled", timeout=0.5, max_retries=0)
        ex = extract([task()], backend, ResultCache(None), "s:sampled", progress=False)
    assert ex.features.empty and ex.summary["timeout"] == 1 and ex.summary["done"] == 0
    assert ex.failures.status.tolist() == ["timeout"]
    assert ex.failures.reason[0].startswith("timeout: no answer within 0.5 s")


@pytest.mark.parametrize("mode", ["sampled", "verbalized"])
def test_a_refusal_is_counted_never_a_value(mode):
    with judge() as url:
        backend = OpenAIBackend("m", url, api_key_env=None, mode=mode, samples=3, samples_per_request=1)
        ex = extract([task()], backend, ResultCache(None), f"s:{mode}", progress=False)
    asked = 3 if mode == "sampled" else 2  # three samples; one verbalized request and its retry
    assert ex.features.empty and ex.summary["refusal"] == 1 and ex.summary["answers"] == {"refusal": asked}
    assert ex.summary["this_run"]["requests"] == asked and ex.summary["this_run"]["output_tokens"] == 7 * asked


def judged_run(tmp_path, url: str, *extra: str) -> tuple[list[str], pd.DataFrame]:
    """``extract features`` argv of two demo texts against the server at ``url`` (sampled, one answer a block)."""
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(2)
    texts.to_csv(tmp_path / "t.csv", index=False)
    argv = ["extract", "features", str(tmp_path / "t.csv"), "--config", str(ROOT / "conf" / "extract" / "openai.yaml")]
    argv += ["--out", str(tmp_path / "f.csv"), "--mode", "sampled", "--samples", "1", "--no-progress"]
    argv += ["--set", f"base_url={url}", "--set", "api_key_env=null", *extra]
    return argv, texts


def test_a_run_whose_every_block_fails_writes_nothing_but_its_cache(tmp_path, capsys):
    with judge() as url:
        argv, _ = judged_run(tmp_path, url)
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no features were obtained: 18 blocks without a result (refusal 18" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv.cache.sqlite", "t.csv"]
    assert ResultCache(tmp_path / "f.csv.cache.sqlite").count("refusal") == 18


def refusing_the_first(texts: pd.DataFrame):
    """A judge's reply: a refusal of the first text's prompts, ``3`` to the others."""
    first = texts.text.iloc[0].splitlines()[0]
    return lambda prompt: REFUSAL if first in prompt else {"role": "assistant", "content": "3"}


def test_a_partly_failed_run_writes_its_features_and_failures(tmp_path, capsys):
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(2)
    with judge(refusing_the_first(texts)) as url:
        argv, _ = judged_run(tmp_path, url)
        assert main(argv) == 0
    features, failures = pd.read_csv(tmp_path / "f.csv"), pd.read_csv(tmp_path / "f.failures.csv")
    assert set(features.text_id) == {texts.text_id[1]} and set(failures.text_id) == {texts.text_id[0]}
    assert set(failures.status) == {"refusal"} and len(failures) == 9
    summary = json.loads((tmp_path / "f.summary.json").read_text())
    assert summary["done"] == 9 and summary["refusal"] == 9 and summary["this_run"]["requests"] == 18


def test_the_dry_run_plans_only_what_the_cache_does_not_hold(tmp_path, capsys):
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(2)
    with judge(refusing_the_first(texts)) as url:
        argv, _ = judged_run(tmp_path, url)
        assert main(argv) == 0
    files = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    plans = []
    for extra in ([], ["--samples", "2"], ["--cache", str(tmp_path / "none.sqlite")]):
        capsys.readouterr()
        assert main([*argv, *extra, "--dry-run"]) == 0
        plans.append(next(iter(json.loads(capsys.readouterr().out.strip().splitlines()[-1]).values())))
    resumed, other_key, no_cache = plans
    assert (resumed["cached"], resumed["blocks"], resumed["requests"]) == (9, 9, 9)  # the 9 refused prompts
    assert 0 < resumed["prompt_tokens"] < no_cache["prompt_tokens"]
    assert (other_key["cached"], other_key["blocks"], other_key["output_tokens_at_most"]) == (0, 18, 18 * 2 * 8)
    assert (no_cache["cached"], no_cache["blocks"]) == (0, 18)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == files


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])  # DeepSeek and vLLM; newer vLLM
def test_a_reasoning_returned_apart_is_kept_in_the_cache_and_only_the_final_answer_counts(field, tmp_path):
    reasoning = "The assistant helped a little. Answer: 1 would be too harsh, 4 too kind."
    message = {"role": "assistant", "content": "3", field: reasoning}
    cache = ResultCache(tmp_path / "c.sqlite")
    with judge(lambda prompt: message) as url:
        backend = OpenAIBackend("m", url, api_key_env=None, mode="reasoned", samples=4, samples_per_request=2)
        ex = extract([task()], backend, cache, "s:reasoned", progress=False)
    assert (
        ex.summary["done"] == 1 and ex.summary["answers"] == {"parsed": 4} and ex.summary["this_run"]["requests"] == 2
    )
    assert ex.features.set_index("option").prob.to_dict() == {"1": 0.0, "2": 0.0, "3": 1.0, "4": 0.0}
    assert ex.features.samples.eq(4).all()
    detail = cache.get(backend.model_id, task()).detail
    assert detail["counts"] == {"1": 0, "2": 0, "3": 4, "4": 0} and detail["statuses"] == {"parsed": 4}
    assert detail["answers"] == [reasoning + "\n3"] * 4
