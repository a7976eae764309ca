"""Which tokens SmolLM2 reads (issue 33): the chat prompts of the ``--dialogues`` shortest real LLM-Rubric
dialogues (the server benchmark's, ``benchmarks/real_llm_server.py``) tokenised by llama.cpp (its server's
``/tokenize``; the reference implementation of the GGUF file's tokenizer, as the server applies it) and by the tokenizer
``transformers`` builds from the same file, with GPT-2's split (as built) and with the file's digits-first
split (``llmrubric.extract.models.split_digits_first``, what ``models.load`` now returns).

    .venv/bin/python benchmarks/prompt_tokens.py [--dialogues 10] [--out benchmarks/results/prompt_tokens.json]

Per tokenizer: prompts whose ids equal llama.cpp's, prompts whose every label continuation does too, and the
token-count differences. Needs llama.cpp's server (optional group ``server``) and the GGUF (``make setup``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import transformers
from common import ROOT, code_version, llm_rubric_default, write_result
from real_llm_probe import shortest

from llmrubric.extract import models
from llmrubric.extract.adapters import llm_rubric_real_texts
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.io.rubric import Rubric

sys.path.insert(0, str(ROOT / "tests"))
from support.llama_server import LlamaServer  # noqa: E402


def compare(tokenizer, server: LlamaServer, tasks) -> dict:
    """How many chat prompts (and label continuations) ``tokenizer`` gives llama.cpp's ids."""
    reference = lambda text: server.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})[
        "tokens"
    ]
    same = labels = 0
    extra = set()
    for t in tasks:
        chat = [{"role": "user", "content": t.prompt}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text)["input_ids"]
        same += ids == reference(text)
        labels += all(tokenizer(text + label)["input_ids"] == reference(text + label) for label in t.labels)
        extra.add(len(ids) - len(reference(text)))
    return {"prompts_with_llama_cpp_ids": same, "with_llama_cpp_label_ids": labels, "extra_tokens": sorted(extra)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=10)
    parser.add_argument("--data", default=str(Path(llm_rubric_default()) / "real" / "real_data.json"))
    parser.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prompt_tokens.json")
    args = parser.parse_args()
    version = code_version()  # the code this run measures, compared at the end
    files = models.resolve(args.model)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    texts = shortest(llm_rubric_real_texts(args.data), args.dialogues)
    tasks, _ = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    built = transformers.AutoTokenizer.from_pretrained(files.folder, gguf_file=files.gguf_file)
    split = transformers.AutoTokenizer.from_pretrained(files.folder, gguf_file=files.gguf_file)
    pre = models.gguf_pre_tokenizer(files)
    with tempfile.TemporaryDirectory() as tmp, LlamaServer(Path(tmp) / "server.log", args.model) as server:
        out = {
            "model": files.name,
            "gguf_pre_tokenizer": pre,
            "dialogues": len(texts),
            "prompts": len(tasks),
            "gpt2_split": compare(built, server, tasks),
            "digits_first_split": compare(split, server, tasks) if models.split_digits_first(split, pre) else None,
        }
    print(write_result(out, args.out, version).read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
