"""train.py → evaluate.py through Hydra, on the embedded simulated data and on the shared release."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from support.paths import ROOT
from support.scripts import run
from support.search import TINY_SEARCH
from support.settings import FAST, FAST_OVERRIDES, PAPER

from llmrubric.cli import main as cli
from llmrubric.data.splits import holdout_texts
from llmrubric.evaluation.metrics import evaluate
from llmrubric.model.families.network.calibrator import NetworkCalibrator

pytestmark = pytest.mark.slow  # every test trains through the Hydra apps or on the shared release
SETUP = ROOT / "docs" / "setup.md"  # its demo block: what `make demo` prints
# the system protocols' tests check evaluate's system figures, not what model=auto chooses (test_auto.py,
# test_system_level.py): two candidates on three inner folds
SYSTEM_FIGURES_ONLY = ["model.auto.candidates=[network,ridge_judge]", "model.auto.folds=3"]


def test_demo_train_then_evaluate(tmp_path):
    args = ["experiment=demo", f"run_dir={tmp_path}", *FAST_OVERRIDES, "model.ensemble=2"]
    trained = run("train.py", *args)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "fold0.safetensors").is_file() and (tmp_path / "folds.csv").is_file()
    evaluated = run("evaluate.py", *args)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "| llm_rubric |" in evaluated.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())["methods"]
    assert metrics["llm_rubric"]["pearson"] > metrics["expected_llm"]["pearson"]
    printed = evaluated.stdout.splitlines()
    shown = SETUP.read_text(encoding="utf-8").split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert shown[0] in printed  # docs/setup.md's header, and its baselines' rows (not trained as the demo trains)
    assert [r for r in shown if r.startswith("| ") and not r.startswith(("| llm_rubric ", "| method "))] == [
        r for r in printed if r.startswith("| ") and not r.startswith(("| llm_rubric ", "| method "))
    ]
    main = metrics["llm_rubric"]["intervals"]  # metrics.md lists the main question's interval, as metrics.json has it
    assert (
        f"- intervals of Q0 (main question, nominal 0.90): coverage {main['coverage']:.3f}, mean width "
        f"{main['width']:.3f} ({main['pairs']} pairs)"
    ) in (tmp_path / "metrics.md").read_text()
    predictions = pd.read_csv(tmp_path / "predictions.csv")
    assert set(predictions.question_id) == {f"Q{i}" for i in range(9)}
    folds = pd.read_csv(tmp_path / "folds.csv")
    held = set(folds.text_id[folds.fold == 0])
    assert set(predictions.text_id) == held


def test_a_systems_evaluation_writes_the_errors_that_give_a_leaderboard_shift_intervals(tmp_path):
    run_dir, board_dir = tmp_path / "run", tmp_path / "board"
    args = [
        "experiment=demo",
        "protocol=systems",
        f"run_dir={run_dir}",
        "logger=none",
        "model.ensemble=1",
        *FAST_OVERRIDES,
        *SYSTEM_FIGURES_ONLY,
    ]
    for script in ("train.py", "evaluate.py"):
        done = run(script, *args)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "system_errors.csv" in done.stdout
    errors = pd.read_csv(run_dir / "system_errors.csv")
    annotations = pd.read_csv(ROOT / "data" / "simulated" / "annotations.csv")
    main = annotations[annotations.question_id == "Q0"]
    assert sorted(errors.system_id) == sorted(main.system_id.unique())
    human = main.groupby("system_id").answer.mean()
    assert np.allclose(errors.set_index("system_id").human, human.reindex(errors.system_id))
    assert np.allclose(errors.error, errors.predicted - errors.human) and (errors.error != 0).all()
    report = json.loads((run_dir / "metrics.json").read_text())
    figures = report["systems"]["llm_rubric"]
    assert set(report["systems"]) == set(report["methods"]) and figures["groups"] == figures["systems"] == len(errors)
    assert figures["kendall_within_groups"] is None and "2 or more" in figures["kendall_within_groups_reason"]
    assert figures["rms_error"] == pytest.approx(np.sqrt(np.mean(errors.error**2)))

    texts = ROOT / "data" / "simulated" / "texts.csv"
    common = [str(run_dir / "predictions.csv"), "--texts", str(texts), "--bootstrap", "50", "--no-plot"]
    assert (
        cli(
            [
                "leaderboard",
                "build",
                *common,
                "--shift-errors",
                str(run_dir / "system_errors.csv"),
                "--out-dir",
                str(board_dir),
            ]
        )
        == 0
    )
    board = pd.read_csv(board_dir / "leaderboard.csv")
    half = stats.t.ppf(0.975, df=len(errors)) * np.sqrt(np.mean(errors.error**2))
    assert np.allclose(board.shift_high - board.score, half) and np.allclose(board.score - board.shift_low, half)
    assert (board.shift_high - board.shift_low > board.high - board.low).all()  # wider than sampling alone
    assert "shift interval" in (board_dir / "leaderboard.md").read_text()

    bad = tmp_path / "errors_bad.csv"
    errors.assign(error=errors.error.astype(object).where(errors.index != 1, "n/a")).to_csv(bad, index=False)
    assert cli(["leaderboard", "build", *common, "--shift-errors", str(bad), "--out-dir", str(tmp_path / "b2")]) == 2
    errors.iloc[:1].to_csv(bad, index=False)
    assert cli(["leaderboard", "build", *common, "--shift-errors", str(bad), "--out-dir", str(tmp_path / "b2")]) == 2
    assert not (tmp_path / "b2").exists() or not any((tmp_path / "b2").iterdir())


def test_a_system_groups_evaluation_writes_the_system_figures_of_every_method(tmp_path):
    args = ["experiment=demo", "protocol=system_groups", f"run_dir={tmp_path}", "logger=none", "model.ensemble=1"]
    args += SYSTEM_FIGURES_ONLY
    for script in ("train.py", "evaluate.py"):
        done = run(script, *args, "grouping_seeds=2", *FAST_OVERRIDES)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "grouping1_fold1.safetensors").is_file()
    every = pd.read_csv(tmp_path / "folds.csv")
    assert sorted(every.grouping.unique()) == [0, 1]
    folds = every[every.grouping == 0]
    systems = pd.read_csv(ROOT / "data" / "simulated" / "texts.csv").set_index("text_id").system_id
    assert (folds.set_index("text_id").system_id == systems.reindex(folds.text_id)).all()
    assert every.groupby(["grouping", "system_id"]).fold.nunique().eq(1).all() and folds.fold.nunique() == 2
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["protocol"] == "system_groups" and set(report["systems"]) == set(report["methods"])
    figures = report["systems"]["llm_rubric"]
    assert figures["systems"] == systems.nunique() and figures["groups"] == 2 and figures["groups_ranked"] == 2
    for key in ("rms_error", "kendall", "kendall_within_groups", "kendall_groups", "coverage", "width"):
        assert figures[key] is not None and np.isfinite(figures[key]), key
    assert figures["groupings"] == 2 and -1 <= figures["kendall_groups"] <= 1
    predicted = pd.read_csv(tmp_path / "predictions.csv")  # the first grouping's: each pair once
    assert not predicted.duplicated(["text_id", "judge_id", "question_id"]).any()
    assert sorted(predicted.text_id.unique()) == sorted(folds.text_id)
    assert -1 <= figures["kendall_within_groups"] <= 1 and 0 <= figures["coverage"] <= 1 and figures["width"] > 0
    errors = pd.read_csv(tmp_path / "system_errors.csv")
    assert sorted(errors.system_id) == sorted(systems.unique())
    assert figures["rms_error"] == pytest.approx(np.sqrt(np.mean(errors.error**2)))
    assert f"{systems.nunique()} held-out systems in 2 groups" in (tmp_path / "metrics.md").read_text()


def test_evaluate_with_a_mismatched_checkpoint_writes_nothing(tmp_path):
    args = ["experiment=demo", f"run_dir={tmp_path}", "model.ensemble=1", "model.auto.candidates=[network]"]
    args += FAST_OVERRIDES
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
    for name, model in {"shipped": {}, "paper": PAPER, "none": {"personalize": "none"}}.items():
        pred = NetworkCalibrator(rubric, model, FAST, seed=0).fit(train).predict(test, questions=["Q0"])
        ann = test.annotations[test.annotations.judge_id == judge]
        errors[name] = evaluate(pred[pred.judge_id == judge], ann, rubric.main)["rmse"]
    assert errors["shipped"] < 0.85 * errors["none"] and errors["paper"] < 0.85 * errors["none"], errors


def test_synthetic_to_real_the_shipped_default_beats_the_paper_model_and_the_llm(llm_rubric_data, rubric):
    """``NetworkCalibrator(rubric)`` is the shipped ``llm_rubric`` (README, Table 1): better than the paper's
    network and the expected LLM answer on the real dialogues."""
    from llmrubric.model.families.baselines import make_method

    synthetic, real = llm_rubric_data
    model = evaluate(NetworkCalibrator(rubric, seed=0).fit(synthetic).predict(real), real.annotations, rubric.main)
    paper = evaluate(
        NetworkCalibrator(rubric, PAPER, seed=0).fit(synthetic).predict(real), real.annotations, rubric.main
    )
    llm = evaluate(make_method("expected_llm", rubric).predict(real), real.annotations, rubric.main)
    for other in (paper, llm):
        assert model["rmse"] < other["rmse"] and model["pearson"] > other["pearson"], (model, paper, llm)


def test_train_with_search_selects_refits_and_tracks_nested_trials(tmp_path, mlflow_store):
    import mlflow

    (tmp_path / "conf" / "search").mkdir(parents=True)
    (tmp_path / "conf" / "search" / "tiny.yaml").write_text(TINY_SEARCH)
    run_dir = tmp_path / "run"
    common = [
        "experiment=demo",
        f"run_dir={run_dir}",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "model.ensemble=1",
    ]
    trained = run("train.py", *common, "search=tiny", "logger.experiment=search-e2e")
    assert trained.returncode == 0, trained.stderr[-2000:]
    selected = json.loads((run_dir / "search" / "fold0" / "selected.json").read_text())
    trials = pd.read_csv(run_dir / "search" / "fold0" / "trials.csv")
    assert len(trials) == 3 and selected["nll"] == pytest.approx(trials.value.min())
    assert 0.003 <= selected["trainer"]["lr"] <= 0.03 and (run_dir / "fold0.safetensors").is_file()
    client = mlflow.MlflowClient(mlflow_store)
    experiment = client.get_experiment_by_name("search-e2e")
    runs = client.search_runs([experiment.experiment_id])
    train_run = next(r for r in runs if r.data.tags.get("job") == "train")
    nested = [r for r in runs if r.data.tags.get("job") == "trial"]
    assert len(nested) == 3 and all(r.data.tags["mlflow.parentRunId"] == train_run.info.run_id for r in nested)
    (tmp_path / "conf" / "search" / "bad.yaml").write_text(
        TINY_SEARCH.replace("low: 0.003, high: 0.03", "low: 0.03, high: 0.003")
    )
    bad = run(
        "train.py",
        "experiment=demo",
        f"run_dir={tmp_path / 'bad'}",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "search=bad",
    )
    assert bad.returncode != 0 and "search space" in bad.stderr and "trainer.lr" in bad.stderr
    assert not (tmp_path / "bad" / "search").exists() and not list((tmp_path / "bad").glob("*.safetensors"))


def test_cv_training_runs_every_fold_in_one_stacked_program(tmp_path, monkeypatch):
    import llmrubric.model.families.network.calibrator as calibrator
    from llmrubric.apps.train import train_app
    from llmrubric.config import compose

    stacked = []

    def counting(nets, *args, **kwargs):
        stacked.append(len(nets))
        return train_stacked(nets, *args, **kwargs)

    train_stacked = calibrator.PROGRAMS["stacked"]
    monkeypatch.setitem(calibrator.PROGRAMS, "stacked", counting)
    data = [
        f"data.train.{t}='{ROOT / 'data' / 'simulated' / f'{t}.csv'}'" for t in ("annotations", "features", "texts")
    ]
    overrides = ["experiment=demo", "protocol=cv", "folds=3", "logger=none", f"run_dir='{tmp_path}'", *data]
    cfg = compose("config", [*overrides, "model=default", *FAST_OVERRIDES])
    assert train_app(cfg) > 0
    assert stacked == [3 * cfg.model.ensemble]
    models = [NetworkCalibrator.load(tmp_path / f"fold{fold}.safetensors") for fold in range(3)]
    assert [len(m.nets_) for m in models] == [cfg.model.ensemble] * 3
    assert len({json.dumps(m.train_texts_, sort_keys=True) for m in models}) == 3
