"""The evaluation report on the shared LLM-Rubric release: the full real-data report, timed, and the synthetic CV calibration.

    .venv/bin/python benchmarks/report.py [--seeds 3] [--workers 2] [--data ../shared/data/llm-rubric]

1. ``evaluate.py experiment=llm_rubric_real report=full`` (every section: Table 1 with
   significance marks, calibration, Table 2 ablations, Table 3, oracles, learning curve),
   timed: the issue's budget is 15 minutes on 2 cores.
2. ``experiment=llm_rubric_cv report=full`` restricted to Table 1, calibration and oracles:
   the paper's smECE claim (< 0.05 for every Q0 answer) is about synthetic CV, and the
   depersonalized oracle (rows e, f) needs several judges per dialogue.

Writes ``benchmarks/results/report.json`` (``smece``, ``ablations``, ``report_dir``,
``seconds`` and the other tables) and copies the README's figures to
``benchmarks/results/figures/``. The report folders go to ``outputs/benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

from llmrubric.config import compose

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, write_result  # noqa: E402

from llmrubric.report.build import experiment_splits, report_from_config  # noqa: E402

FIGURES = {
    "cv": ["judge_distributions.png", "reliability_all.png"],
    "real": ["learning_curve.png", "reliability_all.png"],
}


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the training workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(experiment: str, overrides: list[str]) -> tuple[Path, float, float]:
    """Report folder, wall seconds and CPU seconds of one full report."""
    cfg = compose("config", [f"experiment={experiment}", "report=full", *overrides])
    start, cpu = time.perf_counter(), cpu_seconds()
    rubric, splits = experiment_splits(cfg)
    path = report_from_config(cfg, rubric, splits)
    return path, time.perf_counter() - start, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--data", default=os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric"))
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "report.json"))
    parser.add_argument("--outputs", default=str(ROOT / "outputs" / "benchmarks"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)
    load, version = os.getloadavg(), code_version()
    common = [f"report.seeds={args.seeds}", f"report.workers={args.workers}", f"data.root={args.data}"]
    real_dir, real_seconds, real_cpu = run("llm_rubric_real", [*common, f"run_dir={args.outputs}/llm_rubric_real"])
    cv_dir, cv_seconds, cv_cpu = run(
        "llm_rubric_cv",
        [*common, f"run_dir={args.outputs}/llm_rubric_cv", "report.sections=[table1,calibration,oracles]"],
    )
    real = json.loads((real_dir / "report.json").read_text())
    cv = json.loads((cv_dir / "report.json").read_text())
    alpha = 0.05
    ablations = {
        r["variant"]: {
            "name": r["ablation"],
            "rmse": r["rmse"],
            "pearson": r["pearson"],
            "nll": r["nll"],
            "p_value": r["p_pearson"],
            "p_value_rmse": r["p_rmse"],
            "significant_drop": bool((r["p_pearson"] or 1) < alpha or (r["p_rmse"] or 1) < alpha)
            if r["variant"] != "llm_rubric"
            else None,
            "paper_rmse": r["paper_rmse"],
            "paper_pearson": r["paper_pearson"],
        }
        for r in real["ablations"]["rows"]
    }
    figures = ROOT / "benchmarks" / "results" / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    for name, folder in (("cv", cv_dir), ("real", real_dir)):
        for figure in FIGURES[name]:
            shutil.copyfile(folder / "figures" / figure, figures / f"{name}_{figure}")
    result = {
        "smece": cv["calibration"]["smece"],
        "smece_all_below_0.05": all(v["value"] < 0.05 for v in cv["calibration"]["smece"].values()),
        "ablations": ablations,
        "report_dir": os.path.relpath(real_dir, ROOT),
        "seconds": round(real_seconds, 1),
        "cpu_seconds": round(real_cpu, 1),
        "report_dir_cv": os.path.relpath(cv_dir, ROOT),
        "seconds_cv": round(cv_seconds, 1),
        "cpu_seconds_cv": round(cv_cpu, 1),
        "table1_real": real["table1"]["rows"],
        "oracles_real": real["oracles"]["rows"],
        "per_question_real": real["per_question"]["rows"],
        "learning_curve_real": real["learning_curve"]["summary"],
        "calibration_real": real["calibration"]["smece"],
        "table1_cv": cv["table1"]["rows"],
        "oracles_cv": cv["oracles"]["rows"],
        "meta": {
            "seeds": args.seeds,
            "workers": args.workers,
            "cpus": os.cpu_count(),
            "load_average_at_start": load,
            "load_average_at_end": os.getloadavg(),
            "steps_real": real["meta"]["seconds per step"],
            "steps_cv": cv["meta"]["seconds per step"],
        },
    }
    write_result(result, args.out, version)
    print(
        "\nsmECE (synthetic CV): "
        + ", ".join(f"{k}: {v['value']:.3f} [{v['low']:.3f}, {v['high']:.3f}]" for k, v in result["smece"].items())
    )
    print(
        "ablations (real): "
        + "; ".join(f"{k} {v['rmse']:.3f}/{v['pearson']:.3f} p={v['p_value']}" for k, v in ablations.items())
    )
    print(
        f"real report {real_dir} in {real_seconds:.0f}s ({real_cpu:.0f} CPU s); CV report {cv_dir} in {cv_seconds:.0f}s ({cv_cpu:.0f} CPU s); written {args.out}"
    )


if __name__ == "__main__":
    main()
