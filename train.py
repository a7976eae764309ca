"""Train the calibration network(s) of an experiment and save checkpoints.

    python train.py experiment=llm_rubric_real      # synthetic → real
    python train.py experiment=llm_rubric_cv        # 5 fold models
    python train.py model.h1=50 trainer.lr=0.001    # any setting from conf/

Returns the mean held-out (early-stopping) NLL of the main question, the value a
hyperparameter search minimises.
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
from llmrubric.experiment import prepare

log = logging.getLogger("train")


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rubric, splits = prepare(cfg, create_folds=True)
    run_dir = Path(cfg.run_dir)
    scores = []
    for split in tqdm(splits, desc="training", unit="model", disable=len(splits) == 1):
        start = time.perf_counter()
        model = Calibrator(rubric, dict(cfg.model), dict(cfg.trainer), cfg.seed).fit(split.train)
        path = model.save(run_dir / f"{split.name}.safetensors")
        scores.append(model.val_nll_)
        log.info(
            "%s: %d annotations, %d judges → %s (%.1fs, val NLL %s)",
            split.name, len(split.train.annotations), len(model.judges_.judges), path, time.perf_counter() - start,
            f"{scores[-1]:.4f}" if np.isfinite(scores[-1]) else "n/a",
        )
    return float(np.nanmean(scores)) if np.isfinite(scores).any() else float("nan")


if __name__ == "__main__":
    main()
