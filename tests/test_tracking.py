"""MLflow tracking: train/evaluate runs in a temporary store, nested runs, the default store, logger=none."""

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from omegaconf import OmegaConf
from support.paths import ROOT
from support.settings import FAST, SIMULATED, TABLES, small_demo

from llmrubric.apps.evaluate import evaluate_app
from llmrubric.apps.train import train_app
from llmrubric.experiments.tracking import Tracker

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("tracking")


def expected_data_hash() -> str:
    digests = [hashlib.sha256((SIMULATED / f"{t}.csv").read_bytes()).hexdigest() for t in TABLES]
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def git_head() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{tmp / 'store.db'}"
    cfg = small_demo(f"run_dir='{tmp / 'run'}'", f"logger.tracking_uri='{uri}'")
    score = train_app(cfg)
    metrics = evaluate_app(cfg)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("demo")
    runs = {r.data.tags["job"]: r for r in client.search_runs([experiment.experiment_id])}
    return SimpleNamespace(tmp=tmp, client=client, experiment=experiment, runs=runs, score=score, metrics=metrics)


def read_artifact(client, run_id: str, path: str, dst: Path) -> bytes:
    return Path(client.download_artifacts(run_id, path, str(dst))).read_bytes()


@pytest.mark.slow
def test_train_run_logs_config_metrics_history_and_checkpoint(logged, tmp_path):
    run = logged.runs["train"]
    assert run.info.status == "FINISHED" and run.info.run_name == "train"
    params = run.data.params
    assert (
        params["trainer.pretrain_epochs"] == str(FAST["pretrain_epochs"])
        and params["model.h1"] == "25"
        and params["data.name"] == "simulated"
    )
    assert params["baselines"] == "[]"
    assert run.data.tags["git_commit"] == git_head()
    assert run.data.tags["data_sha256"] == expected_data_hash()
    assert "mlflow.parentRunId" not in run.data.tags
    metrics = run.data.metrics
    assert metrics["val/nll"] == pytest.approx(logged.score) and metrics["val/nll/fold0"] == pytest.approx(logged.score)
    for key in ("train/loss/fold0/pretrain", "val/nll/fold0/finetune"):
        history = logged.client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == list(range(len(history))) and 1 <= len(history) <= FAST[
            f"{key.rsplit('/', 1)[1]}_epochs"
        ], key
    choice = json.loads(read_artifact(logged.client, run.info.run_id, "auto/fold0.json", tmp_path))
    (chosen,) = choice["weights"]  # the network, with or without a system level
    assert chosen in ("network", "network-level") and choice["inner_cv"]["network"]["nll"] > 0
    assert metrics[f"auto/weight/{chosen}/fold0"] == choice["weights"][chosen] == 1.0
    assert logged.experiment.artifact_location.startswith((logged.tmp / "mlartifacts").as_uri())
    checkpoint = read_artifact(logged.client, run.info.run_id, "checkpoints/fold0.safetensors", tmp_path)
    assert checkpoint == (logged.tmp / "run" / "fold0.safetensors").read_bytes()
    logged_config = OmegaConf.create(read_artifact(logged.client, run.info.run_id, "config.yaml", tmp_path).decode())
    assert logged_config.trainer.finetune_epochs == FAST["finetune_epochs"] and logged_config.run_dir == str(
        logged.tmp / "run"
    )
    assert {a.path for a in logged.client.list_artifacts(run.info.run_id)} >= {
        "config.yaml",
        "folds.csv",
        "checkpoints",
    }


@pytest.mark.slow
def test_evaluate_run_logs_test_metrics_and_tables(logged, tmp_path):
    run = logged.runs["evaluate"]
    assert run.info.status == "FINISHED" and set(logged.runs) == {"train", "evaluate"}
    model = logged.metrics["llm_rubric"]
    for name in ("rmse", "pearson", "spearman", "kendall", "nll"):
        assert run.data.metrics[f"test/{name}"] == pytest.approx(model[name]), name
    assert run.data.metrics["test/per_judge/rmse"] == pytest.approx(model["per_judge"]["rmse"])
    assert model["judges"] and all(  # each rater's agreement, named by its id
        run.data.metrics[f"test/judges/{judge}/{m}"] == pytest.approx(figures[m], nan_ok=True)
        for judge, figures in model["judges"].items()
        for m in ("kappa", "qwk", "alpha", "rmse")
    )
    assert {a.path for a in logged.client.list_artifacts(run.info.run_id)} >= {
        "predictions.csv",
        "metrics.json",
        "metrics.md",
        "config.yaml",
    }
    written = json.loads(read_artifact(logged.client, run.info.run_id, "metrics.json", tmp_path))
    assert written["methods"]["llm_rubric"]["rmse"] == pytest.approx(model["rmse"])


