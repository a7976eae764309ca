"""What a local GGUF model costs before its first answer, and per prompt (issue 33): SmolLM2-135M-Instruct loaded
from its GGUF file (transformers parses and de-quantises it) and from the converted copy that load keeps in a
fresh ``gguf_cache`` (:mod:`llmrubric.extract.converted`), whether the two give the same weights, tokens and
logits; then the demo texts' prompts (``data/demo_llm``, the questions without references) scored with each
label prefix the server benchmark uses, with the prefill tokens and seconds of each.

    .venv/bin/python benchmarks/local_model.py [--texts d01 d09] [--threads 1] [--out benchmarks/results/local_model.json]

Needs the GGUF (``make setup``). Seconds are wall seconds on this machine; prefill tokens do not depend on it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from common import ROOT, code_version, exit_code, write_result

from llmrubric.extract import models
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.io.rubric import Rubric

QUESTIONS = ["Q0", "Q1", "Q6", "Q7", "Q8"]  # those that need no references


def timed(load):
    start = time.perf_counter()
    out = load()
    return out, round(time.perf_counter() - start, 2)


def same_model(one, other, text: str) -> dict:
    """Whether two (model, tokenizer) pairs hold the same weights and give ``text`` the same ids and logits."""
    (m1, t1), (m2, t2) = one, other
    ids1, ids2 = t1(text).input_ids, t2(text).input_ids
    s1, s2 = m1.state_dict(), m2.state_dict()
    with torch.inference_mode():
        logits = torch.equal(m1(torch.tensor([ids1])).logits, m2(torch.tensor([ids1])).logits)
    return {
        "weights_equal": s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1),
        "token_ids_equal": ids1 == ids2,
        "chat_template_equal": t1.chat_template == t2.chat_template,
        "logits_equal": logits,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--texts", nargs="+", default=["d01", "d09"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "local_model.json")
    args = parser.parse_args(argv)
    version = code_version()  # the code this run measures, compared at the end
    torch.set_num_threads(args.threads)
    files = models.resolve(args.model)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    subset = Rubric.from_dict(
        {"name": "no_references", "questions": [q for q in rubric.to_dict()["questions"] if q["id"] in QUESTIONS]}
    )
    texts = pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv")
    tasks, _ = likert_tasks(texts[texts.text_id.isin(args.texts)], subset, PromptTemplate("llm_rubric"))
    with tempfile.TemporaryDirectory() as cache:
        first, convert_s = timed(lambda: models.load(files, torch.float32, cache))
        copy, copy_s = timed(lambda: models.load(files, torch.float32, cache))
        copy_mb = sum(p.stat().st_size for p in Path(cache).rglob("*") if p.is_file()) / 2**20
    load = {
        "from_gguf_and_saving_the_copy_seconds": convert_s,
        "from_the_copy_seconds": copy_s,
        "copy_megabytes": round(copy_mb),
        **same_model(first, copy, tasks[0].prompt),
    }
    model, tokenizer = copy
    scoring = {}
    for name, kwargs in {
        "chat": {"chat_template": True},
        "no_space": {"label_prefix": ""},
        "space": {"label_prefix": " "},
        "newline": {"label_prefix": "\n"},
    }.items():
        backend = TransformersBackend(model, tokenizer, model_id=name, batch_size=4, **kwargs)
        _, seconds = timed(lambda b=backend: list(b.score(tasks)))
        scoring[name] = {"seconds": seconds, **{k: backend.stats[k] for k in ("prefill_tokens", "forward_passes")}}
    out = {
        "model": files.name,
        "threads": args.threads,
        "prompts": len(tasks),
        "load": load,
        "scoring": scoring,
    }
    print(write_result(out, args.out, version).read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
