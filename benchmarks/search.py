"""Search benchmark on the LLM-Rubric release: reference vs selected configuration under the same
5-fold CV, synthetic → real with the selection, and the nested search's time per outer fold.

    .venv/bin/python benchmarks/search.py [--trials 100] [--nested-trials 0] [--outer-folds 5] [--seeds 5]

Writes ``benchmarks/results/search.json``. The fold-vectorised speed-up of the training engine
is measured by ``benchmarks/engine.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, write_result  # noqa: E402

from llmrubric import NetworkCalibrator  # noqa: E402
from llmrubric.config import compose, group  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.evaluation.metrics import METRICS, evaluate, seed_sd  # noqa: E402
from llmrubric.experiments.search import Setting, cross_validate, run_search  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402


def reference_setting(root: Path) -> Setting:
    """The reference code's chosen configuration: fixed epochs, no early stopping, one network."""
    ref = json.loads((root / "reference_best_hyperparameters.json").read_text())
    model = {
        "h1": ref["layer1_size"],
        "h2": ref["layer2_size"],
        "personalize": "deltas",
        "inputs": "probabilities",
        "ensemble": 1,
    }
    trainer = {
        "batch_size": ref["batch_size"],
        "lr": ref["learning_rate"],
        "pretrain_epochs": ref["pretraining_epochs"],
        "finetune_epochs": ref["finetuning_epochs"],
        "val_fraction": 0.0,
        "delta_l2": 0.0,
    }
    return Setting(model, trainer)


def data_sha256(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.tsv")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def search_config(trials: int, batch: int, seed: int = 0):
    search = compose("config", ["search=optuna"]).search
    search.storage, search.n_trials, search.progress, search.batch, search.seed = None, trials, True, batch, seed
    return search


def default_setting() -> Setting:
    return Setting(group("model"), group("trainer"))


def outer_fold(args: tuple) -> dict:
    """One outer fold of the nested search: select on its training texts, refit, score its test texts."""
    data, k, trials, batch = args
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    synthetic = llm_rubric.load(Path(data), "synthetic", rubric)
    folds = text_folds(synthetic.text_ids, 5, seed=0)
    train, test = synthetic.subset(folds.text_id[folds.fold != k]), synthetic.subset(folds.text_id[folds.fold == k])
    start, cpu = time.perf_counter(), time.process_time()
    selected, study = run_search(rubric, train, default_setting(), search_config(trials, batch), f"outer-{k}", seed=0)
    model = NetworkCalibrator(rubric, selected.model, selected.trainer, seed=0).fit(train)
    return {
        "fold": k,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,  # one thread: the time on a core of its own
        "trials": len(study.trials),
        "inner_nll": study.best_value,
        "selected": {"model": selected.model, "trainer": selected.trainer},
        "predictions": model.predict(test, questions=[rubric.main.id]).to_dict("list"),
    }


def nested(data: str, rubric, synthetic, trials: int, batch: int, workers: int, outer_folds: int = 5) -> dict:
    """5 outer × 5 inner folds, ``trials`` per outer fold; outer folds run in ``workers`` processes.
    With ``outer_folds`` < 5 only the first ones run (their time, no outer-CV metrics)."""
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        folds = list(pool.map(outer_fold, [(data, k, trials, batch) for k in range(outer_folds)]))
    predictions = pd.concat([pd.DataFrame(f.pop("predictions")) for f in folds], ignore_index=True)
    out = {"wall_seconds": time.perf_counter() - start, "workers": workers, "trials_per_outer_fold": trials}
    if outer_folds == 5:
        metrics = evaluate(predictions, synthetic.annotations, rubric.main, per_judge=False)
        out["outer_cv"] = {m: metrics[m] for m in METRICS}
    return {**out, "folds": folds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data", default=os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric"))
    )
    parser.add_argument("--trials", type=int, default=100, help="trials of the search on all synthetic data (0: none)")
    parser.add_argument(
        "--nested-trials", type=int, default=0, help="trials per outer fold of the nested search (0: none)"
    )
    parser.add_argument("--batch", type=int, default=10, help="trials trained as one stacked program")
    parser.add_argument("--workers", type=int, default=2, help="processes for the outer folds of the nested search")
    parser.add_argument(
        "--outer-folds", type=int, default=5, choices=range(1, 6), help="outer folds of the nested search to run"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    root = Path(args.data)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    synthetic, real = llm_rubric.load(root, "synthetic", rubric), llm_rubric.load(root, "real", rubric)
    folds = text_folds(synthetic.text_ids, 5, seed=0)
    reference = reference_setting(root)
    report: dict = {"meta": {**code_version(), "data_sha256": data_sha256(root)}}
    report["reference_inner_nll"] = cross_validate(rubric, synthetic, reference, folds, seed=0)[0]["nll"]
    print(f"reference configuration, 5-fold CV NLL {report['reference_inner_nll']:.4f}", flush=True)
    if args.trials:
        start = time.perf_counter()
        selected, study = run_search(
            rubric, synthetic, default_setting(), search_config(args.trials, args.batch), "benchmark", seed=0
        )
        states = pd.Series([t.state.name for t in study.trials]).value_counts().to_dict()
        report.update(
            search_seconds=time.perf_counter() - start,
            trials=len(study.trials),
            trial_states=states,
            selected_inner_nll=study.best_value,
        )
        report["selected"] = {"model": selected.model, "trainer": selected.trainer}
        print(
            f"search: {len(study.trials)} trials {states} in {report['search_seconds']:.0f}s, inner NLL {study.best_value:.4f} "
            f"(reference {report['reference_inner_nll']:.4f}); selected {study.best_params}",
            flush=True,
        )
        runs = []
        for seed in range(args.seeds):
            model = NetworkCalibrator(rubric, selected.model, selected.trainer, seed).fit(synthetic)
            runs.append(evaluate(model.predict(real, questions=[rubric.main.id]), real.annotations, rubric.main))
        report["real"] = {
            m: {
                "mean": float(np.mean([r[m] for r in runs])),
                "sd": seed_sd([r[m] for r in runs]),
                "seeds": [r[m] for r in runs],
            }
            for m in METRICS
        }
        print(
            "synthetic → real:", {m: f"{v['mean']:.3f} ± {v['sd']:.3f}" for m, v in report["real"].items()}, flush=True
        )
    if args.nested_trials:
        report["nested"] = nested(
            args.data, rubric, synthetic, args.nested_trials, args.batch, args.workers, args.outer_folds
        )
        report["wall_seconds"] = report["nested"]["wall_seconds"]
        print("nested search:", {k: v for k, v in report["nested"].items() if k != "folds"}, flush=True)
    write_result(report, args.out, report["meta"])
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
