"""Search benchmark on the LLM-Rubric release: fold-vectorised speed-up, reference vs selected
configuration under the same 5-fold CV, and synthetic → real with the selection.

    .venv/bin/python benchmarks/search.py [--trials 20] [--seeds 3]   # --trials 0: speed and reference only

Writes ``benchmarks/results/search.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrubric.calibrator import Calibrator  # noqa: E402
from llmrubric.datasets import llm_rubric  # noqa: E402
from llmrubric.metrics import METRICS, evaluate  # noqa: E402
from llmrubric.rubric import Rubric  # noqa: E402
from llmrubric.schemas import write_json  # noqa: E402
from llmrubric.search import Setting, cross_validate, run_search  # noqa: E402
from llmrubric.splits import text_folds  # noqa: E402


def reference_setting(root: Path) -> Setting:
    """The reference code's chosen configuration: fixed epochs, no early stopping, one network."""
    ref = json.loads((root / "reference_best_hyperparameters.json").read_text())
    model = {"h1": ref["layer1_size"], "h2": ref["layer2_size"], "personalize": "deltas", "inputs": "probabilities", "ensemble": 1}
    trainer = {
        "batch_size": ref["batch_size"], "lr": ref["learning_rate"], "pretrain_epochs": ref["pretraining_epochs"],
        "finetune_epochs": ref["finetuning_epochs"], "val_fraction": 0.0, "delta_l2": 0.0,
    }
    return Setting(model, trainer)


def speedup(rubric, tables, setting: Setting, folds) -> dict:
    """The same 5 fold models: one Lightning fit after another vs one stacked program."""
    out = {}
    for engine in ("lightning", "stacked"):
        start = time.perf_counter()
        metrics, predictions = cross_validate(rubric, tables, Setting(setting.model, {**setting.trainer, "engine": engine}), folds, seed=0)
        out[engine] = {"seconds": time.perf_counter() - start, "nll": metrics["nll"], "predictions": predictions}
    cols = [c for c in out["stacked"]["predictions"].columns if c.startswith("p_")]
    diff = float(np.nanmax(np.abs(out["stacked"]["predictions"][cols].to_numpy() - out["lightning"]["predictions"][cols].to_numpy())))
    return {
        "lightning_seconds": out["lightning"]["seconds"], "stacked_seconds": out["stacked"]["seconds"],
        "vectorized_speedup": out["lightning"]["seconds"] / out["stacked"]["seconds"],
        "max_abs_probability_difference": diff, "nll": {e: out[e]["nll"] for e in out},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric")))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    root = Path(args.data)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    synthetic, real = llm_rubric.load(root, "synthetic", rubric), llm_rubric.load(root, "real", rubric)
    folds = text_folds(synthetic.text_ids, 5, seed=0)
    reference = reference_setting(root)
    report = {"speed": speedup(rubric, synthetic, reference, folds)}
    print("fold-vectorised:", {k: v for k, v in report["speed"].items()}, flush=True)
    report["reference_inner_nll"] = cross_validate(rubric, synthetic, reference, folds, seed=0)[0]["nll"]
    if args.trials == 0:
        write_json(report, args.out)
        print(f"no search (--trials 0); written to {args.out}")
        return
    base = Setting(*(OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / g / "default.yaml")) for g in ("model", "trainer")))
    search = OmegaConf.load(ROOT / "conf" / "search" / "optuna.yaml")
    search.storage, search.n_trials, search.progress = None, args.trials, True
    start = time.perf_counter()
    selected, study = run_search(rubric, synthetic, base, search, "benchmark", seed=0)
    report.update(wall_seconds=time.perf_counter() - start, trials=len(study.trials), selected_inner_nll=study.best_value)
    report["selected"] = {"model": selected.model, "trainer": selected.trainer}
    print(f"search: {len(study.trials)} trials in {report['wall_seconds']:.0f}s, inner NLL {study.best_value:.4f} "
          f"(reference {report['reference_inner_nll']:.4f})", flush=True)
    runs = []
    for seed in range(args.seeds):
        model = Calibrator(rubric, selected.model, selected.trainer, seed).fit(synthetic)
        runs.append(evaluate(model.predict(real, questions=[rubric.main.id]), real.annotations, rubric.main))
    report["real"] = {m: {"mean": float(np.mean([r[m] for r in runs])), "sd": float(np.std([r[m] for r in runs]))} for m in METRICS}
    print("synthetic → real:", {m: f"{v['mean']:.3f} ± {v['sd']:.3f}" for m, v in report["real"].items()})
    write_json(report, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
