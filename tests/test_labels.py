"""Few labels (issue 26): PPI/PPI++ through ppi_py, active labelling, a judge added without retraining."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from support.paths import ROOT
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.cli import main
from llmrubric.config import model_file
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.families.baselines import RidgeJudge, answered_pairs
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.model.judges import add_judge
from llmrubric.scoring import labels as lab

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("labels")

SIM = ROOT / "data" / "simulated"

NEW = "J01"


@pytest.mark.slow
def test_ppi_py_matches_the_former_hand_written_ppi_where_both_apply():
    rng = np.random.default_rng(3)
    y = rng.normal(3, 1, 30)
    f = y + rng.normal(0.4, 0.5, 30)
    fu = rng.normal(3.4, 1, 120)
    # the former llmrubric.scoring.leaderboard.ppi_mean: mean f(unlabelled) + mean(Y - f), var f / N + var(Y - f) / n
    old = fu.mean() + (y - f).mean()
    z = stats.norm.ppf(0.975)
    old_half = z * math.sqrt(fu.var(ddof=1) / len(fu) + (y - f).var(ddof=1) / len(y))
    new = lab.uniform_interval("ppi", y, f, fu, 0.05, "normal")
    assert new["estimate"] == pytest.approx(old, abs=1e-9)
    # the same formula; ppi_py divides variances by n, the former code by n - 1
    same_convention = z * math.sqrt(fu.var() / len(fu) + (y - f).var() / len(y))
    assert (new["high"] - new["low"]) / 2 == pytest.approx(same_convention, rel=1e-9)
    assert math.sqrt(29 / 30) * old_half < (new["high"] - new["low"]) / 2 < old_half
    classical = lab.uniform_interval("classical", y, f, fu, 0.05, "normal")
    assert classical["estimate"] == pytest.approx(y.mean()) and classical["high"] - y.mean() == pytest.approx(
        z * y.std() / math.sqrt(30)
    )
    student = lab.uniform_interval("classical", y, f, fu, 0.05, "student")
    assert student["high"] - student["estimate"] == pytest.approx(
        stats.t.ppf(0.975, 29) * y.std(ddof=1) / math.sqrt(30)
    )


def test_ppi_pp_is_no_wider_than_classical_and_ppi_with_useless_predictions():
    rng = np.random.default_rng(0)
    y = rng.normal(3, 1, 20)
    widths = {}
    for name, f, fu in (
        ("good", y + rng.normal(0, 0.3, 20), rng.normal(3, 1, 200)),
        ("noise", rng.normal(3, 2, 20), rng.normal(3, 2, 200)),
    ):
        widths[name] = {m: (lambda o: o["high"] - o["low"])(lab.uniform_interval(m, y, f, fu)) for m in lab.UNIFORM}
    assert widths["good"]["ppi_pp"] < 0.7 * widths["good"]["classical"]
    assert widths["noise"]["ppi"] > widths["noise"]["classical"]  # lambda = 1 pays for bad predictions
    assert widths["noise"]["ppi_pp"] <= widths["noise"]["classical"] * 1.01  # lambda near 0 does not


@pytest.mark.slow
def test_active_estimator_is_ppi_py_under_uniform_probabilities_and_valid_under_active_ones():
    rng = np.random.default_rng(1)
    all_f = rng.normal(3, 1, 100)
    pick = rng.integers(0, 100, 25)
    y = all_f[pick] + rng.normal(0.2, 0.4, 25)
    mine = lab.active_ppi_pp(y, all_f[pick], np.full(25, 0.01), all_f, lam=1.0, small_sample="normal")
    low, high = lab.ppi_py().ppi_mean_ci(y, all_f[pick], all_f, alpha=0.05, lam=1)
    assert (mine["low"], mine["high"]) == (pytest.approx(float(low[0])), pytest.approx(float(high[0])))
    # heteroscedastic labels: drawing by the predicted sd keeps coverage and narrows the interval
    n = 200
    f = rng.normal(3, 0.8, n)
    sd = np.where(np.arange(n) < 40, 1.5, 0.1)
    truth = f + 0.3 + rng.normal(0, 1, n) * sd
    q_active, q_uniform = lab.sampling_probabilities(sd, 0.2), np.full(n, 1 / n)
    result = {}
    for name, q in (("active", q_active), ("uniform", q_uniform)):
        hits, widths = [], []
        for _ in range(400):
            i = rng.choice(n, 20, p=q)
            out = lab.active_ppi_pp(truth[i], f[i], q[i], f)
            hits.append(out["low"] <= truth.mean() <= out["high"])
            widths.append(out["high"] - out["low"])
        result[name] = (np.mean(hits), np.mean(widths))
    assert result["active"][0] >= 0.9 and result["uniform"][0] >= 0.9
    assert result["active"][1] < 0.8 * result["uniform"][1]


def test_sampling_probabilities_grow_with_uncertainty_above_a_floor():
    q = lab.sampling_probabilities(np.array([0.0, 1.0, 3.0, np.nan]), 0.2)
    assert q.sum() == pytest.approx(1) and q[0] == pytest.approx(0.05) and q[3] == pytest.approx(0.05)
    assert q[1] < q[2] and q.min() >= 0.2 / 4
    assert np.allclose(lab.sampling_probabilities(np.zeros(5), 0.3), 0.2)
    with pytest.raises(InputError, match="floor"):
        lab.sampling_probabilities(np.ones(3), 0.0)


def board_predictions() -> pd.DataFrame:
    """Two systems of 30 texts, two judges; the predicted distributions vary by text."""
    rng = np.random.default_rng(0)
    rows = []
    for system, shift in (("A", 0.6), ("B", -0.6)):
        for t in range(30):
            logits = rng.normal(0, 1, 4) + shift * np.arange(4)
            for judge in ("j1", "j2"):
                p = np.exp(logits + rng.normal(0, 0.2, 4))
                rows.append((f"{system}{t:02d}", judge, system, *(p / p.sum())))
    df = pd.DataFrame(rows, columns=["text_id", "judge_id", "system_id", "p_1", "p_2", "p_3", "p_4"])
    df.insert(2, "question_id", "Q")
    p = df[["p_1", "p_2", "p_3", "p_4"]].to_numpy()
    df["mean"], df["var"] = p @ [1, 2, 3, 4], p @ [1, 4, 9, 16] - (p @ [1, 2, 3, 4]) ** 2
    return df


@pytest.fixture
def board_files(tmp_path):
    pred = board_predictions()
    pred.to_csv(tmp_path / "pred.csv", index=False)
    pred.drop_duplicates("text_id")[["text_id", "system_id"]].to_csv(tmp_path / "texts.csv", index=False)
    (tmp_path / "rubric.yaml").write_text("name: t\nquestions:\n  - {id: Q, main: true, options: [1, 2, 3, 4]}\n")
    return tmp_path


def human(text_ids, rnd="1") -> pd.DataFrame:
    """One human answer per text: its predicted mean, rounded, as the label."""
    pred = board_predictions().groupby("text_id")["mean"].mean()
    return pd.DataFrame(
        {
            "text_id": text_ids,
            "judge_id": "h",
            "question_id": "Q",
            "answer": pred[text_ids].round().astype(int),
            "round": rnd,
        }
    )


def suggest(d, out, budget, *extra):
    return main(
        [
            "label",
            "suggest",
            str(d / "pred.csv"),
            "--texts",
            str(d / "texts.csv"),
            "--rubric",
            str(d / "rubric.yaml"),
            "--budget",
            str(budget),
            "--out",
            str(out),
            *extra,
        ]
    )


def build(d, ann, out, *extra):
    return main(
        [
            "leaderboard",
            "build",
            str(d / "pred.csv"),
            "--rubric",
            str(d / "rubric.yaml"),
            "--annotations",
            str(ann),
            "--texts",
            str(d / "texts.csv"),
            "--bootstrap",
            "20",
            "--no-plot",
            "--out-dir",
            str(out),
            *extra,
        ]
    )


@pytest.mark.slow
def test_suggest_then_active_leaderboard_in_two_rounds(board_files):
    d = board_files
    assert suggest(d, d / "r1.csv", 8) == 0
    assert suggest(d, d / "r2.csv", 6, "--round", "2", "--seed", "1") == 0
    r1, r2 = pd.read_csv(d / "r1.csv", dtype={"round": str}), pd.read_csv(d / "r2.csv", dtype={"round": str})
    assert len(r1) == 60 and r1.groupby("system_id").draws.sum().tolist() == [8, 8]
    assert np.allclose(r1.groupby("system_id").prob.sum(), 1) and r1.prob.min() >= 0.2 / 30 - 1e-12
    assert r1.prob.corr(r1.uncertainty) > 0.9  # probabilities grow with the predicted sd
    sampling = pd.concat([r1, r2])
    sampling.to_csv(d / "sampling.csv", index=False)
    drawn = sampling[sampling.draws > 0]
    ann = pd.concat([human(list(g.text_id), rnd) for rnd, g in drawn.groupby("round")])
    ann.to_csv(d / "ann.csv", index=False)
    assert build(d, d / "ann.csv", d / "board", "--sampling", str(d / "sampling.csv")) == 0
    board = pd.read_csv(d / "board" / "leaderboard.csv").set_index("system")
    assert board.loc["A", "labelled"] == 14 and (board.active_ppi_pp_low < board.active_ppi_pp).all()
    assert "classical" not in board.columns  # uniform intervals would be biased under active sampling
    report = json.loads((d / "board" / "leaderboard.json").read_text())
    assert report["settings"]["label_intervals"]["sampling"].startswith("active") and report["settings"][
        "label_intervals"
    ]["k"] == {"A": 14, "B": 14}
    assert "active_ppi_pp_diff_low" in report["comparisons"][0]
    assert "active PPI++ [interval]" in (d / "board" / "leaderboard.md").read_text()
    assert report["settings"]["rank_intervals"]["label_rank"].startswith("Bonferroni: the active PPI++")
    assert (board.label_rank_low <= board.label_rank_high).all() and "label ranks" in (
        d / "board" / "leaderboard.md"
    ).read_text()


@pytest.mark.slow
def test_uniform_labels_give_classical_ppi_and_ppi_pp_with_differences(board_files):
    d = board_files
    human([f"A{i:02d}" for i in range(0, 30, 3)] + [f"B{i:02d}" for i in range(0, 30, 3)]).to_csv(
        d / "ann.csv", index=False
    )
    assert build(d, d / "ann.csv", d / "board") == 0
    board = pd.read_csv(d / "board" / "leaderboard.csv").set_index("system")
    for m in lab.UNIFORM:
        assert (board[f"{m}_low"] < board[m]).all() and (board[m] < board[f"{m}_high"]).all()
    assert ((board.ppi_pp_high - board.ppi_pp_low) <= (board.classical_high - board.classical_low) * 1.01).all()
    comp = pd.read_csv(d / "board" / "comparisons.csv").iloc[0]
    assert comp.ppi_pp_diff == pytest.approx(board.at["A", "ppi_pp"] - board.at["B", "ppi_pp"])
    se = lambda s: (board.at[s, "ppi_pp_high"] - board.at[s, "ppi_pp_low"]) / 2
    assert comp.ppi_pp_diff_high - comp.ppi_pp_diff == pytest.approx(math.hypot(se("A"), se("B")))
    rank_by_ppi_pp = board.ppi_pp.rank(ascending=False)
    assert ((board.label_rank_low <= rank_by_ppi_pp) & (rank_by_ppi_pp <= board.label_rank_high)).all()


def snapshot(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def one_line_exit_2(code, capsys, before, folder, *where):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    for part in where:
        assert part in err[0], (part, err[0])
    assert snapshot(folder) == before  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    ["unknown_text", "not_drawn", "drawn_unlabelled", "zero_prob", "partial_probs", "budget"],
)
def test_bad_label_input_is_one_line_exit_2_and_writes_nothing(case, board_files, capsys):
    d = board_files
    assert suggest(d, d / "s.csv", 5) == 0
    s = pd.read_csv(d / "s.csv", dtype={"round": str})
    drawn = list(s[s.draws > 0].text_id)
    human(drawn).to_csv(d / "ann.csv", index=False)
    capsys.readouterr()
    if case == "budget":
        before = snapshot(d)
        one_line_exit_2(
            suggest(d, d / "s2.csv", 31), capsys, before, d, "texts.csv", "row 1", "'system_id'", "budget 31"
        )
        return
    if case == "unknown_text":
        pd.concat([human(drawn), human(["A00"]).assign(text_id="Z99")]).to_csv(d / "ann.csv", index=False)
        where = ("ann.csv", f"row {len(drawn) + 1}", "'text_id'", "Z99")
    elif case == "not_drawn":
        extra = s[s.draws == 0].text_id.iloc[0]
        pd.concat([human(drawn), human([extra])]).to_csv(d / "ann.csv", index=False)
        where = ("ann.csv", "'text_id'", extra, "not drawn")
    elif case == "drawn_unlabelled":
        human(drawn[1:]).to_csv(d / "ann.csv", index=False)
        row = int(s.index[s.text_id == drawn[0]][0]) + 1
        where = ("s.csv", f"row {row}", "'draws'", drawn[0])
    elif case == "zero_prob":
        s.loc[s.text_id == drawn[0], "prob"] = 0.0
        s.loc[(s.system_id == s.system_id[s.text_id == drawn[0]].iloc[0]) & (s.text_id != drawn[0]), "prob"] /= s.prob[
            (s.system_id == s.system_id[s.text_id == drawn[0]].iloc[0])
        ].sum()
        s.to_csv(d / "s.csv", index=False)
        row = int(s.index[s.text_id == drawn[0]][0]) + 1
        where = ("s.csv", f"row {row}", "'prob'", "probability 0")
    else:
        s.iloc[1:].to_csv(d / "s.csv", index=False)
        where = ("s.csv", "'prob'", "cover 29 of its 30")
    before = snapshot(d)
    one_line_exit_2(build(d, d / "ann.csv", d / "board", "--sampling", str(d / "s.csv")), capsys, before, d, *where)


@pytest.fixture(scope="module")
def judge_world(tmp_path_factory):
    """A small checkpoint trained without judge J01, and J01's annotations of 20 texts."""
    w = tmp_path_factory.mktemp("judges")
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    texts = pd.read_csv(SIM / "texts.csv", dtype=str).head(60)
    keep = set(texts.text_id)
    ann = pd.read_csv(SIM / "annotations.csv", dtype=str)
    ann = ann[ann.text_id.isin(keep)]
    feats = pd.read_csv(SIM / "features.csv", dtype=str)
    feats[feats.text_id.isin(keep)].to_csv(w / "feats.csv", index=False)
    ann[ann.judge_id != NEW].to_csv(w / "train.csv", index=False)
    ann[ann.judge_id == NEW].to_csv(w / "new.csv", index=False)
    tables = load_tables(w / "train.csv", w / "feats.csv", rubric)
    for name, model in (
        ("input", {"ensemble": 2}),
        ("deltas", {"ensemble": 1, "personalize": "deltas"}),
        ("ordinal", {"ensemble": 1, "head": "ordinal", "personalize": "none"}),
        ("none", {"ensemble": 1, "personalize": "none"}),
    ):
        NetworkCalibrator(rubric, model, FAST, 0).fit(tables).save(w / f"{name}.safetensors")
    auto = {**model_file("auto"), "ensemble": 1}
    auto["auto"] = {**auto["auto"], **MAIN_INTERVALS, "folds": 3}  # every member; the choice is not under test
    AutoCalibrator(rubric, auto, FAST, 0).fit(tables).save(w / "auto.safetensors")
    return w, rubric