@pytest.mark.slow
def test_nested_runs_record_their_parent_in_the_default_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    tracker = Tracker("nested")
    assert tracker.tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlruns.db'}"
    ids = {}
    with tracker.run("study") as study:
        study.log_text("x: 1\n", "search/space.yaml")
        with tracker.run("trial 0", nested=True) as trial:
            trial.log_metrics({"val/nll": 1.5, "val/rmse": None}, step=2)
            with tracker.run("train", nested=True) as inner:
                ids["inner"] = inner.id

        both_open = threading.Barrier(2)  # no time limit, however busy the machine: a failing thread breaks it

        def worker(n):
            try:
                with tracker.run(f"trial {n}", nested=True) as threaded:
                    ids[n] = threaded.id
                    both_open.wait()
            except BaseException:
                both_open.abort()
                raise

        threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with tracker.run("independent") as independent:
            pass
    with tracker.run("joined", nested=True, parent=study.id) as joined:
        pass
    with pytest.raises(ValueError, match="diverged"), tracker.run("failing", nested=True, parent=study) as failing:
        raise ValueError("loss diverged")
    get = tracker.client.get_run

    def parent(run_id):
        return get(run_id).data.tags.get("mlflow.parentRunId")

    assert parent(trial.id) == study.id and parent(ids["inner"]) == trial.id
    assert parent(ids[1]) == parent(ids[2]) == study.id
    assert parent(joined.id) == study.id and parent(failing.id) == study.id
    assert parent(independent.id) is None and parent(study.id) is None
    assert get(study.id).info.status == "FINISHED"
    assert get(failing.id).info.status == "FAILED" and "loss diverged" in get(failing.id).data.tags["error"]
    history = tracker.client.get_metric_history(trial.id, "val/nll")
    assert [(m.step, m.value) for m in history] == [(2, 1.5)] and "val/rmse" not in get(trial.id).data.metrics
    assert (tmp_path / "mlruns.db").is_file()
    assert (
        tmp_path / "mlartifacts" / "nested" / study.id / "artifacts" / "search" / "space.yaml"
    ).read_text() == "x: 1\n"


def test_config_then_environment_then_default_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from-env.db")
    assert Tracker("x").tracking_uri == "sqlite:///from-env.db"
    cfg = OmegaConf.create({"logger": {"enabled": True, "experiment": "e", "tracking_uri": "sqlite:///from-config.db"}})
    tracker = Tracker.from_config(cfg)
    assert (tracker.enabled, tracker.experiment, tracker.tracking_uri) == (True, "e", "sqlite:///from-config.db")
    assert small_demo("logger=none").logger.enabled is False  # the other logger.* keep LoggerConfig's defaults
    assert not Tracker.from_config(OmegaConf.create({})).enabled


@pytest.mark.slow
def test_logger_none_writes_nothing_and_never_imports_mlflow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'env.db'}")
    cfg = small_demo(
        "logger=none", f"run_dir='{tmp_path / 'run'}'", "trainer.pretrain_epochs=1", "trainer.finetune_epochs=1"
    )
    train_app(cfg)
    assert (tmp_path / "run" / "fold0.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    code = (
        "import sys; from omegaconf import OmegaConf; from llmrubric.experiments.tracking import Tracker\n"
        "cfg = OmegaConf.create({'logger': {'enabled': False}, 'data': {}})\n"
        "with Tracker.from_config(cfg).run('x', nested=True) as run:\n"
        "    run.log_config(cfg); run.log_metrics({'val/nll': 1.0}); run.log_history([]); run.log_artifact('missing')\n"
        "print(run.id, 'mlflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=os.environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "False"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
