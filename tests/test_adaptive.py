"""The adaptive rubric (issue 34): selection, its simulation, adaptive extraction with resume, the
``rubric plan`` command and bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from support.judge_server import judge
from support.paths import ROOT
from support.tiny_models import save_model, write_texts

from llmrubric.cli import main
from llmrubric.config import group
from llmrubric.evaluation.adaptive import masked_proba, plan, prefix_hidden
from llmrubric.extract.backends.base import Backend
from llmrubric.extract.backends.openai_backend import OpenAIBackend
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.io.errors import InputError
from llmrubric.io.tables import read_table
from llmrubric.model.adaptive import Selector, adaptive_settings, explained_variance, reveal_orders
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.scoring.adaptive_extract import extract_adaptive

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("adaptive")

RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"
SOURCE = "simulated-llm"  # the simulated features' source: the tiny model's extraction is named so


@pytest.fixture(scope="module")
def calibrator(rubric, simulated):
    return NetworkCalibrator(rubric, {"ensemble": 1}, group("trainer", "fast")).fit(simulated)


@pytest.fixture(scope="module")
def checkpoint(calibrator, tmp_path_factory):
    return calibrator.save(tmp_path_factory.mktemp("adaptive") / "calibrator.safetensors")


@pytest.fixture(scope="module")
def some_texts(simulated):
    ids = sorted(simulated.features.text_id.unique())[:24]
    return simulated.subset(ids)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, llama, tok):
    return save_model(llama, tok, tmp_path_factory.mktemp("tiny-llama"))


def test_explained_variance_finds_the_block_the_target_depends_on():
    rng = np.random.default_rng(0)
    completions = rng.normal(size=(5, 64, 3))  # texts, draws, columns (one column per block)
    f = 2.0 * completions[:, :, 1] + 0.1 * rng.normal(size=(5, 64))
    gains = explained_variance(f, completions, [np.array([0]), np.array([1]), np.array([2])])
    total = f.var(axis=1, ddof=1)
    assert np.all(gains[:, 1] > 0.95 * total)
    assert np.all(gains[:, [0, 2]] < 0.1 * total[:, None])


def test_the_settings_are_checked_and_name_the_setting():
    assert adaptive_settings({"budget": 3})["budget"] == 3
    for bad, setting in (
        ({"budget": 0}, "adaptive.budget"),
        ({"min_gain": -0.1}, "adaptive.min_gain"),
        ({"cost": "euros"}, "adaptive.cost"),
    ):
        with pytest.raises(InputError, match=setting):
            adaptive_settings(bad)


@pytest.mark.slow
def test_reveal_asks_each_block_once_and_the_expected_reduction_is_what_revealing_removes(calibrator, some_texts):
    selector = Selector(calibrator, {"draws": 32})
    reveal = reveal_orders(selector, selector.batch_of(some_texts))
    n_blocks = len(selector.blocks)
    assert reveal.order.shape == (24, n_blocks)
    assert all(sorted(row) == list(range(n_blocks)) for row in reveal.order)
    assert np.allclose(reveal.variance[:, -1], 0) and np.all(reveal.variance[:, 0] > 0)
    # law of total variance: E[Var after asking b] = Var before - the expected reduction by b (on average over texts)
    removed = reveal.variance[:, :-1] - reveal.variance[:, 1:]
    assert abs(removed[:, 0].mean() - reveal.ratio[:, 0].mean()) < 0.35 * reveal.ratio[:, 0].mean()
    assert removed[:, :3].sum(axis=1).mean() > 0.5 * reveal.variance[:, 0].mean()
    # the stop rule: a text asks the steps before its first one whose ratio is below min_gain, else every block
    min_gain = np.median(reveal.ratio[:, 2])
    calls = reveal.calls(min_gain)
    expected = [next((step for step, r in enumerate(row) if r < min_gain), n_blocks) for row in reveal.ratio]
    assert calls.tolist() == expected
    assert (calls <= 2).sum() >= 12 and (calls > 2).any()  # half the texts stop by step 2, not all
    assert reveal.calls(0.0).tolist() == [n_blocks] * 24 and reveal.calls(np.inf).tolist() == [0] * 24


@pytest.mark.slow
def test_choose_stops_at_the_budget_and_below_min_gain(calibrator, some_texts):
    selector = Selector(calibrator, {"draws": 16, "budget": 2, "min_gain": 0.0})
    state = selector.batch_of(some_texts).hide(np.ones((24, len(selector.blocks)), dtype=bool))
    askable, costs = np.ones(state.absent.shape, dtype=bool), np.ones(state.absent.shape)
    choice, ratio = selector.choose(state, askable, np.zeros(24, dtype=int), costs)
    assert np.all(choice >= 0) and np.all(ratio > 0)
    assert np.all(selector.choose(state, askable, np.full(24, 2), costs)[0] == -1)
    selector.settings["min_gain"] = float(ratio.max()) * 2
    assert np.all(selector.choose(state, askable, np.zeros(24, dtype=int), costs)[0] == -1)
    selector.settings["min_gain"] = 0.0
    cheap = costs.copy()
    cheap[:, 5] = 1e-6  # a nearly free block is asked first
    assert np.all(selector.choose(state, askable, np.zeros(24, dtype=int), cheap)[0] == 5)


def test_masked_predictions_with_nothing_hidden_are_the_models_own(calibrator, some_texts):
    from llmrubric.model.core.absent import batch_of
    from llmrubric.model.core.encoding import pairs_of

    pairs = pairs_of(some_texts.annotations)
    batch = batch_of(calibrator, some_texts, pairs)
    full = masked_proba(calibrator, batch, np.zeros(batch.absent.shape, dtype=bool), draws=4)
    assert np.allclose(full, calibrator.predict_proba(some_texts, pairs), atol=1e-5)
    order = np.tile(np.arange(batch.absent.shape[1]), (len(batch.texts), 1))
    assert prefix_hidden(order, 2, batch.absent.shape[1]).sum(axis=1).tolist() == [batch.absent.shape[1] - 2] * len(
        batch.texts
    )


@pytest.mark.slow
def test_plan_reports_every_budget_and_the_stop_rule(calibrator, some_texts):
    result = plan(Selector(calibrator, {"draws": 16, "min_gain": 0.01}), some_texts, [1, 3, 9])
    rows = {r["rule"]: r for r in result["rows"]}
    assert [rows[f"budget {c}"]["mean_calls"] for c in (1, 3, 9)] == [1.0, 3.0, 9.0]
    assert rows["budget 9"]["rmse_to_all_blocks"] == pytest.approx(0, abs=1e-9)
    assert rows["budget 1"]["expected_sd"] > rows["budget 3"]["expected_sd"] > rows["budget 9"]["expected_sd"]
    assert sum(rows["budget 3"]["asked"].values()) == 3 * 24 and "pair_nll" in rows["budget 3"]
    assert 0 < rows["stop rule (min_gain 0.01)"]["mean_calls"] < 9


class Interrupted(Backend):
    """Delegates to ``inner``; raises KeyboardInterrupt after ``limit`` results; records what it computed."""

    def __init__(self, inner: Backend, limit: int | None = None):
        self.inner, self.limit, self.computed = inner, limit, []

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def score(self, tasks):
        for result in self.inner.score(tasks):
            if self.limit is not None and len(self.computed) >= self.limit:
                raise KeyboardInterrupt
            self.computed.append((result.task.text_id, result.task.question_id))
            yield result


@pytest.mark.slow
def test_an_interrupted_adaptive_extraction_resumes_without_asking_twice(calibrator, model_dir, rubric, tmp_path):
    texts = read_table(write_texts(tmp_path / "texts.jsonl", n=4), "texts")
    tasks, skipped = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    selector = lambda: Selector(calibrator, {"draws": 16, "budget": 3, "min_gain": 0.0})
    backend = TransformersBackend(path=str(model_dir))
    fresh = extract_adaptive(
        tasks, Interrupted(backend), ResultCache(None), SOURCE, selector(), skipped, rubric, progress=False
    )
    cache = ResultCache(tmp_path / "cache.sqlite")
    first = Interrupted(backend, limit=5)
    with pytest.raises(KeyboardInterrupt):
        extract_adaptive(tasks, first, cache, SOURCE, selector(), skipped, rubric, progress=False)
    second = Interrupted(backend)
    resumed = extract_adaptive(tasks, second, cache, SOURCE, selector(), skipped, rubric, progress=False)
    assert len(first.computed) == 5 and not set(first.computed) & set(second.computed)
    assert resumed.summary["cached"] == 5 and resumed.summary["computed"] == len(second.computed)
    assert resumed.summary["asked_blocks"] == fresh.summary["asked_blocks"] == 12
    key = ["text_id", "question_id", "option"]
    pd.testing.assert_frame_equal(
        resumed.features.sort_values(key).reset_index(drop=True), fresh.features.sort_values(key).reset_index(drop=True)
    )
    per_text = fresh.features.groupby("text_id").question_id.nunique()
    assert per_text.tolist() == [3] * 4
    not_asked = fresh.failures[fresh.failures.status == "not_asked"]
    assert len(not_asked) == fresh.summary["saved_blocks"] and not_asked.reason.str.contains("budget of 3").all()


def test_an_adaptive_run_counts_requests_tokens_and_answers_as_a_plain_run(calibrator, rubric, tmp_path):
    texts = read_table(write_texts(tmp_path / "texts.jsonl", n=2), "texts")
    tasks, skipped = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    selector = Selector(calibrator, {"draws": 8, "budget": 2, "min_gain": 0.0})
    with judge(lambda prompt: {"role": "assistant", "content": "3"}) as url:
        backend = OpenAIBackend("m", url, api_key_env=None, mode="sampled", samples=3, samples_per_request=1)
        ex = extract_adaptive(tasks, backend, ResultCache(None), SOURCE, selector, skipped, rubric, progress=False)
    s = ex.summary
    assert s["asked_blocks"] == s["computed"] == 4 and s["answers"] == {"parsed": 12} and s["mean_samples"] == 3
    run = s["this_run"]
    assert (run["requests"], run["retries"], run["prompt_tokens"], run["output_tokens"]) == (12, 0, 12 * 12, 12 * 7)
    assert s["refusal"] == s["unparsed_answers"] == 0


def _extract_argv(texts, out, model_dir, *extra):
    return [
        "extract", "features", str(texts), "--rubric", str(RUBRIC), "--backend", "transformers", "--model",
        str(model_dir), "--source", SOURCE, "--out", str(out), "--no-progress", "--min-label-mass", "0", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_cli_adaptive_extraction_then_scoring_and_plan(checkpoint, model_dir, simulated, tmp_path, capsys):
    texts = write_texts(tmp_path / "texts.jsonl", n=3)
    out = tmp_path / "features.csv"
    assert (
        main(
            _extract_argv(
                texts, out, model_dir, "--adaptive", "--calibrator", str(checkpoint), "--budget", "2", "--min-gain", "0"
            )
        )
        == 0
    )
    features = pd.read_csv(out)
    assert features.groupby("text_id").question_id.nunique().tolist() == [2, 2, 2]
    summary = json.loads((tmp_path / "features.summary.json").read_text())
    assert summary["asked_blocks"] == 6 and summary["saved_blocks"] == summary["askable_blocks"] - 6
    assert (
        main(["score", "texts", str(checkpoint), str(out), "--out", str(tmp_path / "scores.csv"), "--no-progress"]) == 0
    )
    scores = pd.read_csv(tmp_path / "scores.csv")
    assert scores["mean"].notna().all() and (scores.status == "masked").all()
    plan_out = tmp_path / "plan.json"
    argv = ["rubric", "plan", str(ROOT / "data" / "simulated" / "features.csv"), "--calibrator", str(checkpoint)]
    assert main([*argv, "--out", str(plan_out), "--budgets", "1", "2", "--draws", "8", "--min-gain", "0.02"]) == 0
    rows = json.loads(plan_out.read_text())["rows"]
    assert [r["mean_calls"] for r in rows[:2]] == [1.0, 2.0] and rows[-1]["rule"].startswith("stop rule")


def _bad_rubric(tmp_path):
    text = RUBRIC.read_text().replace("naturalness and tone", "tone", 1)
    path = tmp_path / "other_rubric.yaml"
    path.write_text(text)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--adaptive"], "--calibrator"),
        (["--adaptive", "--calibrator", "CKPT", "--budget", "0"], "adaptive.budget"),
        (["--adaptive", "--calibrator", "CKPT", "--min-gain", "-1"], "adaptive.min_gain"),
        (["--adaptive", "--calibrator", "CKPT", "--rubric", "OTHER"], "another rubric"),
        (["--calibrator", "CKPT"], "--adaptive"),
        (["--adaptive", "--calibrator", "CKPT", "--source", "another-llm"], "--source"),
    ],
)
def test_bad_adaptive_input_is_one_line_exit_2_and_nothing_written(
    extra, needle, checkpoint, model_dir, tmp_path, capsys
):
    texts = write_texts(tmp_path / "texts.jsonl", n=2)
    out = tmp_path / "features.csv"
    extra = [str(checkpoint) if e == "CKPT" else str(_bad_rubric(tmp_path)) if e == "OTHER" else e for e in extra]
    assert main(_extract_argv(texts, out, model_dir, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not out.exists() and not (tmp_path / "features.summary.json").exists()
    assert not (tmp_path / "features.csv.cache.sqlite").exists()


def test_plan_of_a_table_whose_blocks_do_not_match_is_exit_2(checkpoint, tmp_path, capsys):
    features = pd.read_csv(ROOT / "data" / "simulated" / "features.csv")
    features["source"] = "another-llm"
    path = tmp_path / "features.csv"
    features.to_csv(path, index=False)
    out = tmp_path / "plan.json"
    assert main(["rubric", "plan", str(path), "--calibrator", str(checkpoint), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]
    assert not out.exists()
    assert (
        main(["rubric", "plan", str(path), "--calibrator", str(checkpoint), "--out", str(out), "--budgets", "0"]) == 2
    )
