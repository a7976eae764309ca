"""MLflow traces ⇄ tables on the session's temporary SQLite store (``llmrubric.mlflow_genai``): HUMAN
feedback → annotations, LLM_JUDGE feedback → features, request + response → texts, and back."""

from __future__ import annotations

import json
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import mlflow
import pandas as pd
import pytest
from mlflow.entities import AssessmentSource
from support.paths import ROOT
from support.postgres_server import free_port
from support.settings import FAST

from llmrubric.cli import main as run_cli
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables, read_table
from llmrubric.mlflow_genai.read import DISTRIBUTION_KEY, read_traces, search_traces, trace_text_id
from llmrubric.mlflow_genai.scorer import CalibratedScorer
from llmrubric.mlflow_genai.store import size_http_pool
from llmrubric.mlflow_genai.write import log_tables
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.scoring.scores import score_texts

pytestmark = pytest.mark.slow
RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"


def new_experiment() -> tuple[str, str]:
    name = f"traces-{uuid.uuid4().hex[:8]}"
    return name, mlflow.MlflowClient().create_experiment(name)


def trace(experiment_id: str, request: str, response: str, system: str) -> str:
    client = mlflow.MlflowClient()
    span = client.start_trace("chat", inputs={"question": request}, tags={"app": system}, experiment_id=experiment_id)
    client.end_trace(span.trace_id, outputs={"answer": response})
    mlflow.flush_trace_async_logging()
    return span.trace_id


def feedback(trace_id: str, name: str, value, kind: str, source: str, **kwargs) -> None:
    mlflow.log_feedback(
        trace_id=trace_id, name=name, value=value, source=AssessmentSource(source_type=kind, source_id=source), **kwargs
    )


def test_feedback_of_several_raters_and_a_judge_become_the_three_tables(rubric):
    name, eid = new_experiment()
    a = trace(eid, "How do I reset it?", "Hold the button for 5 s.", "v1")
    b = trace(eid, "Is it waterproof?", "Yes [1].", "v2")
    feedback(a, "Q0", 3, "HUMAN", "ann@x")
    feedback(a, "satisfaction", 4, "HUMAN", "bob@x")  # the question's name stands for its id
    feedback(a, "Q0", 2, "HUMAN", "bob@x")  # bob's later answer replaces his earlier one
    feedback(a, "Q0", 2, "LLM_JUDGE", "gpt", metadata={DISTRIBUTION_KEY: json.dumps({"1": 0.1, "2": 0.7, "3": 0.2})})
    feedback(b, "Q1", "Likely.", "HUMAN", "ann@x")  # an option's label
    feedback(b, "Q0", 4, "LLM_JUDGE", "gpt")  # no distribution: a point mass
    feedback(b, "tone", "ok", "HUMAN", "ann@x")  # not a rubric question
    feedback(b, "llmrubric/Q0", 3.1, "CODE", "fold0.safetensors")  # a score written back
    got = read_traces(search_traces(mlflow.MlflowClient(), name), rubric, system_tag="app")
    ann = got.annotations.set_index(["text_id", "judge_id", "question_id"]).answer
    assert ann.to_dict() == {(a, "ann@x", "Q0"): "3", (a, "bob@x", "Q0"): "2", (b, "ann@x", "Q1"): "4"}
    probs = got.features.set_index(["text_id", "source", "question_id", "option"]).prob.sort_index()
    assert probs[(a, "gpt", "Q0")].to_dict() == {"1": 0.1, "2": 0.7, "3": 0.2, "4": 0.0}
    assert probs[(b, "gpt", "Q0")].to_dict() == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 1.0}
    texts = got.texts.set_index("text_id")
    assert texts.loc[a, "text"] == "How do I reset it?\nHold the button for 5 s." and texts.loc[b, "system_id"] == "v2"
    assert (got.counts["replaced"], got.counts["other_feedback"], got.counts["code_feedback"]) == (1, 1, 1)


