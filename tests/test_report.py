"""Oracle inputs, the report's runner, settings and atomic folder, the fast report end to end, and a headless browser check."""

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.scripts import run
from support.settings import FAST, FAST_OVERRIDES

from llmrubric.config import compose
from llmrubric.data.splits import holdout_texts
from llmrubric.experiments import variants as studies
from llmrubric.experiments.experiment import Split
from llmrubric.experiments.variants import Variant, ensemble, run_variants
from llmrubric.io.errors import InputError
from llmrubric.io.files import write_folder
from llmrubric.io.tables import Tables
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.families.baselines import report_methods
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.model.families.oracles import JudgeAnswers, PersonalIsotonic
from llmrubric.report.build import check_report_config
from llmrubric.report.settings import ReportSettings

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("report")

CHROMIUM = Path("/usr/bin/chromium")
ONE = {"ensemble": 1}  # one network, not the model's five: what these tests check holds for each network alike
FAST_REPORT = [
    "report=fast",
    "report.workers=1",
    "report.ablation_questions=[Q1]",
    "report.per_question=[Q0,Q3]",
    "report.lc_fractions=[0.5,1.0]",
    "report.lc_repetitions=1",
    "report.permutations=100",  # p >= 1/101: below alpha 0.05 where a method is clearly better
    "report.bootstrap=20",
    "report.calibration_bootstrap=10",
    "report.diagram_bootstrap=5",
    "report.calibration_min_examples=70",
]


@pytest.fixture(scope="module")
def split(simulated):
    train, test = holdout_texts(simulated.text_ids, 0.3, seed=0)
    return simulated.subset(train), simulated.subset(test)


def test_own_answers_are_the_judges_one_hot_answers(rubric, split):
    test = split[1]
    features = JudgeAnswers(rubric)
    pairs = test.annotations[["text_id", "judge_id"]].drop_duplicates().head(40)
    x = features.transform(test, pairs)
    assert x.shape == (40, features.dim) and features.dim == sum(len(rubric[q].options) for q in rubric.ids[1:])
    assert not any(c.startswith("own/Q0/") for c in features.columns())
    ann = test.annotations.set_index(["text_id", "judge_id", "question_id"]).answer
    columns = features.columns()
    for row, (text, judge) in enumerate(pairs.itertuples(index=False)):
        for q in rubric.ids[1:]:
            block = x[row, [i for i, c in enumerate(columns) if c.startswith(f"own/{q}/")]]
            answer = ann.get((text, judge, q))
            expected = (
                np.zeros(len(rubric[q].options))
                if answer is None
                else np.eye(len(rubric[q].options))[rubric[q].keys.index(answer)]
            )
            assert np.array_equal(block, expected), (text, judge, q)


@pytest.mark.parametrize("others", [False, True])
def test_a_question_nobody_answered_gives_a_zero_block(rubric, split, others):
    test = split[1]
    unanswered = Tables(test.annotations[test.annotations.question_id != "Q2"], test.features, test.texts)
    features = JudgeAnswers(rubric, others=others)
    pairs = unanswered.annotations[["text_id", "judge_id"]].drop_duplicates().head(20)
    x = features.transform(unanswered, pairs)
    q2 = [i for i, c in enumerate(features.columns()) if "/Q2/" in c]
    assert x.shape == (20, features.dim) and not x[:, q2].any() and x.any()


def test_other_judges_answers_exclude_the_target_judge(rubric, split):
    test = split[1]
    ann = test.annotations
    text = ann.groupby("text_id").judge_id.nunique().idxmax()
    judges = sorted(ann[ann.text_id == text].judge_id.unique())
    assert len(judges) >= 2
    features = JudgeAnswers(rubric, others=True, questions=["Q1"])
    x = features.transform(test, pd.DataFrame({"text_id": [text] * len(judges), "judge_id": judges}))
    q1 = ann[(ann.text_id == text) & (ann.question_id == "Q1")].set_index("judge_id").answer
    for row, judge in enumerate(judges):
        others = [a for j, a in q1.items() if j != judge]
        expected = np.mean([np.eye(4)[rubric["Q1"].keys.index(a)] for a in others], axis=0)
        assert np.allclose(x[row], expected)
    assert features.coverage(test) > 0.5
    with pytest.raises(InputError, match="main question"):
        JudgeAnswers(rubric, questions=["Q0", "Q1"])


