"""LLM-Rubric Table 1 on the shared release: synthetic 5-fold CV and synthetic → real, plus
leave-one-system-out on the synthetic dialogues (each of DS1..DS5 tested by models trained on
the other four: a shift protocol that needs no real labels).

    .venv/bin/python benchmarks/table1.py [--seeds 10] [--data ../shared/data/llm-rubric]

Every method of ``llmrubric.model.families.baselines.report_methods()`` is run with the same folds (split by
dialogue, fold seed 0, or by system); learned and random methods over ``--seeds`` seeds.
Metrics are pooled over (dialogue, judge) pairs of Q0. Prints the table and writes
``benchmarks/results/table1.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, write_result  # noqa: E402

from llmrubric.config import group  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import system_folds, text_folds  # noqa: E402
from llmrubric.evaluation.metrics import METRICS, evaluate, markdown_table, seed_sd  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.model.families.baselines import deterministic_methods, make_method, report_methods  # noqa: E402

PAPER = {
    "synthetic_cv": {
        "random": (1.499, 0.002),
        "argmax_llm": (0.984, 0.153),
        "expected_llm": (0.856, 0.182),
        "calibrated_q0": (0.801, 0.198),
        "llm_rubric": (0.396, 0.401),
    },
    "real": {
        "random": (1.427, 0.011),
        "argmax_llm": (1.186, 0.106),
        "expected_llm": (0.901, 0.143),
        "calibrated_q0": (0.784, 0.211),
        "llm_rubric": (0.422, 0.350),
    },
}
PROTOCOLS = ("synthetic_cv", "synthetic_systems", "real")


@lru_cache(maxsize=1)
def data(root: str):
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    return rubric, llm_rubric.load(root, "synthetic", rubric), llm_rubric.load(root, "real", rubric)


@lru_cache(maxsize=1)
def settings() -> tuple[dict, dict]:
    """The network and trainer settings of conf/ (the defaults ``train.py`` uses)."""
    return group("model"), group("trainer")


def make(name: str, rubric, seed: int):
    model, trainer = settings()
    return make_method(name, rubric, seed, model, trainer)


def run_one(root: str, name: str, seed: int) -> dict:
    """Every protocol for one method and seed: {protocol: metrics}."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rubric, synthetic, real = data(root)
    out = {}
    for protocol, folds in (
        ("synthetic_cv", text_folds(synthetic.text_ids, 5, seed=0)),
        ("synthetic_systems", system_folds(synthetic)),
    ):
        parts = []
        for k in sorted(folds.fold.unique()):
            train = synthetic.subset(folds.text_id[folds.fold != k])
            test = synthetic.subset(folds.text_id[folds.fold == k])
            parts.append(make(name, rubric, seed).fit(train).predict(test))
        out[protocol] = evaluate(pd.concat(parts, ignore_index=True), synthetic.annotations, rubric.main)
    start = time.perf_counter()
    method = make(name, rubric, seed).fit(synthetic)
    out["fit_seconds"] = time.perf_counter() - start
    out["real"] = evaluate(method.predict(real), real.annotations, rubric.main)
    return out


def summarise(runs: dict[int, dict], protocol: str) -> dict:
    seeds = sorted(runs)
    entry = {"seeds": seeds}
    for m in METRICS:
        values = [runs[s][protocol][m] for s in seeds]
        entry[m] = float(np.mean(values))
        entry[f"{m}_sd"] = seed_sd(values)
        entry[f"{m}_per_seed"] = values
    entry["per_judge"] = {
        k: float(np.mean([runs[s][protocol]["per_judge"][k] for s in seeds])) for k in ("rmse", "pearson")
    }
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--data", default=os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric"))
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--methods", nargs="+", default=report_methods(), help="e.g. llm_rubric llm_rubric_single (ensemble of 1)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "table1.json"))
    args = parser.parse_args()
    version = code_version()  # the code that runs: HEAD when the run starts
    start = time.perf_counter()
    jobs = [
        (name, seed)
        for name in args.methods
        for seed in ([0] if name in deterministic_methods() else range(args.seeds))
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        futures = {job: pool.submit(run_one, args.data, *job) for job in jobs}
        results = {}
        for i, (job, future) in enumerate(futures.items(), 1):
            results[job] = future.result()
            print(
                f"[{i}/{len(jobs)}] {job[0]} seed {job[1]}: real pearson {results[job]['real']['pearson']:.3f}",
                flush=True,
            )
    report = {}
    for protocol in PROTOCOLS:
        report[protocol] = {
            name: summarise({s: results[(n, s)] for n, s in results if n == name}, protocol) for name in args.methods
        }
    learned = [results[j]["fit_seconds"] for j in results if j[0] == "llm_rubric"]
    digest = hashlib.sha256()
    for path in sorted(Path(args.data).rglob("*.tsv")):
        digest.update(path.read_bytes())
    report["meta"] = {
        "seconds": time.perf_counter() - start,
        "data_sha256": digest.hexdigest(),
        "fit_seconds_llm_rubric_synthetic": {"mean": float(np.mean(learned)), "max": float(np.max(learned))}
        if learned
        else None,
        "paper": PAPER,
    }
    write_result(report, args.out, version)
    for protocol in PROTOCOLS:
        rows = {}
        for name in args.methods:
            e = report[protocol][name]
            rows[name] = {m: (e[m], e[f"{m}_sd"]) if len(e["seeds"]) > 1 else e[m] for m in METRICS}
        print(f"\n{protocol} (pooled over pairs; mean ± sd over seeds)\n{markdown_table(rows)}")
    print(f"\nwritten to {args.out} in {report['meta']['seconds']:.0f}s")


if __name__ == "__main__":
    main()
