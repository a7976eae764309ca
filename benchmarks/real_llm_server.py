"""Part ``server`` of ``benchmarks/real_llm.py``: the OpenAI backend against llama.cpp's real
OpenAI-compatible server (``llmrubric models serve``, optional group ``server``) vs the transformers backend,
SmolLM2-135M-Instruct (the same GGUF), on the same prompts: the ``--server-dialogues`` shortest real
LLM-Rubric dialogues (ties by text_id, chosen without labels) × their applicable rubric questions.

- ``chat``: the server's ``/chat/completions`` (it applies the GGUF's chat template) vs transformers
  with ``chat_template: true`` (the tokenizer's template, labels right after the assistant turn opens);
- ``completions``: ``/completions`` on the raw prompt, which counts ``"1"`` and, after each whitespace token
  at least 0.05 likely (whitespace continuation), ``"1"`` again, vs transformers' ``"1"`` plus ``" 1"`` plus
  ``"\n1"`` (``label_prefix`` ``""``, ``" "`` and ``"\n"``): they differ by the mass of the whitespace
  tokens the server does not follow (or follows beyond those two).

Reported per endpoint: the largest and mean probability difference, per question the Pearson
correlation of expected answers, label-mass medians, prompt tokens (the server's ``usage`` against
the transformers tokenizer's count: equal means the same template and special tokens), seconds.
``--record DIR`` also stores raw responses of the server (tests/data/llama_cpp/) for the parser tests.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from llmrubric.config import load_file
from llmrubric.extract import models
from llmrubric.extract.adapters import llm_rubric_real_texts
from llmrubric.extract.backends.openai_backend import OpenAIBackend
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import assemble
from llmrubric.io.rubric import Rubric

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from real_llm_probe import shortest  # noqa: E402
from support.llama_server import LlamaServer, compare, unavailable  # noqa: E402


def features(tasks, backend, rubric) -> tuple[pd.DataFrame, list, float]:
    """The features table of ``tasks``, the results, and the seconds they took."""
    start = time.perf_counter()
    results = list(backend.score(tasks))
    seconds = round(time.perf_counter() - start, 1)
    ex = assemble(
        tasks, {(r.task.template_hash, r.task.key, r.task.question_id): r for r in results}, "bench", (), rubric
    )
    return ex.features, results, seconds


def summed(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two features tables of the same blocks, their probabilities added option by option."""
    keys = ["text_id", "source", "question_id", "option"]
    both = a.merge(b, on=keys, suffixes=("", "_b"))
    return both.assign(prob=both.prob + both.prob_b)[[*keys, "prob"]]


def same_tokens(server: LlamaServer, tasks, backend: TransformersBackend, reference: pd.DataFrame) -> dict:
    """The server fed the transformers tokenizer's ids of each chat prompt (llama.cpp's ``/completion`` takes token
    ids): its label probabilities against transformers' (the kernels alone; a label outside its 1,000 most likely
    next tokens is not compared) and, per prompt, whether the server's own tokenizer (``/tokenize``) gives the same
    ids (it tokenises the text itself)."""
    rows, same = [], 0
    for t in tasks:
        p = backend.tokens.prepare(t)
        text = backend.tokens.prompt_text(t.prompt)
        own = server.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
        same += own == p.ids
        answer = server.post("/completion", {"prompt": p.ids, "n_predict": 1, "n_probs": 1000, "temperature": 0})
        top = {e["id"]: math.exp(e["logprob"]) for e in answer["completion_probabilities"][0]["top_logprobs"]}
        for option, label in zip(t.options, p.labels):
            if label[0] in top:
                rows.append({"text_id": t.text_id, "question_id": t.question_id, "option": option, "p": top[label[0]]})
    mine = pd.DataFrame(rows).merge(reference, on=["text_id", "question_id", "option"])
    return {
        "max_abs_prob_diff": round(float((mine.p - mine.prob).abs().max()), 4),
        "mean_abs_prob_diff": round(float((mine.p - mine.prob).abs().mean()), 5),
        "labels_compared": len(mine),
        "prompts_llama_cpp_tokenises_alike": same,
    }