@pytest.mark.slow
def test_a_judge_added_to_model_auto_reaches_every_member(judge_world, tmp_path):
    w, rubric = judge_world
    old = load_model(w / "auto.safetensors")
    tables = load_tables(w / "new.csv", w / "feats.csv", rubric)
    new = add_judge(old, tables, NEW)
    assert new.judges_.judges == (*old.judges_.judges, NEW) and new.weights_ == old.weights_
    assert all(NEW in member.judges_.judges for member in new.members_.values())
    others = load_tables(w / "train.csv", w / "feats.csv", rubric)
    np.testing.assert_allclose(new.predict_proba(others), old.predict_proba(others), atol=1e-6)
    main_index = rubric.ids.index(rubric.main.id)
    pairs, values = answered_pairs(tables, rubric.main)
    answers = pd.Index(rubric.main.values).get_indexer(values)
    nll = lambda m: -np.log(m.predict_proba(tables, pairs)[np.arange(len(answers)), main_index, answers]).mean()
    assert nll(new) < nll(old)  # the judge's own answers, fitted
    new.save(tmp_path / "auto_new.safetensors")
    back = load_model(tmp_path / "auto_new.safetensors")
    np.testing.assert_allclose(back.predict_proba(tables), new.predict_proba(tables), atol=1e-6)
    assert back.added_judges_[-1]["judge"] == NEW and back.added_judges_[-1]["answers"] == len(answers)


