"""An MLflow tracking server on 127.0.0.1 (SQL backend store, local artifact root): train with a
search, and evaluate, log to it through MLFLOW_TRACKING_URI; a server stopped mid-run costs
the logging, not the run."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import mlflow
import pytest
from omegaconf import OmegaConf
from support.mlflow_server import start_server, stop_server
from support.postgres_server import free_port
from support.settings import small_demo

from llmrubric.apps.evaluate import evaluate_app
from llmrubric.apps.train import train_app
from llmrubric.experiments.tracking import Tracker, TrackingError

# the server tests on one worker: one server for the module, which the last test stops
pytestmark = pytest.mark.xdist_group("mlflow_tracking")
SPACE = {"trainer.lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for this module (the last test stops it)."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    process, url = start_server(tmp)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", url)
        patch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        patch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        yield process, url, tmp
    stop_server(process)


def search_config(tmp: Path, experiment: str):
    cfg = small_demo(f"run_dir='{tmp / 'run'}'", "search=optuna", f"logger.experiment={experiment}")
    OmegaConf.set_struct(cfg, False)
    cfg.search.update(
        n_trials=2,
        batch=2,
        inner_folds=2,
        startup_trials=2,
        progress=False,
        storage=f"sqlite:///{tmp / 'study.db'}",
        space=SPACE,
    )
    return cfg


@pytest.mark.mlflow_server
def test_train_search_and_evaluate_log_to_a_tracking_server(server, tmp_path):
    _, url, root = server
    cfg = search_config(tmp_path, "served")
    score = train_app(cfg)
    metrics = evaluate_app(cfg)
    client = mlflow.MlflowClient(url)
    experiment = client.get_experiment_by_name("served")
    runs = client.search_runs([experiment.experiment_id])
    by_job = {}
    for run in runs:
        by_job.setdefault(run.data.tags["job"], []).append(run)
    [train], [evaluate], trials = by_job["train"], by_job["evaluate"], by_job["trial"]
    assert train.info.status == evaluate.info.status == "FINISHED"
    assert train.data.metrics["val/nll"] == pytest.approx(score)
    assert evaluate.data.metrics["test/rmse"] == pytest.approx(metrics["llm_rubric"]["rmse"])
    assert len(trials) == 2 and all(t.data.tags["mlflow.parentRunId"] == train.info.run_id for t in trials)
    assert all("val/nll" in t.data.metrics and "trainer.lr" in t.data.params for t in trials)
    checkpoint = client.download_artifacts(train.info.run_id, "checkpoints/fold0.safetensors", str(tmp_path / "down"))
    assert Path(checkpoint).read_bytes() == (tmp_path / "run" / "fold0.safetensors").read_bytes()
    selected = client.download_artifacts(train.info.run_id, "search/fold0/selected.json", str(tmp_path / "down"))
    assert json.loads(Path(selected).read_text())["trial"] in (0, 1)
    assert any((root / "artifacts").rglob("fold0.safetensors"))  # the server's local artifact root


@pytest.mark.mlflow_server
def test_a_server_stopped_mid_run_costs_the_logging_not_the_run(server, tmp_path, monkeypatch, caplog):
    process, url, root = server
    cfg = search_config(tmp_path, "stopped")
    Run = sys.modules["llmrubric.experiments.tracking"].Run
    log_config = Run.log_config

    def then_stop(self, cfg):  # the train run has started and logged its config: stop the server
        log_config(self, cfg)
        stop_server(process)

    monkeypatch.setattr(Run, "log_config", then_stop)
    with caplog.at_level(logging.WARNING, logger="llmrubric.experiments.tracking"):
        score = train_app(cfg)
    assert score == score  # finished with a number
    assert (tmp_path / "run" / "fold0.safetensors").is_file() and (
        tmp_path / "run" / "search" / "fold0" / "selected.json"
    ).is_file()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "llmrubric.experiments.tracking"]
    assert f"MLflow server {url} stopped answering" in warning
    for what in (
        "run 'trial-",
        "(never created)",
        "metrics ['val/nll/fold0'",
        "artifact fold0.safetensors",
        "status FINISHED of run 'train'",
    ):
        assert what in warning, what
    client = mlflow.MlflowClient(f"sqlite:///{root / 'server.db'}")  # what the server had stored
    [train] = client.search_runs([client.get_experiment_by_name("stopped").experiment_id])
    assert train.info.status == "RUNNING" and "trainer.lr" in train.data.params and not train.data.metrics


def test_an_mlflow_uri_that_is_not_a_server_is_an_error_before_any_run(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    port = free_port()
    with pytest.raises(
        TrackingError,
        match=rf"^MLflow tracking store http://127.0.0.1:{port} cannot be opened: .*Connection refused.*logger=none",
    ) as e:
        with Tracker("x", f"http://127.0.0.1:{port}").run("train"):
            pytest.fail("the run started")
    assert "\n" not in str(e.value)
