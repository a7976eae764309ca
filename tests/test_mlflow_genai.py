"""Calibrated judges inside MLflow's GenAI evaluation, end to end against a real MLflow tracking server
(SQLite store, started by the test): an application's traces with several raters' HUMAN feedback and an
LLM judge's LLM_JUDGE distributions → ``llmrubric import mlflow`` → ``train.py`` → the calibrated scorer
in ``mlflow.genai.evaluate`` → ``llmrubric score texts --log-to-traces`` → the scores read back."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.genai import label_schemas, review_queues
from support.mlflow_server import start_server, stop_server
from support.settings import FAST_OVERRIDES, SIMULATED, TABLES

from llmrubric.apps.train import train_app
from llmrubric.cli import main as cli
from llmrubric.config import compose
from llmrubric.io.tables import read_table
from llmrubric.mlflow_genai.read import read_traces, search_traces
from llmrubric.mlflow_genai.scorer import CalibratedScorer
from llmrubric.mlflow_genai.write import SCORE_NAME

pytestmark = [
    pytest.mark.mlflow_server,
    pytest.mark.slow,
    pytest.mark.xdist_group("mlflow_genai"),
]  # one worker starts the server and trains
N_TEXTS = 12  # the simulated data's first texts: enough for a fast train
EXPERIMENT = "support-bot"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow-genai")
    process, url = start_server(tmp)
    before = mlflow.get_tracking_uri()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", url)
        patch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        mlflow.set_tracking_uri(url)
        yield url, tmp
    mlflow.set_tracking_uri(before)
    stop_server(process)


def app_traces(experiment_id: str) -> dict[str, str]:
    """The application's traces (one per simulated text, its system as the tag ``app_version``), each with
    its raters' HUMAN feedback and the LLM judge's LLM_JUDGE feedback (its distribution in the metadata)."""
    texts = pd.read_csv(SIMULATED / "texts.csv", dtype=str).sort_values("text_id").head(N_TEXTS)
    annotations = pd.read_csv(SIMULATED / "annotations.csv", dtype=str)
    features = pd.read_csv(SIMULATED / "features.csv", dtype={"text_id": str, "option": str})
    client, ids = mlflow.MlflowClient(), {}
    for text_id, system in zip(texts.text_id, texts.system_id):
        span = client.start_trace(
            "chat",
            inputs={"question": f"conversation {text_id}"},
            tags={"app_version": system},
            experiment_id=experiment_id,
        )
        client.end_trace(span.trace_id, outputs={"answer": f"the assistant's turns of {text_id}"})
        ids[text_id] = span.trace_id
    mlflow.flush_trace_async_logging()
    human = [
        dict(
            trace_id=ids[r.text_id],
            name=r.question_id,
            value=int(r.answer),
            source=source("HUMAN", f"{r.judge_id}@example.com"),
        )
        for r in annotations[annotations.text_id.isin(ids)].itertuples()
    ]
    judge = []
    for (text_id, qid), block in features[features.text_id.isin(ids)].groupby(["text_id", "question_id"]):
        dist = dict(zip(block.option, block.prob))
        value = int(max(dist, key=dist.get))
        judge.append(
            dict(
                trace_id=ids[text_id],
                name=qid,
                value=value,
                source=source("LLM_JUDGE", "simulated-llm"),
                metadata={"distribution": json.dumps(dist)},
            )
        )
    with ThreadPoolExecutor(8) as pool:  # as an application's raters and judge do: concurrently
        list(pool.map(lambda kwargs: mlflow.log_feedback(**kwargs), human + judge))
    return ids


def source(kind: str, source_id: str):
    return mlflow.entities.AssessmentSource(source_type=kind, source_id=source_id)


def train(tables, run_dir):
    data = [f"data.train.{t}='{tables / f'{t}.parquet'}'" for t in TABLES]
    small = ["++model.ensemble=1", "model.auto.candidates=[network]", "baselines=[]", "logger.experiment=llmrubric"]
    train_app(compose("config", ["experiment=demo", *FAST_OVERRIDES, *small, *data, f"run_dir='{run_dir}'"]))
    return run_dir / "fold0.safetensors"


def ok(*argv: str) -> None:
    assert cli([str(a) for a in argv]) == 0, argv


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """The application's traces imported (``llmrubric import mlflow``) and a checkpoint trained on them."""
    tmp = tmp_path_factory.mktemp("trained")
    experiment_id = mlflow.MlflowClient().create_experiment(EXPERIMENT)
    ids = app_traces(experiment_id)
    tables = tmp / "tables"
    ok("import", "mlflow", "--experiment", EXPERIMENT, "--system-tag", "app_version", "--out-dir", tables)
    checkpoint = train(tables, tmp / "run")
    return SimpleNamespace(experiment_id=experiment_id, ids=ids, tables=tables, checkpoint=checkpoint)


def test_several_raters_feedback_becomes_several_judges(trained):
    annotations = read_table(trained.tables / "annotations.parquet", "annotations")
    given = pd.read_csv(SIMULATED / "annotations.csv", dtype=str)
    given = given[given.text_id.isin(trained.ids)]
    assert len(annotations) == len(given) and annotations.judge_id.nunique() == given.judge_id.nunique() > 1
    assert set(annotations.judge_id) == {f"{j}@example.com" for j in given.judge_id}
    assert (annotations.groupby(["text_id", "question_id"]).judge_id.nunique() > 1).any()  # several raters per trace
    texts = read_table(trained.tables / "texts.parquet", "texts")
    assert set(texts.trace_id) == set(trained.ids.values()) and texts.system_id.notna().all()


