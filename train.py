"""Train the calibration network(s) of an experiment and save checkpoints.

    python train.py experiment=llm_rubric_real      # synthetic → real
    python train.py experiment=llm_rubric_cv        # 5 fold models
    python train.py model.h1=50 trainer.lr=0.001    # any setting from conf/
    python train.py search=optuna experiment=llm_rubric_real   # select by 5-fold CV, then refit

Returns the mean held-out (early-stopping) NLL of the main question, the value a
hyperparameter search minimises. Logs an MLflow run (``logger=none``: off): config, per-split
``val/nll/<split>`` and per-epoch histories, the checkpoints and folds as artifacts.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from llmrubric.calibrator import Calibrator
from llmrubric.experiment import FOLDS_FILE, prepare
from llmrubric.search import Setting, select_for_split
from llmrubric.tracking import Tracker

log = logging.getLogger("train")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rubric, splits = prepare(cfg, create_folds=True)
    run_dir = Path(cfg.run_dir)
    with Tracker.from_config(cfg).run("train", nested=True, tags={"job": "train"}) as run:
        run.log_config(cfg)
        scores = []
        for split in tqdm(splits, desc="training", unit="model", disable=len(splits) == 1):
            start = time.perf_counter()
            setting = select_for_split(cfg, rubric, split, run) if cfg.search.enabled else Setting(dict(cfg.model), dict(cfg.trainer))
            model = Calibrator(rubric, setting.model, setting.trainer, cfg.seed).fit(split.train)
            path = model.save(run_dir / f"{split.name}.safetensors")
            seconds = time.perf_counter() - start
            scores.append(model.val_nll_)
            log.info(
                "%s: %d annotations, %d judges → %s (%.1fs, val NLL %s)",
                split.name, len(split.train.annotations), len(model.judges_.judges), path, seconds,
                f"{scores[-1]:.4f}" if np.isfinite(scores[-1]) else "n/a",
            )
            run.log_metrics({f"val/nll/{split.name}": scores[-1], f"train/seconds/{split.name}": seconds})
            run.log_history(model, split.name)
            run.log_artifact(path, "checkpoints")
        if (run_dir / FOLDS_FILE).is_file():
            run.log_artifact(run_dir / FOLDS_FILE)
        score = float(np.nanmean(scores)) if np.isfinite(scores).any() else float("nan")
        run.log_metrics({"val/nll": score})
        return score


if __name__ == "__main__":
    main()
