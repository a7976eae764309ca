"""Training-engine benchmark: equality with the recorded engine, fold-vectorised speed-up, CV train.py time.

    .venv/bin/python benchmarks/engine.py --record   # at the commit before the engine changed
    .venv/bin/python benchmarks/engine.py            # after: compares with the record

``--record`` writes ``benchmarks/results/engine_reference.json``: the 5-fold CV predictions of
the default configuration (``conf/model/default.yaml``, ``conf/trainer/default.yaml``; seed 0)
on the repository's simulated data, with its input dropout and without, and the seconds of the
engine then in place (all fold models stacked, one network after another, a CV ``train.py``
run on the LLM-Rubric synthetic data). Without it, the same predictions and timings of the
current engine are written to ``benchmarks/results/engine.json`` with the largest probability
difference from the record, the speed-ups, and the per-step overhead of Lightning's ``Trainer``
against a plain (Fabric) loop.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, write_result  # noqa: E402

from llmrubric import NetworkCalibrator  # noqa: E402
from llmrubric.config import group  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.experiments.search import Setting, cross_validate  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import load_tables  # noqa: E402
from llmrubric.model.core.encoding import JudgeMap  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


class Clock:
    """Wall and CPU seconds (this process and its finished children) of a block: the machine is
    shared, and CPU seconds are the fairer comparison when others load it."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, self._cpu() - self.cpu

    @staticmethod
    def _cpu() -> float:
        own, children = os.times()[:2], os.times()[2:4]
        return sum(own) + sum(children)

    def record(self) -> dict:
        return {"seconds": self.wall, "cpu_seconds": self.cpu}


def default_setting(**model) -> Setting:
    """The shipped defaults (``conf/model/default.yaml``, ``conf/trainer/default.yaml``), ``model`` overriding."""
    base = Setting(group("model"), group("trainer"))
    return Setting({**base.model, **model}, base.trainer)


def simulated(rubric: Rubric):
    d = ROOT / "data" / "simulated"
    return load_tables(d / "annotations.csv", d / "features.csv", rubric, d / "texts.csv")


def cv(rubric, tables, setting: Setting) -> dict:
    """5-fold CV of ``setting``, all fold models and members stacked: time, NLL, main-question probabilities."""
    folds = text_folds(tables.text_ids, 5, seed=0)
    with Clock() as clock:
        metrics, predictions = cross_validate(rubric, tables, setting, folds, seed=0)
    cols = [c for c in predictions.columns if c.startswith("p_")]
    keys = predictions.text_id.astype(str) + "|" + predictions.judge_id.astype(str)
    return {
        **clock.record(),
        "nll": metrics["nll"],
        "keys": keys.tolist(),
        "probabilities": np.round(predictions[cols].fillna(0).to_numpy(), 7).tolist(),
    }


def fold_models(rubric, tables, setting: Setting, folds) -> tuple[list, list]:
    """Untrained fold calibrators and their training tables."""
    ks = sorted(folds.fold.unique())
    trains = [tables.subset(folds.text_id[folds.fold != k]) for k in ks]
    return [NetworkCalibrator(rubric, setting.model, setting.trainer, seed=0) for _ in ks], trains


def per_fold(rubric, tables, setting: Setting) -> dict:
    """The fold models trained one after another (each fold's ensemble stacked), as ``cross_validate``'s
    (same judge map and seeds); their main-question probabilities on the fold's test texts."""
    folds = text_folds(tables.text_ids, 5, seed=0)
    judges = JudgeMap.from_annotations(tables.annotations)
    models, trains = fold_models(rubric, tables, setting, folds)
    with Clock() as clock:
        for model, train in zip(models, trains):
            NetworkCalibrator.fit_many([model], [train], judges)
    parts = [
        m.predict(tables.subset(folds.text_id[folds.fold == k]), questions=[rubric.main.id])
        for k, m in enumerate(models)
    ]
    predictions = pd.concat(parts, ignore_index=True)
    cols = [c for c in predictions.columns if c.startswith("p_")]
    keys = predictions.text_id.astype(str) + "|" + predictions.judge_id.astype(str)
    return {**clock.record(), "keys": keys.tolist(), "probabilities": predictions[cols].fillna(0).to_numpy().tolist()}


def per_network(rubric, tables, setting: Setting) -> dict:
    """As many networks trained one at a time (one-member calibrators, fold after fold): time only."""
    folds = text_folds(tables.text_ids, 5, seed=0)
    with Clock() as clock:
        for k in sorted(folds.fold.unique()):
            train = tables.subset(folds.text_id[folds.fold != k])
            for member in range(int(setting.model["ensemble"])):
                NetworkCalibrator(rubric, {**setting.model, "ensemble": 1}, setting.trainer, seed=member).fit(train)
    return clock.record()


def train_py(data: Path) -> dict:
    """Time of ``python train.py experiment=llm_rubric_cv logger=none`` (a subprocess)."""
    with tempfile.TemporaryDirectory() as tmp, Clock() as clock:
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                "experiment=llm_rubric_cv",
                "logger=none",
                f"run_dir={tmp}/run",
                f"data.root={data}",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    return clock.record()