def test_calibrated_scores_through_evaluate_and_written_back(trained, tmp_path, rubric):
    mlflow.set_experiment(experiment_id=trained.experiment_id)  # the traces' experiment: their feedback goes along
    traces = search_traces(mlflow.MlflowClient(), EXPERIMENT)
    scorer = CalibratedScorer(checkpoint=str(trained.checkpoint), questions=[rubric.main.id])
    result = mlflow.genai.evaluate(data=traces, scorers=[scorer])
    scores = tmp_path / "scores.csv"
    tables = trained.tables
    ok("score", "texts", trained.checkpoint, tables / "features.parquet", "--texts", tables / "texts.parquet",
       "--out", scores, "--log-to-traces", "--no-progress")  # fmt: skip
    table = pd.read_csv(scores, dtype={"text_id": str})
    main = table[table.question_id == rubric.main.id].set_index("text_id")
    assert result.metrics == {f"llmrubric/{rubric.main.id}/mean": pytest.approx(main["mean"].mean(), abs=1e-6)}
    trace_text = read_table(tables / "texts.parquet", "texts").set_index("trace_id").text_id
    back = search_traces(mlflow.MlflowClient(), EXPERIMENT)
    name = SCORE_NAME.format(question=rubric.main.id)
    for trace in back:
        mine = [a for a in trace.info.assessments if a.name == name and a.source.source_type == "CODE"]
        assert len(mine) == 2 and {a.source.source_id for a in mine} == {"fold0.safetensors"}  # evaluate's, ours
        want = main.loc[trace_text[trace.info.trace_id]]
        for a in mine:
            assert a.feedback.value == pytest.approx(want["mean"], abs=1e-6)
            assert (float(a.metadata["lo"]), float(a.metadata["hi"])) == pytest.approx((want["lo"], want["hi"]))
        from_evaluate = next(a for a in mine if "distribution" in a.metadata)
        dist = json.loads(from_evaluate.metadata["distribution"])
        assert list(dist) == list(rubric.main.keys) and math.isclose(sum(dist.values()), 1, abs_tol=1e-4)
        assert np.dot([float(k) for k in dist], list(dist.values())) == pytest.approx(want["mean"], abs=1e-3)
        assert "fold0.safetensors" in from_evaluate.rationale and "90% interval" in from_evaluate.rationale
    again = read_traces(back, rubric, system_tag="app_version")
    assert len(again.annotations) == len(read_table(tables / "annotations.parquet", "annotations"))  # not feedback
    assert again.counts["code_feedback"] == len(back) + len(table.dropna(subset=["mean"]))  # evaluate's + ours


def test_the_labelling_loop_through_a_review_queue(trained, tmp_path, rubric):
    tables = trained.tables
    predictions = tmp_path / "predictions.parquet"
    ok("score", "texts", trained.checkpoint, tables / "features.parquet", "--texts", tables / "texts.parquet",
       "--out", tmp_path / "scores.csv", "--predictions", predictions, "--no-progress")  # fmt: skip
    ok("label", "suggest", predictions, "--texts", tables / "texts.parquet", "--budget", 1, "--out",
       tmp_path / "draws.csv", "--queue", "to-label", "--experiment", EXPERIMENT, "--reviewers", "eve@example.com")  # fmt: skip
    drawn = pd.read_csv(tmp_path / "draws.csv", dtype={"text_id": str})
    drawn = set(drawn[drawn.draws > 0].text_id)
    schemas = {s.name: s for s in label_schemas.list_label_schemas(experiment_id=trained.experiment_id)}
    assert set(schemas) >= set(rubric.ids) and schemas[rubric.main.id].input.options == [
        o.label for o in rubric.main.options
    ]
    queue = review_queues.get_review_queue(name="to-label", experiment_id=trained.experiment_id)
    assert queue.users == ["eve@example.com"] and set(queue.schema_ids) == {schemas[q].schema_id for q in rubric.ids}
    texts = read_table(tables / "texts.parquet", "texts").set_index("text_id")
    queued = [i.item_id for i in review_queues.list_review_queue_items(queue.queue_id)]
    assert sorted(queued) == sorted(texts.trace_id[list(drawn)])
    for trace_id in queued:  # the reviewer answers the main question in the review UI: HUMAN feedback on the trace
        mlflow.log_feedback(trace_id=trace_id, name=rubric.main.id, value=rubric.main.options[-1].label,
                            source=source("HUMAN", "eve@example.com"))  # fmt: skip
    out = tmp_path / "answers"
    ok("import", "mlflow", "--experiment", EXPERIMENT, "--queue", "to-label", "--system-tag", "app_version",
       "--out-dir", out)  # fmt: skip
    answers = read_table(out / "annotations.parquet", "annotations")
    eve = answers[answers.judge_id == "eve@example.com"]
    assert set(read_table(out / "texts.parquet", "texts").trace_id) == set(queued)
    assert sorted(eve.text_id) == sorted(drawn) and set(eve.answer) == {rubric.main.keys[-1]}
