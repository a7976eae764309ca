"""train.py → evaluate.py through Hydra, on the embedded simulated data and on the shared release."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import FAST, ROOT
from llmrubric.calibrator import Calibrator
from llmrubric.metrics import evaluate
from llmrubric.splits import holdout_texts

OVERRIDES = [f"trainer.{k}={v}" for k, v in FAST.items()]


def run(script, *args):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_demo_train_then_evaluate(tmp_path):
    args = ["experiment=demo", f"run_dir={tmp_path}", *OVERRIDES]
    trained = run("train.py", *args)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "fold0.safetensors").is_file() and (tmp_path / "folds.csv").is_file()
    evaluated = run("evaluate.py", *args)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "| llm_rubric |" in evaluated.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())["methods"]
    assert metrics["llm_rubric"]["pearson"] > metrics["expected_llm"]["pearson"]
    predictions = pd.read_csv(tmp_path / "predictions.csv")
    assert set(predictions.question_id) == {f"Q{i}" for i in range(9)}
    folds = pd.read_csv(tmp_path / "folds.csv")
    held = set(folds.text_id[folds.fold == 0])
    assert set(predictions.text_id) == held


def test_evaluate_with_a_mismatched_checkpoint_writes_nothing(tmp_path):
    args = ["experiment=demo", f"run_dir={tmp_path}", "trainer.pretrain_epochs=1", "trainer.finetune_epochs=1"]
    assert run("train.py", *args).returncode == 0
    features = pd.read_csv(ROOT / "data" / "simulated" / "features.csv")
    bad = tmp_path / "features_q3_missing.csv"
    features[~((features.question_id == "Q3") & (features.option == 4))].to_csv(bad, index=False)
    failed = run("evaluate.py", "experiment=demo", f"run_dir={tmp_path}", f"data.train.features={bad}")
    assert failed.returncode != 0
    assert "Q3" in failed.stderr and "features_q3_missing.csv" in failed.stderr
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "predictions.csv").exists()


def test_personalization_recovers_the_idiosyncratic_judge(simulated, rubric):
    truth = json.loads((ROOT / "data" / "simulated" / "truth.json").read_text())
    judge = truth["idiosyncratic_judge"]["judge_id"]
    train_texts, test_texts = holdout_texts(simulated.text_ids, 0.3, seed=0)
    train, test = simulated.subset(train_texts), simulated.subset(test_texts)
    errors = {}
    for personalize in (True, False):
        model = Calibrator(rubric, {"personalize": personalize}, FAST, seed=0).fit(train)
        pred = model.predict(test, questions=["Q0"])
        ann = test.annotations[test.annotations.judge_id == judge]
        errors[personalize] = evaluate(pred[pred.judge_id == judge], ann, rubric.main)["rmse"]
    assert errors[True] < 0.85 * errors[False], errors


@pytest.mark.slow
def test_synthetic_to_real_beats_the_expected_llm_baseline(llm_rubric_data, rubric):
    from llmrubric.baselines import make_method

    synthetic, real = llm_rubric_data
    model = evaluate(Calibrator(rubric, seed=0).fit(synthetic).predict(real), real.annotations, rubric.main)
    llm = evaluate(make_method("expected_llm", rubric).predict(real), real.annotations, rubric.main)
    assert model["rmse"] < llm["rmse"] and model["pearson"] > llm["pearson"], (model, llm)
