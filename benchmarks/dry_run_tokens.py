"""Does ``extract features --dry-run`` count the prompt tokens a real run pays for (issue 58: within 5 % on the
LLM-Rubric release)? On ``--dialogues`` real LLM-Rubric dialogues (the first by sha256 of text_id: chosen
without labels or lengths) × their applicable rubric questions, through the CLI a user runs, against llama.cpp's
real server with SmolLM2-135M-Instruct (``conf/extract/llama_cpp.yaml``):

- the dry run with the served model's tokenizer (``tokenizer:``, the config's default) and without one (the
  estimate of 4 characters a token), in the modes ``logprob``, ``verbalized`` and ``reasoned`` (their prompts
  differ by the mode's instruction);
- the real run in ``logprob`` mode: its summary's ``prompt_tokens``, the sum of the server's ``usage``;
- per prompt (``per_prompt``): the tokens the dry run counts for each (text, question), made as the dry run makes
  them (the CLI's settings and tasks, :class:`~llmrubric.extract.cost.TokenCounter`), against the server's
  ``usage`` of that request in the run's result store: how many match exactly and the largest difference;
- the dry run of the whole release (``release``): its prompt tokens, those of the prompts over the served
  context (``context_tokens``, refused by the server), and the hours a real run would take at the rate measured
  (the whole release is not run: at SmolLM2's rate on 2 cores it takes hours).

    nice -n 10 .venv/bin/python benchmarks/dry_run_tokens.py [--dialogues 12] [--out benchmarks/results/dry_run_tokens.json]

Needs llama.cpp's server (optional group ``server``), the GGUF (``make setup``) and the release (``../shared/data``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, ROOT, code_version, llm_rubric_default, write_result

from llmrubric.apps.extract import _settings, _tasks
from llmrubric.cli import build_parser, main
from llmrubric.extract.adapters import llm_rubric_real_texts
from llmrubric.extract.backends.generation import mode_prompt
from llmrubric.extract.cost import TokenCounter, load_tokenizer
from llmrubric.io.tables import read_table

sys.path.insert(0, str(ROOT / "tests"))
from support.llama_server import LlamaServer, unavailable  # noqa: E402

CONFIG = ROOT / "conf" / "extract" / "llama_cpp.yaml"
RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"


def cli(argv: list[str]) -> dict:
    """``llmrubric ARGV`` and the JSON object its last output line prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"llmrubric {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def run(args) -> dict:
    texts = llm_rubric_real_texts(Path(args.data) / "real" / "real_data.json")
    texts = texts.assign(order=texts.text_id.map(lambda t: hashlib.sha256(str(t).encode()).hexdigest()))
    texts = texts.sort_values("order").head(args.dialogues)[["text_id", "text"]]
    with tempfile.TemporaryDirectory() as tmp, LlamaServer(Path(tmp) / "server.log") as server:
        texts_path = Path(tmp) / "texts.csv"
        texts.to_csv(texts_path, index=False)
        base = ["extract", "features", str(texts_path), "--config", str(CONFIG), "--rubric", str(RUBRIC)]
        base += ["--set", f"base_url={server.url}", "--out", str(Path(tmp) / "f.csv"), "--no-progress"]
        plans = {}
        for mode in ("logprob", "verbalized", "reasoned"):
            for counted in ("tokenizer", "estimate"):
                extra = ["--set", "tokenizer=null"] if counted == "estimate" else []
                plan = cli([*base, "--mode", mode, "--dry-run", *extra])
                plans[f"{mode}/{counted}"] = next(iter(plan.values()))
        start = time.perf_counter()
        real = cli(base)
        seconds = time.perf_counter() - start
        per_prompt = prompt_match(dry_counts(base), served_counts(Path(tmp) / "f.csv.cache.sqlite"))
        release = release_plan(args.data, tmp, base[3:7])
    served = real["this_run"]["prompt_tokens"]
    figures = {
        name: {
            "prompt_tokens": plan["prompt_tokens"],
            "counted_by": plan["prompt_tokens_counted_by"],
            "requests": plan["requests"],
            "output_tokens_at_most": plan["output_tokens_at_most"],
        }
        for name, plan in plans.items()
    }
    for counted in ("tokenizer", "estimate"):
        dry = plans[f"logprob/{counted}"]["prompt_tokens"]
        figures[f"logprob/{counted}"]["relative_error"] = (dry - served) / served
    return {
        "question": "does --dry-run count the prompt tokens the real run's usage reports (target: within 5 %)?",
        "dialogues": len(texts),
        "prompts": real["prompts"],
        "real_run": {
            "prompt_tokens_usage": served,
            "requests": real["this_run"]["requests"],
            "output_tokens": real["this_run"]["output_tokens"],
            "done": real["done"],
            "seconds": seconds,
        },
        "dry_run": figures,
        "per_prompt": per_prompt,
        "release": {
            **release,
            "prompt_tokens_served": release["prompt_tokens"] - release["prompt_tokens_over_context"],
            "real_run_hours_at_this_rate": release["prompt_tokens"] / (served / seconds) / 3600,
        },
        "target": "|relative_error| <= 0.05 with the tokenizer",
        "meta": {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "server": "llama.cpp (llmrubric models serve, xllamacpp)"},
    }


