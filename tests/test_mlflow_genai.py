"""Calibrated judges inside MLflow's GenAI evaluation, end to end against a real MLflow tracking server
(SQLite store, started by the test): docs/mlflow.md's steps as written (the shipped simulated data as traces with
several raters' HUMAN feedback and an LLM's LLM_JUDGE distributions → ``llmrubric import mlflow`` → ``train.py`` →
the calibrated scorer in ``mlflow.genai.evaluate``) → ``llmrubric score texts --log-to-traces`` → the scores read
back; and the shipped default on real multi-system data (DialSumm, a training system level and a new system)."""

from __future__ import annotations

import json
import math
import shlex
from contextlib import chdir
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow.genai import label_schemas, review_queues
from support.mlflow_server import SERVER_FLAGS, start_server, stop_server
from support.paths import DIALSUMM, ROOT
from support.scripts import run_script
from support.settings import FAST_OVERRIDES, SIMULATED, TABLES

from llmrubric.apps.train import train_app
from llmrubric.cli import main as cli
from llmrubric.config import compose
from llmrubric.io.errors import InputError
from llmrubric.io.tables import read_table
from llmrubric.mlflow_genai.read import read_traces, search_traces
from llmrubric.mlflow_genai.scorer import CalibratedScorer
from llmrubric.mlflow_genai.write import SCORE_NAME
from llmrubric.model.core.system_level import t_interval

pytestmark = [
    pytest.mark.mlflow_server,
    pytest.mark.slow,
    pytest.mark.xdist_group("mlflow_genai"),
]  # one worker starts the server and trains
N_PER_SYSTEM = 3  # the simulated data's first texts of each system: 12, enough for a fast train
EXPERIMENT = "support-bot"  # docs/mlflow.md's
DOC, DOC_HEADING = ROOT / "docs" / "mlflow.md", "## From an empty machine to evaluate's metrics"
# added to the doc's train.py: test_readme.py's quick overrides (trainer=fast, the main question's intervals, one
# network, 3 inner folds) and two candidates (the shipped default, all five, trains on DialSumm below)
QUICK = [*FAST_OVERRIDES, "++model.ensemble=1", "model.auto.folds=3", "model.auto.candidates=[network,ridge_judge]"]
RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"


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


def source(kind: str, source_id: str):
    return mlflow.entities.AssessmentSource(source_type=kind, source_id=source_id)


def ok(*argv: str) -> None:
    assert cli([str(a) for a in argv]) == 0, argv


def doc_blocks(kind: str) -> list[str]:
    """The ``kind`` blocks of docs/mlflow.md's first section (from an empty machine), as written."""
    section = DOC.read_text(encoding="utf-8").split(DOC_HEADING, 1)[1].split("\n## ", 1)[0]
    return [part.split("\n```", 1)[0] for part in section.split(f"```{kind}\n")[1:]]


def doc_commands(block: str) -> list[list[str]]:
    """The argv of each command of a bash block (continued lines joined)."""
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """docs/mlflow.md's commands from an empty machine, run as written in a folder laid out like a checkout
    (``conf/``, ``train.py``, ``data/simulated/`` with the first ``N_PER_SYSTEM`` texts of each system) against the
    module's server (the doc's server command is the one it was started with, on a free port); ``train.py`` gets the
    tests' quick overrides (``QUICK``)."""
    url, _ = server
    folder = tmp_path_factory.mktemp("checkout")
    for name in ("conf", "train.py"):
        (folder / name).symlink_to(ROOT / name)
    data = folder / "data" / "simulated"
    data.mkdir(parents=True)
    texts = pd.read_csv(SIMULATED / "texts.csv").sort_values("text_id").groupby("system_id").head(N_PER_SYSTEM)
    texts.to_csv(data / "texts.csv", index=False)
    for name in ("annotations", "features"):
        table = pd.read_csv(SIMULATED / f"{name}.csv")
        table[table.text_id.isin(texts.text_id)].to_csv(data / f"{name}.csv", index=False)
    start, steps = doc_blocks("bash")[:2]
    [mkdir, serve] = doc_commands(start)
    assert mkdir == ["mkdir", "-p", "mlflow-store"] and serve[:2] == [".venv/bin/mlflow", "server"]
    assert serve[serve.index("--host") + 1] == "127.0.0.1" and set(serve[2::2]) <= set(SERVER_FLAGS), serve
    [export, *commands] = doc_commands(steps)
    assert export == ["export", "MLFLOW_TRACKING_URI=http://127.0.0.1:5000"]  # the module's server: MLFLOW_TRACKING_URI
    assert [c[0] for c in commands] == [".venv/bin/llmrubric"] * 2 + [".venv/bin/python"]
    with chdir(folder):
        for argv in commands:
            if argv[0] == ".venv/bin/llmrubric":
                ok(*argv[1:], *(["--no-progress"] if argv[1] == "export" else []))
            else:
                assert argv[1] == "train.py" and run_script("train.py", [*argv[2:], *QUICK]) == 0, argv
    tables = folder / "tables"
    ids = read_table(tables / "texts.parquet", "texts").set_index("text_id").trace_id.to_dict()
    experiment_id = mlflow.MlflowClient().get_experiment_by_name(EXPERIMENT).experiment_id
    return SimpleNamespace(
        folder=folder,
        experiment_id=experiment_id,
        ids=ids,
        tables=tables,
        checkpoint=folder / "outputs/bot/fold0.safetensors",
    )


