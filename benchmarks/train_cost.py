"""Wall and process seconds of ``train.py`` (holdout: 70 % of the texts) with the shipped default against
``model=network``, on tables of one data set (DialSumm by default).

    .venv/bin/python benchmarks/train_cost.py [--data ../shared/data/dialsumm] [--models auto network]
        [--workers 1 2] [--out benchmarks/results/train_cost.json]

Each model is one ``train.py`` run in a subprocess (``logger=none``, a temporary ``run_dir``). ``seconds``: its wall
seconds; ``process_seconds``: the CPU seconds of ``train.py`` and the children it waited for, plus the CPU seconds
of ``model=auto``'s worker fits (``decision.worker_cpu_seconds`` of its checkpoint: the workers are forked by a
forkserver, which ``train.py`` does not wait for); ``workers``: those that ran; ``phases``: ``model=auto``'s wall
seconds by phase of its fit (``decision.seconds``). Each model runs ``--runs`` times (default 3: one run's wall
seconds moved by 20 % between runs, the default's on 2 workers by 28 %), the run of median wall seconds kept
(``seconds_runs``: each).
``--workers 1 2`` also runs ``model=auto`` with ``model.auto.workers`` 1 and 2 (``auto_workers<N>``). Ratios are
against ``network``. Without ``--out`` the figures are printed only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, code_version, exit_code, write_result

from llmrubric.io.errors import InputError
from llmrubric.model.core.checkpoints import load_model

TABLES = ("annotations", "features", "texts")


def train_py(data: Path, overrides: list[str]) -> dict:
    """Wall and process seconds of one ``train.py`` run on ``data`` with ``overrides``, and its decision record."""
    with tempfile.TemporaryDirectory(prefix="llmrubric-train-cost-") as tmp:
        tables = [f"data.train.{t}={data / f'{t}.csv'}" for t in TABLES]
        command = [sys.executable, str(ROOT / "train.py"), "name=train_cost", "logger=none", f"run_dir={tmp}/run"]
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        code = subprocess.run([*command, f"rubric={data / 'rubric.yaml'}", *tables, *overrides], cwd=ROOT).returncode
        if code:
            raise InputError(f"train.py {' '.join(overrides)} exited with {code} (its error is above)", file=str(data))
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
        process = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        model = load_model(Path(tmp) / "run" / "fold0.safetensors")
    decision = getattr(model, "decision_", None) or {}
    return {
        "seconds": seconds,
        "process_seconds": process + decision.get("worker_cpu_seconds", 0.0),
        "workers": decision.get("workers", 1),
        "val_nll": float(model.val_nll_),
        **({"phases": decision["seconds"]} if "seconds" in decision else {}),
    }


def median_run(data: Path, overrides: list[str], runs: int) -> dict:
    """The record of the run of median wall seconds of ``runs`` ``train.py`` runs, with ``seconds_runs`` (each)."""
    records = sorted((train_py(data, overrides) for _ in range(runs)), key=lambda r: r["seconds"])
    return {**records[len(records) // 2], "seconds_runs": [r["seconds"] for r in records]}


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "dialsumm"))
    parser.add_argument("--models", nargs="+", default=["auto", "network"], choices=["auto", "network"])
    parser.add_argument("--workers", nargs="*", type=int, default=[], help="model.auto.workers values to run too")
    parser.add_argument("--runs", type=int, default=3, help="runs of each model, the median taken")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise InputError(f"{args.runs} runs: at least 1", setting="--runs")
    version, data = code_version(), Path(args.data).resolve()
    for name in (*(f"{t}.csv" for t in TABLES), "rubric.yaml"):
        if not (data / name).is_file():
            raise InputError(f"{name} not found", file=str(data / name), setting="--data")
    runs = {name: [f"model={name}"] for name in args.models}
    runs.update({f"auto_workers{n}": ["model=auto", f"model.auto.workers={n}"] for n in args.workers})
    report = {name: median_run(data, overrides, args.runs) for name, overrides in runs.items()}
    if "network" in report:
        for record in report.values():
            record["ratio"] = record["seconds"] / report["network"]["seconds"]
            record["process_ratio"] = record["process_seconds"] / report["network"]["process_seconds"]
    print(json.dumps(report, indent=1))
    if args.out:
        write_result({"meta": {"data": data.name}, **report}, args.out, version)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(run, None))