def test_import_mlflow_writes_the_tables_and_an_off_scale_value_is_one_error(rubric, tmp_path, capsys):
    name, eid = new_experiment()
    a = trace(eid, "q", "r", "v1")
    feedback(a, "Q0", 3, "HUMAN", "ann@x")
    feedback(a, "Q0", 2, "LLM_JUDGE", "gpt")
    out = tmp_path / "tables"
    imported = ["import", "mlflow", "--experiment", name, "--rubric", str(RUBRIC)]
    assert run_cli([*imported, "--system-tag", "app", "--out-dir", str(out)]) == 0
    assert read_table(out / "annotations.parquet", "annotations").answer.tolist() == ["3"]
    assert read_table(out / "texts.parquet", "texts").system_id.tolist() == ["v1"]
    feedback(a, "Q1", 7, "HUMAN", "bob@x")
    capsys.readouterr()  # what the set-up logged (MLflow's first use of the session's store creates its tables)
    bad = tmp_path / "bad"
    assert run_cli([*imported, "--out-dir", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == f"error: trace {a}, assessment 'Q1' (HUMAN 'bob@x'): value 7 is not an option of Q1 ['1', '2', '3', '4']"
    )
    assert not bad.exists()


def test_an_import_that_answers_no_question_of_the_rubric_is_an_error_naming_the_feedback_seen(tmp_path, capsys):
    name, eid = new_experiment()
    a = trace(eid, "q", "r", "v1")
    feedback(a, "coherence", 3, "HUMAN", "ann@x")
    feedback(a, "coherence", 2, "LLM_JUDGE", "gpt")
    capsys.readouterr()
    out = tmp_path / "tables"
    assert run_cli(["import", "mlflow", "--experiment", name, "--rubric", str(RUBRIC), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: setting --rubric: no HUMAN or LLM_JUDGE feedback") and "seen: ['coherence']" in err
    assert not out.exists()


@pytest.fixture
def kept_tracking_uri():
    """The session's store again after a test that points the commands elsewhere (``--tracking-uri`` is global)."""
    before = mlflow.get_tracking_uri()
    yield
    mlflow.set_tracking_uri(before)


def test_a_tracking_server_that_is_down_is_one_line_before_anything_is_written(
    checkpoint, simulated, tmp_path, capsys, kept_tracking_uri
):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = tmp_path / "tables"
    assert run_cli(["import", "mlflow", "--experiment", "x", "--rubric", str(RUBRIC), "--out-dir", str(out),
                    "--tracking-uri", down]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(
        f"error: setting --tracking-uri: MLflow tracking server {down}"
    )
    texts = tmp_path / "texts.csv"
    simulated.texts.head(3).assign(trace_id="tr-1").to_csv(texts, index=False)
    features = tmp_path / "features.csv"
    simulated.features[simulated.features.text_id.isin(simulated.texts.text_id.head(3))].to_csv(features, index=False)
    scores = tmp_path / "scores.csv"
    assert run_cli(["score", "texts", str(checkpoint), str(features), "--texts", str(texts), "--out", str(scores),
                    "--log-to-traces", "--tracking-uri", down, "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is not answering" in err and not scores.exists()
    assert not list(tmp_path.glob("scores*"))


def test_a_tracking_server_that_hangs_is_one_line_after_mlflows_request_timeout(
    tmp_path, capsys, monkeypatch, kept_tracking_uri
):
    with socket.socket() as hung:  # accepts connections (the backlog) and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
        argv = ["import", "mlflow", "--experiment", "x", "--rubric", str(RUBRIC), "--out-dir", str(tmp_path / "t")]
        assert run_cli([*argv, "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is not answering (timed out; waited at most 1 s" in err, err


def test_a_local_store_that_does_not_exist_is_one_line_and_is_not_created(tmp_path, capsys, kept_tracking_uri):
    """A command that reads a store refuses a missing one instead of letting MLflow create an empty one."""
    out = tmp_path / "tables"
    argv = ["import", "mlflow", "--experiment", "x", "--rubric", str(RUBRIC), "--out-dir", str(out)]
    for uri, path in ((f"sqlite:///{tmp_path / 'nope.db'}", tmp_path / "nope.db"), (str(tmp_path / "mlruns"),) * 2):
        assert run_cli([*argv, "--tracking-uri", uri]) == 2
        err = capsys.readouterr().err
        assert (
            err == f"error: setting --tracking-uri: MLflow store {uri} does not exist ({path}): point "
            "--tracking-uri or MLFLOW_TRACKING_URI at the store that holds the experiment\n"
        )
        assert not os.path.exists(path) and not out.exists()


def test_mlflows_http_pool_holds_the_threads_mlflow_runs_against_the_server(monkeypatch):
    """Trace search downloads with MLFLOW_SEARCH_TRACES_MAX_THREADS threads: a smaller pool discards connections."""
    monkeypatch.delenv("MLFLOW_HTTP_POOL_MAXSIZE", raising=False)
    monkeypatch.setenv("MLFLOW_SEARCH_TRACES_MAX_THREADS", "48")
    size_http_pool()
    assert os.environ["MLFLOW_HTTP_POOL_MAXSIZE"] == "48"
    monkeypatch.setenv("MLFLOW_HTTP_POOL_MAXSIZE", "7")  # the user's own setting stays
    size_http_pool()
    assert os.environ["MLFLOW_HTTP_POOL_MAXSIZE"] == "7"


def test_export_mlflow_writes_into_an_experiment_without_traces_only(tmp_path, capsys):
    simulated = ROOT / "data" / "simulated"
    texts = pd.read_csv(simulated / "texts.csv").head(2)
    files = {}
    for name in ("annotations", "features", "texts"):
        table = pd.read_csv(simulated / f"{name}.csv")
        files[name] = tmp_path / f"{name}.csv"
        table[table.text_id.isin(texts.text_id)].to_csv(files[name], index=False)
    name = f"export-{uuid.uuid4().hex[:8]}"
    argv = ["export", "mlflow", "--experiment", name, "--rubric", str(RUBRIC), "--no-progress"]
    argv += [arg for t, path in files.items() for arg in (f"--{t}", str(path))]
    assert run_cli(argv) == 0
    assert f"2 traces, {len(pd.read_csv(files['annotations']))} HUMAN feedback" in capsys.readouterr().out
    assert len(search_traces(mlflow.MlflowClient(), name)) == 2
    assert run_cli(argv) == 2  # again: the traces would be there twice
    assert (
        capsys.readouterr().err.strip()
        == f"error: setting --experiment: experiment {name!r} already holds traces: export into a new one"
    )
    assert len(search_traces(mlflow.MlflowClient(), name)) == 2


def test_tables_logged_as_traces_read_back_the_same(simulated, rubric):
    keep = sorted(simulated.texts.text_id)[:3]
    part = Tables(
        simulated.annotations[simulated.annotations.text_id.isin(keep)],
        simulated.features[simulated.features.text_id.isin(keep)],
        simulated.texts[simulated.texts.text_id.isin(keep)],
    )
    name, eid = new_experiment()
    log_tables(eid, part, rubric)
    got = read_traces(search_traces(mlflow.MlflowClient(), name), rubric, system_tag="system_id")
    key = ["text_id", "judge_id", "question_id"]
    want = part.annotations[key + ["answer"]].sort_values(key).reset_index(drop=True)
    assert got.annotations.sort_values(key).reset_index(drop=True).equals(want)
    fkey = ["text_id", "source", "question_id", "option"]
    merged = got.features.merge(part.features, on=fkey, suffixes=("", "_given"))
    assert len(merged) == len(part.features) and (merged.prob - merged.prob_given).abs().max() < 1e-12
    assert dict(zip(got.texts.text_id, got.texts.system_id)) == dict(zip(part.texts.text_id, part.texts.system_id))


@pytest.fixture(scope="module")
def checkpoint(simulated, rubric, tmp_path_factory):
    model = NetworkCalibrator(rubric, {"ensemble": 1}, FAST).fit(simulated)
    return model.save(tmp_path_factory.mktemp("scorer") / "calibrator.safetensors")


def test_the_scorer_is_the_score_command_under_a_thread_pool(simulated, rubric, checkpoint, tmp_path):
    keep = sorted(simulated.texts.text_id)[:6]
    name, eid = new_experiment()
    log_tables(eid, simulated.subset(keep), rubric)
    traces = search_traces(mlflow.MlflowClient(), name)
    scorer = CalibratedScorer(checkpoint=str(checkpoint), questions=["Q0", "Q1"])
    with ThreadPoolExecutor(4) as pool:  # as evaluate's pool calls it
        together = list(pool.map(lambda t: scorer(trace=t), traces))
    want = score_texts(
        load_model(checkpoint), simulated.features[simulated.features.text_id.isin(keep)], questions=["Q0", "Q1"]
    )
    want = want.scores.set_index(["text_id", "question_id"])["mean"]
    close = lambda value, key: value == pytest.approx(want[key], abs=1e-6)  # float32 batches of one text or six
    for trace, feedbacks in zip(traces, together):
        text_id = trace_text_id(trace)
        assert [f.name for f in feedbacks] == ["llmrubric/Q0", "llmrubric/Q1"]
        for f in feedbacks:
            assert close(f.value, (text_id, f.name.split("/")[1]))
            assert f.source.source_type == "CODE" and f.source.source_id == "calibrator.safetensors"
            assert "calibrator.safetensors" in f.rationale and "90% interval" in f.rationale
    given = CalibratedScorer(checkpoint=str(checkpoint), features=str(ROOT / "data" / "simulated" / "features.csv"))
    assert close(given(inputs={"text_id": keep[0]})[0].value, (keep[0], "Q0"))


def test_a_trace_without_judge_feedback_is_a_scorer_error_not_a_value(rubric, checkpoint):
    name, eid = new_experiment()
    a = trace(eid, "q", "r", "v1")
    feedback(a, "Q0", 3, "HUMAN", "ann@x")
    [bare] = search_traces(mlflow.MlflowClient(), name)
    with pytest.raises(InputError, match=f"text {a!r} has no LLM answer distributions"):
        CalibratedScorer(checkpoint=str(checkpoint))(trace=bare)