@pytest.mark.slow
def test_calibrator_appends_pair_features_and_saves_the_oracles(rubric, split, tmp_path):
    train, test = split
    extra = JudgeAnswers(rubric)
    model = NetworkCalibrator(rubric, ONE, FAST, pair_features=extra).fit(train)
    plain = NetworkCalibrator(rubric, ONE, FAST)
    plain.layout_, plain.judges_ = model.layout_, model.judges_
    encoded, plain_x = model.encode(test), plain.encode(test).x
    assert encoded.x.shape[1] == plain_x.shape[1] + extra.dim
    assert np.array_equal(encoded.x[:, : plain_x.shape[1]].numpy(), plain_x.numpy())
    assert np.array_equal(encoded.x[:, -extra.dim :].numpy(), extra.transform(test, encoded.pairs))
    pred = model.predict(test)
    assert np.isfinite(pred["mean"]).all()
    loaded = load_model(model.save(tmp_path / "oracle.safetensors"))  # the oracle's inputs are settings
    assert np.array_equal(loaded.predict_proba(test), model.predict_proba(test))
    only = NetworkCalibrator(rubric, ONE, FAST, pair_features=extra, llm_features=False).fit(train)
    assert only.encode(test).x.shape[1] == extra.dim and np.isfinite(only.predict(test)["mean"]).all()
    with pytest.raises(InputError, match="needs pair_features"):
        NetworkCalibrator(rubric, llm_features=False)


@pytest.mark.slow
def test_personal_isotonic_changes_only_the_point_prediction(rubric, split):
    train, test = split
    model = PersonalIsotonic(NetworkCalibrator(rubric, {**ONE, "personalize": False}, FAST), rubric).fit(train)
    base = model.base.predict(test)
    base = base[base.question_id == "Q0"].reset_index(drop=True)
    corrected = model.predict(test)
    assert len(corrected) == len(base) and set(corrected.question_id) == {"Q0"}
    assert np.allclose(corrected.filter(like="p_").to_numpy(), base.filter(like="p_").to_numpy(), equal_nan=True)
    assert corrected["mean"].between(1, 4).all() and not np.allclose(corrected["mean"], base["mean"])
    for judge, rows in corrected.groupby("judge_id").indices.items():
        order = np.argsort(base["mean"].to_numpy()[rows])
        assert np.all(np.diff(corrected["mean"].to_numpy()[rows][order]) >= -1e-12), judge


@pytest.mark.slow
def test_isotonic_variant_shares_the_base_models_fit(rubric, split, monkeypatch):
    calls = []
    original = studies._run_job
    monkeypatch.setattr(studies, "_run_job", lambda *job: calls.append(job[1].name) or original(*job))
    no_pers = (("personalize", False),)
    requests = {Variant("base", model=no_pers): 1, Variant("base_iso", model=no_pers, isotonic=True): 1}
    out = run_variants(requests, rubric, [Split("s", *split)], ONE, FAST, workers=1)
    assert calls == ["base_iso"] and set(out) == {("base", 0), ("base_iso", 0)}
    assert np.allclose(
        out[("base", 0)].filter(like="p_").to_numpy(), out[("base_iso", 0)].filter(like="p_").to_numpy(), equal_nan=True
    )
    assert not np.allclose(out[("base", 0)]["mean"], out[("base_iso", 0)]["mean"])
    with pytest.raises(InputError, match="share a name"):
        run_variants({Variant("x"): 1, Variant("x", method="constant"): 1}, rubric, [Split("s", *split)], {}, FAST)
    with pytest.raises(InputError, match="only be changed for llm_rubric"):
        run_variants(
            {Variant("x", method="constant", isotonic=False, drop_questions=("Q1",)): 1},
            rubric,
            [Split("s", *split)],
            {},
            FAST,
        )