def trainer_overhead(steps: int = 2000) -> dict:
    """Microseconds per step that Lightning's Trainer and Fabric add around a trivial step."""
    import lightning_fabric as lf
    import pytorch_lightning as pl

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4))

        def training_step(self, batch, batch_idx):
            return (self.w * batch).sum()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters())

    batches = [torch.ones(4)] * steps
    module = Tiny()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
    trainer_us = (time.perf_counter() - start) / steps * 1e6
    fabric = lf.Fabric(accelerator="cpu", devices=1)
    module = Tiny()
    optimizer = module.configure_optimizers()
    wrapped, optimizer = fabric.setup(module, optimizer)
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        fabric.backward(module.training_step(batch, i))
        optimizer.step()
        optimizer.zero_grad()
    fabric_us = (time.perf_counter() - start) / steps * 1e6
    return {"trainer_us_per_step": trainer_us, "fabric_us_per_step": fabric_us}


def compare(reference: dict, now: dict) -> float:
    """Largest absolute probability difference over the pairs of both runs."""
    ref = dict(zip(reference["keys"], np.asarray(reference["probabilities"])))
    new = dict(zip(now["keys"], np.asarray(now["probabilities"])))
    if set(ref) != set(new):
        raise SystemExit("the two runs predicted different pairs")
    return float(max(np.abs(ref[k] - new[k]).max() for k in ref))


def ratios(slow: dict, fast: dict) -> dict:
    return {"wall": slow["seconds"] / fast["seconds"], "cpu": slow["cpu_seconds"] / fast["cpu_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data", default=os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric"))
    )
    parser.add_argument("--record", action="store_true", help="record the reference (the engine before the change)")
    parser.add_argument("--skip-train-py", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    small, synthetic = simulated(rubric), llm_rubric.load(Path(args.data), "synthetic", rubric)
    settings = {"default": default_setting(), "default_without_dropout": default_setting(input_dropout=0.0)}
    report: dict = {
        "meta": {
            **code_version(),
            "torch": torch.__version__,
            "cpus": len(os.sched_getaffinity(0)),
            "load": os.getloadavg(),
        }
    }
    report["predictions"] = {name: cv(rubric, small, setting) for name, setting in settings.items()}
    default = settings["default"]
    stacked = cv(rubric, synthetic, default)
    speed = {"networks": 25, "stacked": {k: stacked[k] for k in ("seconds", "cpu_seconds", "nll")}}
    if args.record:
        speed["per_fold"] = per_fold_old(rubric, synthetic, default)
        with Clock() as clock:
            cross_validate(
                rubric,
                synthetic,
                Setting(default.model, {**default.trainer, "engine": "lightning"}),
                text_folds(synthetic.text_ids, 5, seed=0),
                seed=0,
            )
        speed["per_network"] = clock.record()
    else:
        fold_after_fold = per_fold(rubric, synthetic, default)
        speed["per_fold"] = {k: fold_after_fold[k] for k in ("seconds", "cpu_seconds")}
        speed["per_fold_max_abs_probability_difference"] = compare(stacked, fold_after_fold)
        speed["per_network"] = per_network(rubric, synthetic, default)
        report["trainer_overhead"] = trainer_overhead()
    for loop in ("per_fold", "per_network"):
        speed[f"speedup_over_{loop}"] = ratios(speed[loop], speed["stacked"])
    report["speed"] = speed
    if not args.skip_train_py:
        report["train_py_cv"] = train_py(Path(args.data))
    if not args.record:
        reference = json.loads((RESULTS / "engine_reference.json").read_text())
        report["max_abs_probability_difference"] = {
            n: compare(reference["predictions"][n], report["predictions"][n]) for n in settings
        }
        report["reference"] = {k: reference[k] for k in ("meta", "speed", "train_py_cv") if k in reference}
        report["reference"]["nll"] = {n: p["nll"] for n, p in reference["predictions"].items()}
        if "train_py_cv" in report and "train_py_cv" in reference:
            report["train_py_speedup"] = ratios(reference["train_py_cv"], report["train_py_cv"])
        report["speedup_over_old_per_network_loop"] = ratios(reference["speed"]["per_network"], speed["stacked"])
    summary = {k: v for k, v in report.items() if k != "predictions"}
    summary["nll"] = {n: p["nll"] for n, p in report["predictions"].items()}
    print(json.dumps(summary, indent=1))
    write_result(report, RESULTS / ("engine_reference.json" if args.record else "engine.json"), report["meta"])


def per_fold_old(rubric, tables, setting: Setting) -> dict:
    """The fold models one after another with the recorded engine (``NetworkCalibrator.fit`` per fold): time only."""
    folds = text_folds(tables.text_ids, 5, seed=0)
    with Clock() as clock:
        for k in sorted(folds.fold.unique()):
            NetworkCalibrator(rubric, setting.model, setting.trainer, seed=0).fit(
                tables.subset(folds.text_id[folds.fold != k])
            )
    return clock.record()


if __name__ == "__main__":
    main()
