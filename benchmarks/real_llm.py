"""Real-LLM benchmark → ``benchmarks/results/real_llm.json``: SmolLM2-135M-Instruct (GGUF) on CPU.

Part (a), extraction on a fixed 20-dialogue subset of the 223 real LLM-Rubric dialogues
(sorted by text_id, every 11th) × the 9 rubric questions, with the shipped defaults
(``conf/extract/smollm2.yaml``: chat template on): prompts, tokens run, tokens/s, label-mass
quantiles, truncations, failures, and the minutes all 223 dialogues would take at that rate
(their shared-prefix token count / tokens/s). Beside it, a compute bound: the measured FLOP/s
of a large float32 matmul divided by the model's FLOPs per token at the measured context
lengths. float32 vs bfloat16 is timed on the ``--dtype-dialogues`` shortest dialogues. The machine may
be shared: wall-clock rates are given beside rates per CPU second of this process, which
times the thread count estimate an idle machine.

Parts ``injection`` and ``orders`` (``real_llm_probe.py``), ``cv`` (``real_llm_cv.py``) and ``server``
(``real_llm_server.py``, key ``real_server``) are described in their modules; each part writes only its own
key of the JSON, keeping the others.

Usage: ``python benchmarks/real_llm.py [--part a|cv|injection|orders|server] [--data FILE] [--subset 20] [--dtype-dialogues 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from common import code_version, write_result

from llmrubric.apps.extract import load_config
from llmrubric.extract.adapters import llm_rubric_real_texts
from llmrubric.extract.backends import BACKEND_KEYS
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import extract
from llmrubric.io.rubric import Rubric

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "real_llm.json"


def matmul_flops(n: int = 2048, repeats: int = 5) -> tuple[float, float]:
    """FLOP/s of an n×n float32 matmul on this machine's threads: per wall second (best of
    ``repeats``) and per CPU second of this process (all threads)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best, cpu = float("inf"), time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best, repeats * 2 * n**3 / (time.process_time() - cpu)


def flops_per_token(model, context: float) -> float:
    """Forward FLOPs per token: 2 × non-embedding weights + attention over ``context`` keys
    (QKᵀ and AV: 4 × layers × heads × head_dim × context)."""
    c = model.config
    params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * params + 4 * c.num_hidden_layers * c.num_attention_heads * head_dim * context


def run(backend, tasks, rubric, cache: str | None = None) -> tuple[dict, object]:
    backend.stats = {k: 0 for k in backend.stats}
    start, cpu = time.perf_counter(), time.process_time()
    ex = extract(tasks, backend, ResultCache(cache), "bench", (), rubric, progress=True, min_label_mass=0.05)
    if ex.summary["cached"]:
        raise SystemExit(f"{cache} already holds {ex.summary['cached']} of these prompts: the timing would be wrong")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "seconds": round(seconds, 1),
        "tokens": backend.stats["prefill_tokens"],
        "tokens_per_s": round(backend.stats["prefill_tokens"] / seconds, 1),
        "tokens_per_cpu_s": round(backend.stats["prefill_tokens"] / cpu, 1),
    }, ex