def test_several_raters_feedback_becomes_several_judges(trained):
    annotations = read_table(trained.tables / "annotations.parquet", "annotations")
    given = pd.read_csv(SIMULATED / "annotations.csv", dtype=str)
    given = given[given.text_id.isin(trained.ids)]
    assert len(annotations) == len(given) and annotations.judge_id.nunique() == given.judge_id.nunique() > 1
    assert set(annotations.judge_id) == set(given.judge_id)
    assert (annotations.groupby(["text_id", "question_id"]).judge_id.nunique() > 1).any()  # several raters per trace
    texts = read_table(trained.tables / "texts.parquet", "texts")
    assert set(texts.trace_id) == set(trained.ids.values()) and texts.system_id.notna().all()


def test_the_docs_evaluate_runs_as_written_and_scores_go_back_to_the_traces(trained, tmp_path, rubric):
    [snippet] = [b for b in doc_blocks("python") if "mlflow.genai.evaluate" in b]
    names: dict = {}
    with chdir(trained.folder):
        exec(compile(snippet, str(DOC), "exec"), names)
    result = names["result"]
    scores = tmp_path / "scores.csv"
    tables = trained.tables
    ok("score", "texts", trained.checkpoint, tables / "features.parquet", "--texts", tables / "texts.parquet",
       "--out", scores, "--log-to-traces", "--no-progress")  # fmt: skip
    table = pd.read_csv(scores, dtype={"text_id": str})
    means = table.groupby("question_id")["mean"].mean()
    assert result.metrics == pytest.approx({f"llmrubric/{q}/mean": m for q, m in means.items()}, abs=1e-6)
    main = table[table.question_id == rubric.main.id].set_index("text_id")
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
    assert again.counts["code_feedback"] == len(back) * len(means) + len(table.dropna(subset=["mean"]))


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
    ok("import", "mlflow", "--experiment", EXPERIMENT, "--rubric", RUBRIC, "--queue", "to-label",
       "--system-tag", "app_version", "--out-dir", out)  # fmt: skip
    answers = read_table(out / "annotations.parquet", "annotations")
    eve = answers[answers.judge_id == "eve@example.com"]
    assert set(read_table(out / "texts.parquet", "texts").trace_id) == set(queued)
    assert sorted(eve.text_id) == sorted(drawn) and set(eve.answer) == {rubric.main.keys[-1]}


# The shipped default on real multi-system data: DialSumm's coherence (three raters, three LLMs) of 5 systems' first
# 3 dialogues as traces with the raters' HUMAN feedback (5 labelled systems: the fewest that give the default a
# system level), and a 6th system's first 2 with the LLMs' answers alone (a new system): 17 traces, each a round of
# requests to the server in export, evaluate and the scorer (2 + 1 dialogues pass too, but the level's fit then
# meets an empty slice and a singular matrix).
TRAINED, NEW, DIALOGUES, NEW_DIALOGUES = ["A", "B", "C", "F", "G"], "H", 3, 2
MAIN = "coherence"


