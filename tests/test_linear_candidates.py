"""The low-variance candidates of model=auto: ridge with contextual (system-mean) inputs and the
penalised proportional-odds regression (issues 41 and 42)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core import registry
from llmrubric.model.core.checkpoints import load_model, save_model
from llmrubric.model.core.encoding import question_targets
from llmrubric.model.families.ordinal_lr import fit_ordinal, ordinal_proba

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def relevance() -> Rubric:
    return Rubric.load(ROOT / "conf" / "rubric" / "relevance.yaml")


def make_tables(systems: int, texts: int, between: float, within: float, seed: int, with_system=True) -> Tables:
    """One LLM block (a 'covered' probability x) and one judge's 0..3 answer per text: the answer's
    latent slope on x is ``between`` across system means and ``within`` inside a system."""
    rng = np.random.default_rng(seed)
    quality = np.repeat(rng.normal(0, 1, systems), texts)
    noise = rng.normal(0, 1, systems * texts)
    x = 0.5 + 0.1 * quality + 0.1 * noise
    latent = 1.5 + between * 0.1 * quality + within * 0.1 * noise + rng.normal(0, 0.5, systems * texts)
    answer = np.clip(np.round(latent), 0, 3).astype(int)
    ids = [f"t{i:04d}" for i in range(systems * texts)]
    system = [f"S{i // texts}" for i in range(systems * texts)]
    features = pd.DataFrame({"text_id": ids, "source": "llm", "question_id": "signal", "option": "covered", "prob": x})
    annotations = pd.DataFrame(
        {"text_id": ids, "judge_id": "J1", "question_id": "relevance", "answer": answer.astype(str)}
    )
    texts_table = pd.DataFrame({"text_id": ids, "system_id": system}) if with_system else None
    return Tables(annotations, features, texts_table)


def held_out_nll(model, tables: Tables, rubric: Rubric) -> float:
    pairs, y = question_targets(tables, rubric.main)
    p = model.predict_proba(tables, pairs)[:, 0, : len(rubric.main.options)]
    return float(-np.log(p[np.arange(len(y)), y]).mean())


def fitted(name: str, rubric: Rubric, tables: Tables):
    return registry.fit_questions(registry.make(name, rubric), tables, [rubric.main.id])


@pytest.mark.slow
def test_contextual_ridge_learns_a_between_slope_apart_from_the_within_one(relevance):
    train = make_tables(10, 40, between=10.0, within=1.0, seed=0)
    test = make_tables(4, 40, between=10.0, within=1.0, seed=1)
    plain, contextual = fitted("ridge_judge", relevance, train), fitted("ridge_context", relevance, train)
    fit = contextual.fits_["relevance"]
    within, context = fit["coef"][0], fit["coef"][1]  # columns: x, its system mean less the centre, judge
    assert fit["context_scale"][0] > 0
    assert context > 2 * within > 0  # between slope = within + context, far above the within one
    assert held_out_nll(contextual, test, relevance) < held_out_nll(plain, test, relevance) - 0.05


@pytest.mark.slow
def test_without_a_between_effect_or_systems_the_contextual_ridge_is_the_plain_one(relevance):
    same = make_tables(8, 30, between=3.0, within=3.0, seed=2)
    fit = fitted("ridge_context", relevance, same).fits_["relevance"]
    assert abs(fit["coef"][1]) < 0.5 * abs(fit["coef"][0])
    unsystemed = make_tables(8, 30, between=10.0, within=1.0, seed=3, with_system=False)
    model = fitted("ridge_context", relevance, unsystemed)
    plain = fitted("ridge_judge", relevance, unsystemed)
    assert model.fits_["relevance"]["context_scale"][0] == 0.0  # no system ids: no contextual effect
    np.testing.assert_allclose(model.predict_proba(unsystemed), plain.predict_proba(unsystemed), atol=1e-9)


@pytest.mark.slow
def test_contextual_ridge_round_trips_and_a_new_text_without_system_gets_no_context(relevance, tmp_path):
    train = make_tables(6, 30, between=10.0, within=1.0, seed=4)
    model = fitted("ridge_context", relevance, train)
    loaded = load_model(save_model(model, tmp_path / "ridge_context.safetensors"))
    test = make_tables(3, 20, between=10.0, within=1.0, seed=5)
    np.testing.assert_array_equal(loaded.predict_proba(test), model.predict_proba(test))
    alone = Tables(test.annotations, test.features, None)
    x = test.features.prob.to_numpy()
    fit = model.fits_["relevance"]
    expected = fit["intercept"][0] + fit["coef"][0] * x + fit["coef"][2]  # the context column at 0
    np.testing.assert_allclose(model.predict(alone).sort_values("text_id")["mean"].to_numpy(), expected)


def proportional_odds(n: int, slope: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    latent = slope * x[:, 0] + rng.logistic(size=n)
    return x, np.digitize(latent, [-1.0, 0.5, 2.0])


def test_proportional_odds_fit_recovers_the_slope_sign_and_beats_the_constant():
    for slope in (1.5, -1.5):
        x, y = proportional_odds(600, slope, seed=0)
        fit = fit_ordinal(x, y, 4, penalty=1.0)
        assert np.sign(fit["beta"][0]) == np.sign(slope) and abs(fit["beta"][0]) > 3 * np.abs(fit["beta"][1:]).max()
        x_test, y_test = proportional_odds(400, slope, seed=1)
        p = ordinal_proba(x_test, fit)
        np.testing.assert_allclose(p.sum(axis=1), 1.0)
        constant = np.bincount(y, minlength=4) / len(y)
        rows = np.arange(len(y_test))
        assert -np.log(p[rows, y_test]).mean() < -np.log(constant[y_test]).mean() - 0.2
        assert abs(fit_ordinal(x, y, 4, penalty=1e6)["beta"]).max() < 0.01  # the penalty shrinks to 0


@pytest.mark.slow
def test_ordinal_lr_is_deterministic_beats_the_constant_and_round_trips(relevance, tmp_path):
    train = make_tables(8, 40, between=6.0, within=6.0, seed=6)
    test = make_tables(4, 40, between=6.0, within=6.0, seed=7)
    model = fitted("ordinal_lr", relevance, train)
    again = fitted("ordinal_lr", relevance, train)
    np.testing.assert_array_equal(model.predict_proba(test), again.predict_proba(test))
    assert model.fits_["relevance"]["beta"][0] > 0  # one judge: no judge offsets, one input column
    assert model.fits_["relevance"]["beta"].shape == (1,)
    constant = fitted("constant", relevance, train)
    assert held_out_nll(model, test, relevance) < held_out_nll(constant, test, relevance) - 0.1
    loaded = load_model(save_model(model, tmp_path / "ordinal_lr.safetensors"))
    np.testing.assert_array_equal(loaded.predict_proba(test), model.predict_proba(test))
