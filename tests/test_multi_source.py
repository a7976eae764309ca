"""Data unlike the LLM-Rubric release: several LLM sources, summary features, categorical questions."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from support.multi_source_data import SYSTEMS, write_multi_source_data
from support.scripts import run
from support.settings import FAST, FAST_OVERRIDES

from llmrubric.cli import main as cli
from llmrubric.data.splits import holdout_texts
from llmrubric.evaluation.metrics import categorical_metrics, evaluate
from llmrubric.experiments.experiment import Split
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables
from llmrubric.model.families.baselines import expand_baselines, make_method
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.report.plan import ReportPlan
from llmrubric.report.settings import ReportSettings

# the data set's fixture runs the summary CLI (once: one worker runs the module, --dist loadgroup); three tests train
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multi_source")]


@pytest.fixture(scope="module")
def multi_source(tmp_path_factory):
    """The generated data set with its summary-only table made by the CLI, and a features table of both."""
    paths = write_multi_source_data(tmp_path_factory.mktemp("multi_source"), texts_per_system=32)
    paths["summary"] = paths["items"].with_name("summary.parquet")
    assert (
        cli(["extract", "summaries", str(paths["items"]), "--family", "self_rating", "--out", str(paths["summary"])])
        == 0
    )
    paths["features"] = paths["items"].with_name("features.parquet")
    pd.concat([pd.read_parquet(paths["llm_features"]), pd.read_parquet(paths["summary"])]).to_parquet(
        paths["features"], index=False
    )
    return paths


def tables(multi_source, features="features", main=None):
    rubric = Rubric.load(multi_source["rubric"])
    rubric = rubric.with_main(main) if main else rubric
    return rubric, load_tables(multi_source["annotations"], multi_source[features], rubric, multi_source["texts"])


def test_summary_cli_writes_only_summary_blocks(multi_source):
    summary = pd.read_parquet(multi_source["summary"])
    assert set(summary.question_id) == {"self_rating.mean", "self_rating.max"} | {
        f"self_rating.cov_ge{g}" for g in range(1, 6)
    }
    assert (
        summary.text_id.nunique() == 4 * 32
        and (summary.groupby(["text_id", "question_id"]).prob.sum() <= 1 + 1e-9).all()
    )
    assert (
        cli(
            [
                "extract",
                "summaries",
                str(multi_source["llm_features"]),
                "--family",
                "self_rating",
                "--out",
                str(multi_source["summary"]) + ".x",
            ]
        )
        == 2
    )


def test_rubric_kinds_of_question(multi_source):
    rubric = Rubric.load(multi_source["rubric"])
    assert [q.ordered for q in rubric.questions] == [True, False, False]
    assert all(math.isnan(v) for v in rubric["correct"].values)
    coded = Rubric.from_dict({"questions": [{"id": "t", "options": [1, 2, 3], "ordered": False}]})
    assert not coded["t"].ordered and math.isnan(coded["t"].values[0])
    with pytest.raises(InputError, match="ordered options need numeric values"):
        Rubric.from_dict({"questions": [{"id": "t", "options": ["a", "b"], "ordered": True}]})
    with pytest.raises(InputError, match="'ordered' must be true or false"):
        Rubric.from_dict({"questions": [{"id": "t", "options": [1, 2], "ordered": "yes"}]})


def test_categorical_metrics_against_hand_computation():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.1, 0.4], [0.2, 0.3, 0.5]])
    answers = np.array([0, 1, 2, 2])
    m = categorical_metrics(probs, answers)
    assert m["accuracy"] == pytest.approx(0.75)
    assert m["macro_f1"] == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)  # option 0: P 1/2, R 1; option 2: P 1, R 1/2
    brier = (
        (0.3**2 + 0.2**2 + 0.1**2)
        + (0.1**2 + 0.4**2 + 0.3**2)
        + (0.5**2 + 0.1**2 + 0.6**2)
        + (0.2**2 + 0.3**2 + 0.5**2)
    ) / 4
    assert m["brier"] == pytest.approx(brier)


def test_categorical_main_question_learned_and_baselines(multi_source):
    rubric, data = tables(multi_source, main="topic")
    train_texts, test_texts = holdout_texts(data.text_ids, 0.3, seed=0)
    train, test = data.subset(train_texts), data.subset(test_texts)
    names, skipped = expand_baselines(["expected_llm", "constant", "ridge_judge"], rubric, data.features)
    assert (
        names
        == ["expected_llm/llm-a", "expected_llm/llm-b", "expected_llm/llm-c", "expected_llm", "constant", "ridge_judge"]
        and not skipped
    )
    methods = {
        "llm_rubric": NetworkCalibrator(
            rubric, {"ensemble": 1, "inputs": "expected", "personalize": "input"}, FAST, seed=0
        )
    }
    methods.update({n: make_method(n, rubric) for n in names})
    metrics = {n: evaluate(m.fit(train).predict(test), test.annotations, rubric.main) for n, m in methods.items()}
    for values in metrics.values():
        assert set(values) >= {"accuracy", "macro_f1", "nll", "brier"} and "rmse" not in values
        assert all(np.isfinite(values[k]) for k in ("accuracy", "macro_f1", "nll", "brier"))
    # llm-c mislabels 40 % of the topics; the learned methods beat the training marginal and the weak source
    for name in ("llm_rubric", "ridge_judge"):
        assert metrics[name]["accuracy"] > metrics["constant"]["accuracy"] + 0.3
        assert (
            metrics[name]["nll"] < metrics["expected_llm/llm-c"]["nll"]
            and metrics[name]["brier"] < metrics["constant"]["brier"]
        )


def test_summary_features_as_the_only_inputs(multi_source):
    rubric, data = tables(multi_source, features="summary")
    names, skipped = expand_baselines(["expected_llm", "argmax_llm", "constant", "ridge_judge"], rubric, data.features)
    assert names == ["constant", "ridge_judge"] and set(skipped) == {"expected_llm", "argmax_llm"}
    assert "quality" in skipped["expected_llm"]
    with pytest.raises(InputError, match="no feature block of quality"):
        make_method("expected_llm", rubric).predict(data)
    train_texts, test_texts = holdout_texts(data.text_ids, 0.3, seed=0)
    train, test = data.subset(train_texts), data.subset(test_texts)
    ridge = evaluate(make_method("ridge_judge", rubric).fit(train).predict(test), test.annotations, rubric.main)
    model = NetworkCalibrator(rubric, {"ensemble": 1, "inputs": "expected", "personalize": "input"}, FAST, seed=0).fit(
        train
    )
    learned = evaluate(model.predict(test), test.annotations, rubric.main)
    constant = evaluate(make_method("constant", rubric).fit(train).predict(test), test.annotations, rubric.main)
    assert ridge["pearson"] > 0.6 and learned["pearson"] > 0.6 and learned["nll"] < constant["nll"]
    net = model.nets_[0]
    assert int(net.single_option.sum()) == 5  # the cov_ge blocks enter as their covered fraction
    plan = ReportPlan(rubric, [Split("fold0", train, test)], ReportSettings())
    assert plan.methods == [
        "random",
        "constant",
        "ridge_judge",
        "no_personalization",
        "llm_rubric_paper",
        "llm_rubric",
    ]
    assert len(plan.method_notes) == 3 and plan.table3_questions(kept=False) == ["quality", "correct", "topic"]


def test_multi_source_end_to_end(multi_source, tmp_path):
    """Three LLM sources, a 0..3 scale, a yes/no and a categorical question and summary blocks through
    train.py (the default candidates), evaluate.py (default baselines; report=fast, light), llmrubric score texts and
    llmrubric leaderboard build."""
    conf = tmp_path / "conf" / "rubric"
    conf.mkdir(parents=True)
    (conf / "multi_source.yaml").write_text(multi_source["rubric"].read_text())
    run_dir, report_dir = tmp_path / "run", tmp_path / "report"
    args = [
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "rubric=multi_source",
        "name=multi_source",
        f"run_dir={run_dir}",
        "logger=none",
        f"data.train.annotations={multi_source['annotations']}",
        f"data.train.features={multi_source['features']}",
        f"data.train.texts={multi_source['texts']}",
        *FAST_OVERRIDES,
        "model.ensemble=2",
        "model.auto.folds=2",  # the fewest inner folds: the data, not the number of folds, is what this test varies
    ]
    trained = run("train.py", *args)
    assert trained.returncode == 0, trained.stderr[-2000:]
    light = [  # the sections the test reads, three methods of Table 1, one training process, one learning-curve point
        "report.sections=[table1,calibration,per_question,learning_curve]",
        "report.methods=[expected_llm,constant,llm_rubric]",
        # the report's own llm_rubric: model=auto of the network alone (train.py's checkpoint, whose metrics.json
        # figures and predictions are checked below, has the default candidates)
        "++report.model.auto={candidates:[network],folds:2,intervals:main}",
        "report.workers=1",
        "report.lc_fractions=[1.0]",
        "report.lc_repetitions=1",
        "report.permutations=100",
        "report.bootstrap=50",
        "report.calibration_bootstrap=10",
        "report.diagram_bootstrap=5",
    ]
    evaluated = run("evaluate.py", *args, "report=fast", f"report.dir={report_dir}", *light)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]

    methods = json.loads((run_dir / "metrics.json").read_text())["methods"]
    sources = ["llm-a", "llm-b", "llm-c"]
    assert set(methods) == {
        "llm_rubric",
        "constant",
        "ridge_judge",
        "raw_linear_system",
    } | {  # mean_of_sources: expected_llm
        f"{m}{s}" for m in ("expected_llm", "argmax_llm") for s in ["", *[f"/{x}" for x in sources]]
    }
    for values in methods.values():
        assert (
            values["n"] == methods["llm_rubric"]["n"] > 100
            and np.isfinite(values["rmse"])
            and np.isfinite(values["nll"])
        )
    assert (
        methods["llm_rubric"]["nll"] < methods["constant"]["nll"]
        and methods["llm_rubric"]["pearson"] > methods["expected_llm/llm-c"]["pearson"]
    )
    assert (
        methods["expected_llm/llm-a"]["pearson"] > methods["expected_llm/llm-c"]["pearson"]
    )  # the noisier source is worse

    rubric = Rubric.load(multi_source["rubric"])
    predictions = pd.read_csv(run_dir / "predictions.csv", dtype={"text_id": str, "judge_id": str, "round": str})
    annotations = load_tables(multi_source["annotations"], multi_source["features"], rubric).annotations
    assert predictions[predictions.question_id == "topic"]["mean"].isna().all()
    for qid in ("correct", "topic"):
        held = annotations[annotations.text_id.isin(set(predictions.text_id))]
        m = evaluate(predictions, held, rubric[qid])
        assert m["accuracy"] > 0.7 and np.isfinite(m["brier"]) and np.isfinite(m["macro_f1"]), (qid, m)

    report = json.loads((report_dir / "report.json").read_text())
    assert {"table1", "calibration", "per_question", "learning_curve"} <= set(report)
    assert sorted(r["method"] for r in report["table1"]["rows"]) == ["constant", "expected_llm", "llm_rubric"]
    assert [r["question"] for r in report["per_question"]["rows"]] == ["quality"]
    assert "topic: categorical" in (report_dir / "report.md").read_text()

    scores, preds = tmp_path / "scores.csv", tmp_path / "predictions.parquet"
    checkpoint = run_dir / "fold0.safetensors"
    assert (
        cli(
            [
                "score",
                "texts",
                str(checkpoint),
                str(multi_source["features"]),
                "--texts",
                str(multi_source["texts"]),
                "--out",
                str(scores),
                "--predictions",
                str(preds),
                "--no-progress",
            ]
        )
        == 0
    )
    table = pd.read_csv(scores)
    assert set(table.question_id) == {"quality"} and (table.status == "ok").all() and table["mean"].between(0, 3).all()
    board_dir = tmp_path / "board"
    common = [
        str(preds),
        "--rubric",
        str(multi_source["rubric"]),
        "--texts",
        str(multi_source["texts"]),
        "--bootstrap",
        "100",
        "--no-plot",
    ]
    assert (
        cli(
            [
                "leaderboard",
                "build",
                *common,
                "--annotations",
                str(multi_source["annotations"]),
                "--out-dir",
                str(board_dir),
            ]
        )
        == 0
    )
    board = pd.read_csv(board_dir / "leaderboard.csv")
    assert board.system.tolist() == sorted(SYSTEMS, key=SYSTEMS.get, reverse=True)  # systems of rising true quality
    assert (board.low <= board.score).all() and (board.score <= board.high).all()
    assert cli(["leaderboard", "build", *common, "--question", "topic", "--out-dir", str(tmp_path / "topic")]) == 2
    assert (
        cli(
            [
                "score",
                "texts",
                str(checkpoint),
                str(multi_source["features"]),
                "--questions",
                "topic",
                "--out",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "topic").exists() and not (tmp_path / "x.csv").exists()