def dialsumm_tables(tmp) -> dict:
    """The subset's tables and a rubric of the main question, as files: what ``export mlflow`` reads."""
    texts = pd.read_csv(DIALSUMM / "texts.csv", dtype=str)
    queries = sorted(texts.query_id.unique())
    trained = texts.system_id.isin(TRAINED) & texts.query_id.isin(queries[:DIALOGUES])
    texts = texts[trained | (texts.system_id.eq(NEW) & texts.query_id.isin(queries[:NEW_DIALOGUES]))]
    annotations = pd.read_csv(DIALSUMM / "annotations.csv", dtype=str)
    features = pd.read_csv(DIALSUMM / "features.csv", dtype={"text_id": str, "option": str})
    rubric = yaml.safe_load((DIALSUMM / "rubric.yaml").read_text())
    rubric["questions"] = [q for q in rubric["questions"] if q["id"] == MAIN]
    files = {"rubric": tmp / "rubric.yaml", **{t: tmp / f"{t}.csv" for t in TABLES}}
    files["rubric"].write_text(yaml.safe_dump(rubric))
    labelled = texts.text_id[texts.system_id.isin(TRAINED)]
    annotations[annotations.text_id.isin(labelled) & (annotations.question_id == MAIN)].to_csv(
        files["annotations"], index=False
    )
    features[features.text_id.isin(texts.text_id) & (features.question_id == MAIN)].to_csv(
        files["features"], index=False
    )
    texts.to_csv(files["texts"], index=False)
    return files


@pytest.fixture(scope="module")
def dialsumm(server, tmp_path_factory):
    """The subset exported as traces (``llmrubric export mlflow``), imported back and trained on with the shipped
    default (``model=auto``; ``trainer=fast`` as every test)."""
    if not DIALSUMM.is_dir():
        pytest.skip(f"the shared DialSumm set is not at {DIALSUMM}")
    tmp = tmp_path_factory.mktemp("dialsumm")
    files = dialsumm_tables(tmp)
    ok("export", "mlflow", "--features", files["features"], "--annotations", files["annotations"], "--texts",
       files["texts"], "--rubric", files["rubric"], "--experiment", "dialsumm", "--system-tag", "system",
       "--no-progress")  # fmt: skip
    tables = tmp / "tables"
    ok("import", "mlflow", "--experiment", "dialsumm", "--rubric", files["rubric"], "--system-tag", "system",
       "--out-dir", tables)  # fmt: skip
    data = [f"data.train.{t}='{tables / f'{t}.parquet'}'" for t in TABLES]
    config = ["trainer=fast", "logger=none", f"rubric='{files['rubric']}'", *data, f"run_dir='{tmp / 'run'}'"]
    train_app(compose("config", config))
    experiment_id = mlflow.MlflowClient().get_experiment_by_name("dialsumm").experiment_id
    return SimpleNamespace(tables=tables, checkpoint=tmp / "run" / "fold0.safetensors", experiment_id=experiment_id)