@pytest.mark.parametrize("family", ["input", "deltas", "ordinal"])
@pytest.mark.slow
def test_added_judge_fits_only_its_own_parameters(family, judge_world):
    w, rubric = judge_world
    old = NetworkCalibrator.load(w / f"{family}.safetensors")
    tables = load_tables(w / "new.csv", w / "feats.csv", rubric)
    new = add_judge(old, tables, NEW)
    assert new.judges_.judges == (*old.judges_.judges, NEW) and old.judges_.judges[-1] != NEW
    # every other judge is predicted exactly as before (shared parameters frozen)
    others = load_tables(w / "train.csv", w / "feats.csv", rubric)
    q = f"p_{rubric.main.keys[0]}"
    assert np.allclose(new.predict(others)[q], old.predict(others)[q], atol=1e-6)
    fit = new.summaries_[0]["added_judges"][-1]
    assert fit["l2"] == min(fit["l2_cv"], key=fit["l2_cv"].get) and len(fit["l2_cv"]) == 5  # chosen by CV
    assert (
        fit["nll_fitted"] < fit["nll_unseen"]
        and fit["answers"] == (tables.annotations.question_id == rubric.main.id).sum()
    )
    new.save(w / f"{family}_new.safetensors")
    back = NetworkCalibrator.load(w / f"{family}_new.safetensors")
    assert np.allclose(back.predict(tables)[q], new.predict(tables)[q], atol=1e-6)
    assert not np.allclose(new.predict(tables)[q], old.predict(tables)[q], atol=1e-3)  # J01 was unseen before


