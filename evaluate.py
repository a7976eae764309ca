"""Evaluate trained checkpoints on held-out texts; print and write the metric table.

    python evaluate.py experiment=llm_rubric_real

Writes to ``run_dir``: the predictions table (every question, every (text, judge) pair),
``metrics.json`` and ``metrics.md`` (main question: the model and the configured baselines).
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig

from llmrubric.baselines import make_method
from llmrubric.calibrator import Calibrator
from llmrubric.errors import InputError
from llmrubric.experiment import prepare
from llmrubric.metrics import evaluate, markdown_table
from llmrubric.schemas import write_json, write_table, write_text

log = logging.getLogger("evaluate")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    rubric, splits = prepare(cfg, create_folds=False)
    run_dir = Path(cfg.run_dir)
    predictions = {"llm_rubric": []}
    for split in splits:
        path = run_dir / f"{split.name}.safetensors"
        if not path.is_file():
            raise InputError("checkpoint not found; run train.py with the same config first", file=str(path))
        predictions["llm_rubric"].append(Calibrator.load(path).predict(split.test))
        for name in cfg.baselines:
            method = make_method(name, rubric, cfg.seed).fit(split.train)
            predictions.setdefault(name, []).append(method.predict(split.test))
    tables = {name: pd.concat(parts, ignore_index=True) for name, parts in predictions.items()}
    annotations = pd.concat([s.test.annotations for s in splits], ignore_index=True)
    metrics = {name: evaluate(table, annotations, rubric.main) for name, table in tables.items()}
    table = markdown_table(metrics)
    header = f"{cfg.name}: {rubric.main.id} on {metrics['llm_rubric']['n']} held-out (text, judge) pairs ({cfg.protocol})"
    write_table(tables["llm_rubric"], run_dir / f"predictions.{cfg.predictions_format}")
    write_json({"experiment": cfg.name, "question": rubric.main.id, "protocol": cfg.protocol, "methods": metrics}, run_dir / "metrics.json")
    write_text(f"# {header}\n\n{table}\n", run_dir / "metrics.md")
    print(f"\n{header}\n{table}\n\nwritten to {run_dir}/")
    return metrics


if __name__ == "__main__":
    main()
