"""Extractor benchmark → ``benchmarks/results/extract.json``.

Prefill tokens for the 223 real LLM-Rubric dialogues × 9 rubric questions, naive (every
prompt in full) vs. shared-prefix reuse, counted by the transformers backend's own
tokenisation and prefix detection with a tiny BPE tokenizer trained on the dialogues; then
CPU throughput of a tiny random Llama (hidden 32, 2 layers) on a few dialogues, truncated
to a small context. No GPU here: ``gpu`` is null with the reason.

Usage: ``python benchmarks/extract.py [--data ../shared/data/llm-rubric/real/real_data.json] [--timed 6]``
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from common import code_version, write_result

from llmrubric.extract.adapters import llm_rubric_real_texts
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import extract
from llmrubric.io.rubric import Rubric

ROOT = Path(__file__).resolve().parents[1]


def tiny_tokenizer(corpus: list[str], vocab_size: int = 1000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_llama(tokenizer, max_positions: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--data", default=str(ROOT.parent / "shared" / "data" / "llm-rubric" / "real" / "real_data.json")
    )
    parser.add_argument("--rubric", default=str(ROOT / "conf" / "rubric" / "llm_rubric.yaml"))
    parser.add_argument("--timed", type=int, default=6, help="dialogues run through the tiny model for timing")
    parser.add_argument(
        "--context", type=int, default=1024, help="context of the timed tiny model (texts truncated from the middle)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "extract.json"))
    args = parser.parse_args()
    version = code_version()  # the code this run measures, compared at the end
    torch.set_num_threads(1)

    texts = llm_rubric_real_texts(args.data)
    rubric = Rubric.load(args.rubric)
    tasks, skipped = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    tok = tiny_tokenizer(texts.text.tolist())
    model = tiny_llama(tok, max_positions=args.context)
    counter = TransformersBackend(model, tok, max_length=10**7)  # counts only: nothing truncated
    plan = counter.prefill_plan(tasks)
    every = Rubric.from_dict(
        {"name": rubric.name, "questions": [{**q, "applicable_if": None} for q in rubric.to_dict()["questions"]]}
    )
    all_plan = counter.prefill_plan(likert_tasks(texts, every, PromptTemplate("llm_rubric"))[0])
    result = {
        "texts": len(texts),
        "questions": len(rubric.questions),
        "masked_blocks": len(skipped),
        **plan,
        "prefix_token_ratio": plan["shared_prefill_tokens"] / plan["naive_prefill_tokens"],
        "all_questions": {
            **all_plan,
            "prefix_token_ratio": all_plan["shared_prefill_tokens"] / all_plan["naive_prefill_tokens"],
            "note": "every text asked all 9 questions (applicability rules off)",
        },
        "tokenizer": f"byte-level BPE, vocab {len(tok)}, trained on the dialogues",
    }

    timed_ids = set(texts.text_id[: args.timed])
    timed = [t for t in tasks if t.text_id in timed_ids]
    cpu = {
        "model": "random Llama, hidden 32, 2 layers, 4 heads, float32",
        "context": args.context,
        "threads": 1,
        "prompts": len(timed),
    }
    for name, reuse in (("reuse", True), ("naive", False)):
        backend = TransformersBackend(model, tok, max_length=args.context, prefix_reuse=reuse, batch_size=9)
        start = time.perf_counter()
        ex = extract(timed, backend, ResultCache(None), "bench", progress=False)
        seconds = time.perf_counter() - start
        cpu[name] = {
            "seconds": round(seconds, 3),
            "prompts_per_s": round(len(timed) / seconds, 2),
            "prefill_tokens": backend.stats["prefill_tokens"],
            "truncated": ex.summary["truncated"],
            "failed": ex.summary["failed"],
        }
    cpu["processor"] = platform.processor() or platform.machine()
    result["cpu_tiny"] = cpu
    result["gpu"] = None
    result["gpu_reason"] = "no GPU in this environment; the 8B Llama bf16 throughput figure was not measured"
    write_result(result, args.out, version)
    print(result)


if __name__ == "__main__":
    main()