def record(server: LlamaServer, rubric: Rubric, out: Path) -> list[str]:
    """Raw responses of the server for one prompt (the first shipped text of ``data/demo_llm``, question Q0):
    both endpoints, the completions continuations the backend asks for, a chat request without
    ``top_logprobs``, and a prompt longer than the context."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(1)
    prompt = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))[0][0].prompt
    chat = {"model": "smollm2", "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 20}
    completions = {"model": "smollm2", "max_tokens": 1, "temperature": 0, "logprobs": 20}
    cases = {
        "chat": ("chat/completions", {**chat, "messages": [{"role": "user", "content": prompt}]}),
        "completions": ("completions", {**completions, "prompt": prompt}),
        "chat_without_top_logprobs": (
            "chat/completions",
            {**chat, "top_logprobs": None, "messages": [{"role": "user", "content": prompt}]},
        ),
        "completions_overflow": (
            "completions",
            {**completions, "prompt": "word " * (int(server.settings["context"]) + 100) + prompt},
        ),
    }
    first = server.post("completions", {**completions, "prompt": prompt})["choices"][0]["logprobs"]["top_logprobs"][0]
    for token, logprob in first.items():  # the continuations the backend asks for (whitespace_min_prob 0.05)
        if token and not token.strip() and math.exp(logprob) >= 0.05:
            name = {" ": "space", "\n": "newline"}.get(token, f"whitespace{len(cases)}")
            cases[f"completions_after_{name}"] = ("completions", {**completions, "prompt": prompt + token})
    written = []
    for name, (path, body) in cases.items():
        response = server.post(path, body)
        if name == "completions_overflow":
            body = {**body, "prompt": f"'word ' x {int(server.settings['context']) + 100} + the prompt of chat.json"}
        file = out / f"{name}.json"
        file.write_text(json.dumps({"path": path, "request": body, "response": response}, indent=1) + "\n")
        written.append(str(file.relative_to(ROOT)))
    return written


def server(args, cfg: dict) -> dict:
    why = unavailable()
    if why:
        raise SystemExit(f"part server: {why}")
    rubric = Rubric.load(ROOT / cfg["rubric"])
    texts = shortest(llm_rubric_real_texts(args.data), args.server_dialogues)
    tasks, _ = likert_tasks(texts, rubric, PromptTemplate(cfg.get("template") or "llm_rubric"))
    model = str(ROOT / cfg["model"])
    out: dict = {"dialogues": len(texts), "prompts": len(tasks), "model": Path(model).name, "endpoints": {}}
    local = {}
    weights, tokenizer = models.load(models.resolve(model), torch.float32, cfg.get("gguf_cache"))
    for name, kwargs in {
        "chat": {"chat_template": True},
        "space": {"chat_template": False, "label_prefix": " "},
        "no_space": {"chat_template": False, "label_prefix": ""},
        "newline": {"chat_template": False, "label_prefix": "\n"},
    }.items():
        backend = TransformersBackend(weights, tokenizer, model_id=name, batch_size=cfg.get("batch_size", 4), **kwargs)
        local[name] = features(tasks, backend, rubric)
        if name in ("chat", "space"):
            local[f"{name}_tokens"] = {t.key: len(backend.tokens.prepare(t).ids) for t in tasks}
        if name == "chat":
            chat_backend = backend
    local["completions"] = (
        summed(summed(local["space"][0], local["no_space"][0]), local["newline"][0]),
        None,
        local["space"][2] + local["no_space"][2] + local["newline"][2],
    )
    log = ROOT / "outputs" / "real_llm_bench" / "llama_server.log"
    with LlamaServer(log, model) as srv:
        out["server"] = {
            "command": " ".join(srv.command()[1:]).replace(str(ROOT) + "/", ""),
            "context": srv.settings["context"],
            "parallel": srv.settings["parallel"],
        }
        # (the key of the results of 4758dd4, when llama.cpp ran in this process)
        out["chat_same_tokens_in_process"] = same_tokens(srv, tasks, chat_backend, local["chat"][0])
        for endpoint, reference, tokens in (
            ("chat", "chat", "chat_tokens"),
            ("completions", "completions", "space_tokens"),
        ):
            backend = OpenAIBackend(
                srv.settings["alias"],
                srv.url,
                endpoint=endpoint,
                api_key_env=None,
                concurrency=srv.settings["parallel"],
                timeout=300,
                top_logprobs=load_file(ROOT / "conf" / "extract" / "llama_cpp.yaml")["top_logprobs"],
            )
            feats, results, seconds = features(tasks, backend, rubric)
            prompt_tokens = {r.task.key: r.prompt_tokens for r in results}
            same = sum(prompt_tokens[k] == n for k, n in local[tokens].items())
            out["endpoints"][endpoint] = {
                "against": {
                    "chat": "transformers, chat_template: true",
                    "completions": "transformers, label_prefix '' + ' ' + newline",
                }[endpoint],
                **compare(feats, local[reference][0]),
                "server_status": pd.Series([r.status for r in results]).value_counts().to_dict(),
                "requests": backend.stats["requests"],
                "prompts_with_equal_token_counts": same,
                "server_seconds": seconds,
                "transformers_seconds": local[reference][2],
            }
        if args.record:
            out["recorded"] = record(srv, rubric, Path(args.record))
    out["note"] = (
        "transformers de-quantises the Q4_1 weights to float32, llama.cpp multiplies them with activations rounded "
        "to 8 bits (chat_same_tokens_in_process: the kernels alone); both read the same prompt tokens since issue 33 "
        "(llmrubric.extract.models.split_digits_first: the GGUF's smollm pre-tokenizer, as llama.cpp applies it)"
    )
    return out