def dry_counts(argv: list[str]) -> dict[tuple[str, str], int]:
    """(text id, question id) → the prompt tokens the dry run counts for that block in ``logprob`` mode, from the
    settings and tasks the CLI makes of ``argv`` (``extract features …``)."""
    settings = _settings(build_parser().parse_args(argv))
    tasks = _tasks(settings, read_table(settings["texts"], "texts"))[0]
    chat = settings.get("endpoint", "chat") == "chat"
    counter = TokenCounter(load_tokenizer(settings["tokenizer"]), chat, settings.get("system_prompt"))
    return {(t.text_id, t.question_id): counter(mode_prompt(t, "logprob")) for t in tasks}


def served_counts(cache: Path) -> dict[tuple[str, str], int]:
    """(text id, question id) → the prompt tokens of the server's ``usage``, from a run's result store."""
    with contextlib.closing(sqlite3.connect(cache)) as db:
        rows = db.execute("SELECT text_id, question_id, prompt_tokens FROM results WHERE status = 'ok'").fetchall()
    return {(text, question): tokens for text, question, tokens in rows}


def prompt_match(dry: dict, served: dict) -> dict:
    """Prompts answered, those whose dry count equals the server's, and the largest difference (tokens and share)."""
    both = [(dry[k], served[k]) for k in served if k in dry]
    differences = [d - s for d, s in both]
    return {
        "prompts": len(both),
        "not_counted": len(set(served) - set(dry)),
        "equal": sum(d == 0 for d in differences),
        "largest_difference_tokens": max(differences, key=abs, default=0),
        "largest_relative_difference": max((abs(d - s) / s for d, s in both if s), default=0.0),
    }


def release_plan(data: str, tmp: str, config: list[str]) -> dict:
    """The dry run of the whole real release (223 dialogues) with the served model's tokenizer and context."""
    texts = llm_rubric_real_texts(Path(data) / "real" / "real_data.json")[["text_id", "text"]]
    path = Path(tmp) / "release.csv"
    texts.to_csv(path, index=False)
    argv = ["extract", "features", str(path), *config, "--out", str(Path(tmp) / "r.csv"), "--no-progress"]
    return {"dialogues": len(texts), **next(iter(cli([*argv, "--dry-run"]).values()))}


def parse(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dialogues", type=int, default=12)
    p.add_argument("--data", default=llm_rubric_default())
    p.add_argument("--out", default=str(RESULTS / "dry_run_tokens.json"))
    return p.parse_args(argv)


if __name__ == "__main__":
    if reason := unavailable():
        raise SystemExit(reason)
    arguments = parse()
    version = code_version()
    report = run(arguments)
    print(json.dumps(report, indent=1))
    write_result(report, arguments.out, version)