@pytest.mark.slow
def test_judges_add_command_and_the_new_judge_in_judge_free_scores(judge_world, tmp_path):
    w, _ = judge_world
    out = tmp_path / "new.safetensors"
    assert (
        main(
            [
                "judges",
                "add",
                str(w / "input.safetensors"),
                str(w / "new.csv"),
                "--features",
                str(w / "feats.csv"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "score",
                "texts",
                str(out),
                str(w / "feats.csv"),
                "--out",
                str(tmp_path / "s.csv"),
                "--trusted-judges",
                NEW,
                "J02",
                "--no-progress",
            ]
        )
        == 0
    )
    scores = pd.read_csv(tmp_path / "s.csv")
    assert (scores.judges == 2).all() and (scores.status == "ok").all()


@pytest.mark.slow
def test_add_judge_refuses_other_families_and_judges_without_parameters(judge_world):
    w, rubric = judge_world
    tables = load_tables(w / "new.csv", w / "feats.csv", rubric)
    with pytest.raises(InputError, match="llmrubric calibrators only, not to a RidgeJudge"):
        add_judge(RidgeJudge(rubric), tables, NEW)
    with pytest.raises(InputError, match="no judge-specific parameters"):
        add_judge(NetworkCalibrator.load(w / "none.safetensors"), tables, NEW)
    with pytest.raises(InputError, match="not trained"):
        add_judge(NetworkCalibrator(rubric), tables, NEW)


@pytest.mark.parametrize("case", ["known_judge", "too_few", "other_rubric"])
@pytest.mark.slow
def test_bad_judges_add_input_is_one_line_exit_2_and_writes_nothing(case, judge_world, tmp_path, capsys):
    w, _ = judge_world
    ann = pd.read_csv(w / "new.csv", dtype=str)
    if case == "known_judge":
        ann = ann.assign(judge_id="J02")
        where = ("a.csv", "row 1", "'judge_id'", "already in the checkpoint")
    elif case == "too_few":
        ann = ann[ann.text_id.isin(ann.text_id.unique()[:3])]
        where = ("a.csv", "'judge_id'", "3 answers of the main question", "at least 5")
    else:
        ann.loc[ann.index[4], "question_id"] = "relevance"
        where = ("a.csv", "row 5", "'question_id'")
    ann.to_csv(tmp_path / "a.csv", index=False)
    before = snapshot(tmp_path)
    code = main(
        [
            "judges",
            "add",
            str(w / "input.safetensors"),
            str(tmp_path / "a.csv"),
            "--features",
            str(w / "feats.csv"),
            "--out",
            str(tmp_path / "o.safetensors"),
        ]
    )
    one_line_exit_2(code, capsys, before, tmp_path, *where)


@pytest.mark.slow
def test_benchmark_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """``benchmarks/labels.py``'s ``main`` (its ``__main__`` exits with what it returns), in this process."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("labels")
    capsys.readouterr()
    code = bench.main(["--reps", "0", "--out", str(tmp_path / "l.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "--reps" in err and not (tmp_path / "l.json").exists()