def test_ensemble_averages_seeds_by_pair(rubric):
    pairs = pd.DataFrame(
        {"text_id": ["a", "b"], "judge_id": ["J", "J"], "round": ["1", "1"], "question_id": ["Q0", "Q0"]}
    )
    one = pairs.assign(p_1=[1.0, 0.0], p_2=0.0, p_3=0.0, p_4=[0.0, 1.0], mean=[1.0, 4.0], var=0.0)
    two = pairs.assign(p_1=[0.0, 0.0], p_2=[1.0, 0.0], p_3=[0.0, 1.0], p_4=0.0, mean=[2.0, 3.0], var=0.0)
    out = ensemble([one, two.iloc[::-1]], rubric, "Q0")
    assert list(out.text_id) == ["a", "b"] and np.allclose(out["mean"], [1.5, 3.5])
    assert np.allclose(out[["p_1", "p_2"]].iloc[0], [0.5, 0.5]) and np.allclose(out["var"], [0.25, 0.25])


@pytest.mark.slow
def test_report_settings_name_the_bad_key(rubric):
    with pytest.raises(InputError, match="report.sections"):
        ReportSettings.from_dict({"sections": ["table1", "tea_leaves"]})
    with pytest.raises(InputError, match="report.lc_fractions"):
        ReportSettings.from_dict({"lc_fractions": [0.0, 1.0]})
    with pytest.raises(InputError, match="report.colour"):
        ReportSettings.from_dict({"colour": "red"})
    cfg = compose("config", ["report=fast", "report.per_question=[Q0,Q42]"])
    assert cfg.report.seeds == 1 and cfg.report.permutations == 1000 and cfg.report.sections[0] == "table1"
    with pytest.raises(InputError, match=r"report.per_question.*Q42"):
        check_report_config(cfg, rubric)
    full = compose("config", ["report=full"])
    assert full.report.permutations >= 10_000
    assert compose("config").report.enabled is False


