"""Scale-out benchmark → ``benchmarks/results/scale.json``.

Extraction: the same prompts (LLM-Rubric template, the rubric's 9 questions over short
generated dialogues) through 1, 2 and 3 loopback OpenAI-compatible fake servers (the tests'
``FakeOpenAI``: a tiny Llama's real logprobs, computed once beforehand so that each request
costs the server its ``--latency`` seconds and no CPU), ``--concurrency`` requests in flight
per endpoint. This measures how well the client keeps several endpoints busy. Search: one study of
``--trials`` random start-up trials on the embedded simulated data (the tests' tiny
settings), run by one worker on SQLite, one worker on PostgreSQL and two workers on
PostgreSQL (a local server, Debian's package); trials per minute from the first trial's start
to the last trial's end as the study records them (worker start-up excluded).

Usage: ``python benchmarks/scale.py [--prompts 270] [--latency 0.05] [--trials 8]``
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from common import code_version, write_result  # noqa: E402
from support.fake_openai import FakeOpenAI  # noqa: E402
from support.postgres_server import PostgresServer, unavailable  # noqa: E402
from support.tiny_models import make_llama, make_tokenizer, write_texts  # noqa: E402

from llmrubric.experiments.search import finished_trials  # noqa: E402
from llmrubric.extract.backends.openai_backend import OpenAIBackend  # noqa: E402
from llmrubric.extract.cache import ResultCache  # noqa: E402
from llmrubric.extract.families import likert_tasks  # noqa: E402
from llmrubric.extract.prompts import PromptTemplate  # noqa: E402
from llmrubric.extract.runner import extract  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402

WORKER = """
import sys
sys.path.insert(0, {tests!r})
from support.search import BASE, search_config
from llmrubric.experiments.search import Setting
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables
from llmrubric.experiments.search import run_search
rubric = Rubric.load({root!r} + "/conf/rubric/llm_rubric.yaml")
d = {root!r} + "/data/simulated/"
tables = load_tables(d + "annotations.csv", d + "features.csv", rubric, d + "texts.csv")
c = search_config({storage!r}, {trials})
c.batch, c.startup_trials, c.heartbeat_seconds = 1, {trials}, 5
short = {{"pretrain_epochs": 3, "finetune_epochs": 4, "patience": 3}}  # the trials this benchmark has always timed
run_search(rubric, tables, Setting(BASE.model, {{**BASE.trainer, **short}}), c, "bench", seed=0)
"""


def extraction(prompts: int, latency: float, concurrency: int) -> dict:
    tok = make_tokenizer()
    model = make_llama(tok)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        texts = pd.read_json(write_texts(Path(tmp) / "t.jsonl", n=prompts // 7 + 1), lines=True)
    tasks = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))[0][:prompts]
    out, features, memo = {}, {}, {}
    with FakeOpenAI(model, tok, memo=memo) as warm:  # every answer computed once
        extract(
            tasks,
            OpenAIBackend("tiny", warm.url, endpoint="completions", api_key_env=None, top_logprobs=len(tok)),
            ResultCache(None),
            "warm",
            progress=False,
        )
    for n in (1, 2, 3):
        servers = [FakeOpenAI(model, tok, latency=latency, memo=memo).__enter__() for _ in range(n)]
        try:
            client = OpenAIBackend(
                "tiny",
                [s.url for s in servers],
                endpoint="completions",
                api_key_env=None,
                top_logprobs=len(tok),
                concurrency=concurrency,
            )
            start = time.perf_counter()
            ex = extract(tasks, client, ResultCache(None), "bench", progress=False)
            seconds = time.perf_counter() - start
            answered = sum(len(s.answered) for s in servers)
        finally:
            for s in servers:
                s.__exit__()
        assert ex.summary["done"] == len(tasks) and answered == len(tasks), ex.summary
        features[n] = ex.features.sort_values(["text_id", "question_id", "option"]).reset_index(drop=True)
        out[str(n)] = round(len(tasks) / seconds, 1)
        print(f"extraction, {n} endpoint(s): {len(tasks)} prompts in {seconds:.2f} s = {out[str(n)]} prompts/s")
    identical = all(features[n].equals(features[1]) for n in (2, 3))
    return {"prompts": len(tasks), "per_s": out, "identical_features": identical}


def search_run(storage: str, workers: int, trials: int) -> dict:
    code = WORKER.format(root=str(ROOT), tests=str(ROOT / "tests"), storage=storage, trials=trials)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(workers)
    ]
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("\n".join(e[-2000:] for e in errors))
    study = optuna.load_study(study_name="bench", storage=storage)
    counted = finished_trials(study)
    configs = [tuple(sorted(t.params.items())) for t in counted]
    minutes = (
        max(t.datetime_complete for t in counted) - min(t.datetime_start for t in study.trials)
    ).total_seconds() / 60
    return {
        "trials": len(counted),
        "trials_per_min": round(len(counted) / minutes, 2),
        "lost": max(0, trials - len(counted)),
        "duplicated": len(configs) - len(set(configs)),
        "best": study.best_value,
    }


def search(trials: int) -> dict:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"sqlite": search_run(f"sqlite:///{tmp}/study.db", 1, trials)}
    reason = unavailable()
    if reason:
        print(f"no PostgreSQL runs: {reason}")
    else:
        with PostgresServer() as pg:
            runs["postgres_1_worker"] = search_run(pg.create_database("one"), 1, trials)
            runs["postgres_2_workers"] = search_run(pg.create_database("two"), 2, trials)
    for name, r in runs.items():
        print(
            f"search, {name}: {r['trials']} trials, {r['trials_per_min']} trials/min, lost {r['lost']}, duplicated {r['duplicated']}, best NLL {r['best']:.4f}"
        )
    out = {f"{name}_trials_per_min": r["trials_per_min"] for name, r in runs.items()}
    out.update(
        lost=sum(r["lost"] for r in runs.values()),
        duplicated=sum(r["duplicated"] for r in runs.values()),
        same_best=len({round(r["best"], 6) for r in runs.values()}) == 1,
        postgres=reason or "Debian postgresql (local server on 127.0.0.1)",
        runs=runs,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=270)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    args = parser.parse_args()
    version = code_version()
    ex = extraction(args.prompts, args.latency, args.concurrency)
    result = {
        "extraction": ex["per_s"],
        "extraction_speedup_3": round(ex["per_s"]["3"] / ex["per_s"]["1"], 2),
        "extraction_prompts": ex["prompts"],
        "extraction_identical_features": ex["identical_features"],
        "extraction_setup": {"latency_s": args.latency, "concurrency_per_endpoint": args.concurrency},
        "search": search(args.trials),
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
    }
    print(f"extraction speed-up with 3 endpoints: {result['extraction_speedup_3']}x (target >= 2.5)")
    write_result(result, args.out, version)
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