def test_the_shipped_default_scores_every_trace_in_evaluate_as_score_texts_does(dialsumm, tmp_path):
    mlflow.set_experiment(experiment_id=dialsumm.experiment_id)
    traces = search_traces(mlflow.MlflowClient(), "dialsumm")
    scorer = CalibratedScorer(checkpoint=str(dialsumm.checkpoint), system_tag="system")
    assert scorer.levelled  # the shipped default weighs a system level on 5 labelled systems
    result = mlflow.genai.evaluate(data=traces, scorers=[scorer])
    scores = tmp_path / "scores.csv"
    tables = dialsumm.tables
    ok("score", "texts", dialsumm.checkpoint, tables / "features.parquet", "--texts", tables / "texts.parquet",
       "--out", scores, "--no-progress")  # fmt: skip
    want = pd.read_csv(scores, dtype={"text_id": str}).set_index("text_id")["mean"]
    levels = pd.read_csv(tmp_path / "scores.levels.csv", dtype={"system_id": str}).set_index("system_id")
    assert set(levels.index) == {*TRAINED, NEW} and set(levels.index[~levels.known]) == {NEW}
    scored = {}
    for trace in search_traces(mlflow.MlflowClient(), "dialsumm"):
        [mine] = [a for a in trace.info.assessments if a.name == f"llmrubric/{MAIN}"]
        assert mine.feedback.error is None, mine.feedback.error
        scored[trace.info.tags["llmrubric.text_id"]] = mine.feedback.value
        system = trace.info.tags["system"]
        assert f"system {system} (" + ("new system" if system == NEW else "training system") in mine.rationale
    assert set(scored) == set(want.index)  # every trace scored, as score texts scores it
    assert pd.Series(scored).sort_index().to_numpy() == pytest.approx(want.sort_index().to_numpy(), abs=1e-5)
    assert result.metrics[f"llmrubric/{MAIN}/mean"] == pytest.approx(want.mean(), abs=1e-5)
    given = CalibratedScorer(  # a features table with its texts: scored together too
        checkpoint=str(dialsumm.checkpoint),
        features=str(tables / "features.parquet"),
        texts=str(tables / "texts.parquet"),
    )
    new = next(t for t in want.index if t.endswith(f"_{NEW}"))
    assert given(inputs={"text_id": new})[0].value == pytest.approx(want[new], abs=1e-5)
    for system, row in levels.iterrows():  # the system view: each system's level and its interval among the metrics
        lo, hi = t_interval(row.level, row.level_sd**2, row.level_df, 0.9)
        view = f"llmrubric/{MAIN}/system/{system}"
        got = [result.metrics[f"{view}{end}/mean"] for end in ("", "/lo", "/hi")]
        assert got == pytest.approx([row.level, lo, hi], abs=1e-6)


def test_a_trace_of_no_system_is_an_error_naming_the_tag_and_the_tag_is_asked_for_up_front(dialsumm):
    [trace, *_] = search_traces(mlflow.MlflowClient(), "dialsumm")
    del trace.info.tags["system"]
    with pytest.raises(InputError, match=f"trace {trace.info.trace_id} has no tag 'system'"):
        CalibratedScorer(checkpoint=str(dialsumm.checkpoint), system_tag="system")(trace=trace)
    with pytest.raises(ValueError, match="has a system level: a text is scored within its system; give system_tag"):
        CalibratedScorer(checkpoint=str(dialsumm.checkpoint))
    with pytest.raises(ValueError, match="give texts"):
        CalibratedScorer(checkpoint=str(dialsumm.checkpoint), features=str(dialsumm.tables / "features.parquet"))


def test_the_commands_reading_predictions_take_the_checkpoints_rubric(dialsumm, tmp_path, capsys):
    tables, predictions = dialsumm.tables, tmp_path / "predictions.parquet"
    ok("score", "texts", dialsumm.checkpoint, tables / "features.parquet", "--texts", tables / "texts.parquet",
       "--out", tmp_path / "scores.csv", "--predictions", predictions, "--no-progress")  # fmt: skip
    suggest = ["label", "suggest", predictions, "--texts", tables / "texts.parquet", "--budget", 1, "--out"]
    assert cli([str(a) for a in [*suggest, tmp_path / "draws.csv"]]) == 2
    err = capsys.readouterr().err
    assert f"questions ['{MAIN}'] are not in the rubric conf/rubric/llm_rubric.yaml" in err and "--checkpoint" in err
    ok(*suggest, tmp_path / "draws.csv", "--checkpoint", dialsumm.checkpoint)
    labelled = tmp_path / "labelled.parquet"  # the labelled systems' predictions: the human leaderboard's systems
    table = pd.read_parquet(predictions)
    table[table.system_id.isin(TRAINED)].to_parquet(labelled)
    ok("leaderboard", "build", labelled, "--texts", tables / "texts.parquet", "--annotations",
       tables / "annotations.parquet", "--checkpoint", dialsumm.checkpoint, "--out-dir", tmp_path / "board",
       "--bootstrap", 50, "--no-plot")  # fmt: skip
    board = pd.read_csv(tmp_path / "board" / "leaderboard.csv", dtype={"system": str})
    assert set(board.system) == set(TRAINED) and board.human.notna().all()