def from_cache(args, cfg, texts) -> dict:
    """Figures of a subset run cut short, from the results its cache holds: tokens/s between the
    first and the last stored result (the first prefix batch, done before the first result, is
    not counted), label mass of the stored blocks, and minutes for all 223 dialogues from the
    tokens per character of the dialogues done (truncation to the context ignored: an overestimate)."""
    import sqlite3

    import transformers

    db = sqlite3.connect(args.from_cache)
    rows = db.execute(
        "SELECT model_id, text_id, probs, computed_tokens, created FROM results WHERE status='ok' ORDER BY created"
    ).fetchall()
    if not rows:
        raise SystemExit(f"{args.from_cache} holds no results")
    created = np.array([r[4] for r in rows])
    timed = created > created[0] + 1.0
    seconds = float(created[-1] - created[0])
    tokens = int(sum(r[3] for r, t in zip(rows, timed) if t))
    mass = np.array([sum(json.loads(r[2]).values()) for r in rows])
    done = sorted({r[1] for r in rows})
    chars = texts.set_index("text_id").text.str.len()
    per_char = sum(r[3] for r in rows) / chars[done].sum()
    model = ROOT / cfg["model"]
    config = transformers.AutoConfig.from_pretrained(model.parent, gguf_file=model.name)
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(config)
    context = float(np.mean([min(per_char * chars[t], config.max_position_embeddings) for t in done])) / 2
    per_token = flops_per_token(meta, context)
    flop_s, _ = matmul_flops()
    rate = tokens / seconds if seconds > 0 else None
    return {
        "model": rows[0][0],
        "cut_short": True,
        "dialogues": len(done),
        "prompts": len(rows),
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(rate, 1) if rate else None,
        "compute_bound_tokens_per_s": round(flop_s / per_token, 1),
        "matmul_gflop_s": round(flop_s / 1e9, 1),
        "gflop_per_token": round(per_token / 1e9, 3),
        "label_mass_quantiles": {q: float(np.quantile(mass, q)) for q in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)},
        "label_mass_median": float(np.median(mass)),
        "estimated_tokens_all": round(per_char * chars.sum()),
        "estimated_minutes_all": round(per_char * chars.sum() / rate / 60, 1) if rate else None,
        "threads": torch.get_num_threads(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "note": "a subset run cut short on a 2-core machine shared with other jobs: wall-clock rates, pessimistic",
    }


def compare_dtypes(backend, subset, tasks, rubric, n: int) -> dict:
    """float32 vs bfloat16 timings and the largest probability difference on the ``n`` shortest dialogues."""
    shortest = set(subset.assign(n=subset.text.str.len()).nsmallest(n, "n").text_id)
    few = [t for t in tasks if t.text_id in shortest]
    dtypes, probs = {}, {}
    for dtype in ("float32", "bfloat16"):
        backend.model.to(getattr(torch, dtype))
        dtypes[dtype], e = run(backend, few, rubric)
        probs[dtype] = e.features.prob.to_numpy()
    backend.model.to(torch.float32)
    dtypes["max_abs_prob_diff"] = float(np.abs(probs["float32"] - probs["bfloat16"]).max())
    return dtypes