def test_report_folder_is_replaced_atomically(tmp_path):
    out = tmp_path / "report"
    write_folder(out, {"report.md": b"old", "figures/a.png": b"x"})
    with pytest.raises(TypeError):
        write_folder(out, {"report.md": b"new", "figures/b.png": "not bytes"})
    assert (out / "report.md").read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    write_folder(out, {"report.md": b"new"})
    assert (out / "report.md").read_bytes() == b"new" and not (out / "figures").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fast_report")
    args = [
        "experiment=demo",
        f"run_dir={run_dir}",
        "logger=none",
        *FAST_OVERRIDES,
        *FAST_REPORT,
        "model.auto.candidates=[network,ridge_judge]",  # the report's variants of model=auto, two candidates
    ]
    done = run("evaluate.py", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"report written to {run_dir}/report" in done.stdout
    assert not (run_dir / "folds.csv").exists() and not (run_dir / "metrics.json").exists()
    return run_dir / "report"


@pytest.mark.slow
def test_fast_report_has_every_section_number_and_figure(report_dir):
    files = {p.relative_to(report_dir).as_posix() for p in report_dir.rglob("*") if p.is_file()}
    for name in (
        "report.md",
        "report.html",
        "report.json",
        "table1.csv",
        "significance.csv",
        "calibration.csv",
        "ablations.csv",
        "per_question.csv",
        "oracles.csv",
        "learning_curve.csv",
        "learning_curve_summary.csv",
        "figures/reliability_all.png",
        "figures/judge_distributions.png",
        "figures/learning_curve.png",
    ):
        assert name in files, name
    numbers = json.loads((report_dir / "report.json").read_text())
    table1 = {r["method"]: r for r in numbers["table1"]["rows"]}
    assert len(table1) == len(report_methods()) and table1["llm_rubric"]["pearson"] > table1["expected_llm"]["pearson"]
    assert "3" in table1["llm_rubric"]["pearson_marks"] and table1["random"]["pearson_marks"] == ""
    assert table1["llm_rubric"]["pearson_low"] < table1["llm_rubric"]["pearson"] < table1["llm_rubric"]["pearson_high"]
    smece = numbers["calibration"]["smece"]
    assert set(smece) == {"1", "2", "3", "4"} and all(v["low"] <= v["value"] <= v["high"] for v in smece.values())
    assert {r["variant"] for r in numbers["ablations"]["rows"]} == {
        "llm_rubric",
        "no_finetuning",
        "no_pretraining",
        "no_personalization",
        "without_Q1",
    }
    assert all(0 < r["p_pearson"] <= 1 for r in numbers["ablations"]["rows"] if r["variant"] != "llm_rubric")
    assert [r["question"] for r in numbers["per_question"]["rows"]] == ["Q0", "Q3"]
    assert [r["label"] for r in numbers["oracles"]["rows"]] == ["a", "b", "c", "d", "e", "f"]
    assert [r["fraction"] for r in numbers["learning_curve"]["summary"]] == [0.5, 1.0]
    md = (report_dir / "report.md").read_text()
    for caption in (
        "Table 1: methods",
        "Table 2: ablations",
        "Table 3: per question",
        "Table 1 (oracles)",
        "Learning curve",
    ):
        assert f"**{caption}**" in md
    for figure in re.findall(r"\]\((figures/[^)]+)\)", md):
        assert (report_dir / figure).is_file()
    assert "fewer than 70 pairs" in md and "reliability_system_S1.png" in md and "reliability_system_S2.png" not in md
    html = (report_dir / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") == len(list((report_dir / "figures").glob("*.png")))


@pytest.mark.chromium
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not installed at /usr/bin/chromium (`make setup` installs it with apt-get when run as root)",
)
def test_report_html_loads_every_figure_in_headless_chromium(report_dir):
    profile = report_dir.parent / "chromium-profile"
    screenshot = report_dir.parent / "report_screenshot.png"
    command = [  # one browser run: the page's DOM once its scripts ran, and a screenshot of it
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--window-size=1280,2400",
        f"--screenshot={screenshot}",
        "--dump-dom",
        (report_dir / "report.html").as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    check = re.search(r'id="figure-check"[^>]*data-loaded="(\d+)"[^>]*data-total="(-?\d+)"', dom.stdout)
    assert check, "the figure check did not run"
    figures = len(list((report_dir / "figures").glob("*.png")))
    assert int(check.group(1)) == int(check.group(2)) == figures > 0
    for table in ("table1", "calibration", "ablations", "per_question", "oracles", "learning_curve"):
        assert re.search(rf"<table class=\"report-table\" id=\"{table}\">.*?<td>", dom.stdout, re.S), table
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000


def test_real_data_has_one_judge_per_dialogue_so_no_depersonalized_oracle(llm_rubric_data, rubric):
    synthetic, real = llm_rubric_data
    assert JudgeAnswers(rubric, others=True).coverage(real) == 0.0
    assert JudgeAnswers(rubric, others=True).coverage(synthetic) > 0.5
    pairs = real.annotations[["text_id", "judge_id", "round"]].drop_duplicates()
    x = JudgeAnswers(rubric).transform(real, pairs)
    answered = real.annotations[real.annotations.question_id != "Q0"].groupby(["text_id", "judge_id", "round"]).size()
    assert np.array_equal(x.sum(axis=1), answered.reindex(pd.MultiIndex.from_frame(pairs)).fillna(0).to_numpy())
