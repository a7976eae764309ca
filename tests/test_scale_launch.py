"""Search workers launched through Hydra's submitit launcher (its local executor here; Slurm on
a cluster: ``hydra/launcher=submitit_slurm``): the jobs of one sweep share one study."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest
from support.paths import ROOT
from support.search import TINY_SEARCH

from llmrubric.experiments.search import finished_trials


@pytest.mark.slow
def test_search_workers_launched_by_submitit_share_one_study(tmp_path):
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher",
        reason="hydra-submitit-launcher is not installed (pip install -e '.[scale]')",
    )
    (tmp_path / "conf" / "search").mkdir(parents=True)
    (tmp_path / "conf" / "search" / "tiny.yaml").write_text(TINY_SEARCH)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = [
        "-m",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.launcher.timeout_min=10",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "experiment=demo",
        "search=tiny",
        "search.batch=1",
        f"search.storage={storage}",
        "model.ensemble=1",
        "logger=none",
        "+worker=0,1",
        f"run_dir='{tmp_path / 'run'}/${{hydra:job.num}}'",
    ]
    launched = subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*/*_result.pkl"))) == 2  # two submitit jobs ran
    [summary] = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    counted = finished_trials(study)
    configs = [tuple(sorted(t.params.items())) for t in counted]
    assert len(counted) == 3 and len(set(configs)) == 3  # the sweep's n_trials in all, none repeated
    selections = [json.loads(p.read_text()) for p in sorted((tmp_path / "run").glob("*/search/*/selected.json"))]
    assert len(selections) == 2 and selections[0]["trial"] == selections[1]["trial"] == study.best_trial.number