def write_part(result: dict, part: str, out: str, version: dict) -> None:
    """``result`` written to ``out`` with ``meta.runs[part]``: the commit of this part's run (parts merge)."""
    result.setdefault("meta", {}).setdefault("runs", {})[part] = version
    write_result(result, out, version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--data", default=str(ROOT.parent / "shared" / "data" / "llm-rubric" / "real" / "real_data.json")
    )
    parser.add_argument("--config", default=str(ROOT / "conf" / "extract" / "smollm2.yaml"))
    parser.add_argument("--subset", type=int, default=20)
    parser.add_argument("--dtype-dialogues", type=int, default=3)
    parser.add_argument("--cache", help="also store the subset's results in this cache (e.g. the full extraction's)")
    parser.add_argument("--from-cache", help="summarise a subset run cut short from its cache instead of running")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--part", choices=["a", "cv", "injection", "orders", "server"], default="a")
    parser.add_argument("--server-dialogues", type=int, default=10, help="server: the n shortest dialogues")
    parser.add_argument("--record", help="server: also store raw responses of the server in this folder")
    parser.add_argument("--probe-dialogues", type=int, default=8, help="injection/orders: the n shortest dialogues")
    parser.add_argument("--probe-cache", default=str(ROOT / "outputs" / "real_llm_bench" / "probe.cache.sqlite"))
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2, 4], help="orders: option orders to compare")
    parser.add_argument("--seeds", type=int, default=10, help="injection/cv: seeds of llm_rubric")
    parser.add_argument("--features", default=str(ROOT / "data" / "real_llm" / "smollm2_real.csv"))
    parser.add_argument("--permuted", help="cv: SmolLM2 features extracted with orders: 2 (skipped if absent)")
    args = parser.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))

    cfg = load_config(args.config)
    version = code_version()  # the code that runs: HEAD when the run starts
    if args.part != "a":
        import real_llm_cv
        import real_llm_probe
        import real_llm_server

        run_part = {
            "cv": real_llm_cv.cv,
            "injection": real_llm_probe.injection,
            "orders": real_llm_probe.orders,
            "server": real_llm_server.server,
        }
        figures = run_part[args.part](args, cfg)
        result = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
        result["real_server" if args.part == "server" else args.part] = figures
        write_part(result, "real_server" if args.part == "server" else args.part, args.out, version)
        print(json.dumps(figures, indent=1))
        return
    rubric = Rubric.load(ROOT / cfg["rubric"])
    texts = llm_rubric_real_texts(args.data).sort_values("text_id").reset_index(drop=True)
    subset = texts.iloc[:: len(texts) // args.subset].head(args.subset)
    if args.from_cache:
        extraction = from_cache(args, cfg, texts)
        result = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
        result["extraction"] = extraction
        write_part(result, "extraction", args.out, version)
        print(extraction)
        return
    template = PromptTemplate(cfg.get("template") or "llm_rubric")
    all_tasks, _ = likert_tasks(texts, rubric, template)
    tasks, _ = likert_tasks(subset, rubric, template)
    keys = [k for k in BACKEND_KEYS["transformers"] if k != "dtype"]
    kwargs = {k: cfg[k] for k in keys if cfg.get(k) is not None}
    backend = TransformersBackend(path=str(ROOT / cfg["model"]), dtype="float32", **kwargs)
    plan_all = backend.prefill_plan(all_tasks)

    load_at_start = os.getloadavg()[0]
    timing, ex = run(backend, tasks, rubric, args.cache)
    mass = ex.features.groupby(["text_id", "question_id"]).prob.sum().to_numpy()
    context = np.mean([len(backend.tokens.prepare(t).ids) for t in tasks]) / 2  # mean keys attended per token
    flop_s, flop_cpu_s = matmul_flops()
    per_token = flops_per_token(backend.model, context)
    idle = timing["tokens_per_cpu_s"] * torch.get_num_threads()
    extraction = {
        "model": backend.model_id,
        "dialogues": len(subset),
        "prompts": len(tasks),
        "failures": ex.summary["failed"],
        "truncated": ex.summary["truncated"],
        "low_label_mass": ex.summary["low_label_mass"],
        **timing,
        "compute_bound_tokens_per_s": round(flop_s / per_token, 1),
        "matmul_gflop_s": round(flop_s / 1e9, 1),
        "gflop_per_token": round(per_token / 1e9, 3),
        "mean_context": round(2 * context),
        "idle_estimate": {
            "tokens_per_s": round(idle, 1),
            "compute_bound_tokens_per_s": round(flop_cpu_s * torch.get_num_threads() / per_token, 1),
            "estimated_minutes_all": None,
            "how": "tokens and FLOP/s per CPU second of this process × threads: what the machine would do without other jobs",
        },
        "label_mass_quantiles": {q: float(np.quantile(mass, q)) for q in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)},
        "label_mass_median": float(np.median(mass)),
        "first_option_top_share": float(
            ex.features.loc[ex.features.groupby(["text_id", "question_id"]).prob.idxmax()].option.eq("1").mean()
        ),
        "all_223": {
            "prompts": plan_all["prompts"],
            "shared_prefill_tokens": plan_all["shared_prefill_tokens"],
            "naive_prefill_tokens": plan_all["naive_prefill_tokens"],
        },
        "estimated_minutes_all": round(plan_all["shared_prefill_tokens"] / timing["tokens_per_s"] / 60, 1),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "load_average_1min_at_start": load_at_start,
        "note": "wall-clock rates are pessimistic when the load average exceeds the threads (other jobs)",
    }
    extraction["idle_estimate"]["estimated_minutes_all"] = round(plan_all["shared_prefill_tokens"] / idle / 60, 1)
    result = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    if args.dtype_dialogues > 0:
        extraction["dtype"] = compare_dtypes(backend, subset, tasks, rubric, args.dtype_dialogues)
    elif "dtype" in result.get("extraction", {}):
        extraction["dtype"] = {
            **result["extraction"]["dtype"],
            "note": "kept from an earlier run (--dtype-dialogues 0)",
        }
    result["extraction"] = extraction
    write_part(result, "extraction", args.out, version)
    print(extraction)


if __name__ == "__main__":
    main()
