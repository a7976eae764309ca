"""Predictions from part of the feature blocks (issue 34): the answer model and the marginalisation of
absent blocks, checked by value for every family."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import special
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.data.splits import holdout_texts
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core.absent import DRAWS, SEED, batch_of
from llmrubric.model.core.answers import AnswerModel
from llmrubric.model.core.checkpoints import load_model
from llmrubric.model.core.encoding import FeatureLayout, question_targets
from llmrubric.model.families.baselines import RidgeJudge
from llmrubric.model.families.mixed import MixedOrdinal
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.scoring.scores import score_texts

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("absent")

DROPPED = "Q3"  # the block removed in the value tests (a question whose answers move Q0)


@pytest.fixture(scope="module")
def split(simulated):
    train, test = holdout_texts(simulated.text_ids, 0.3, seed=0)
    return simulated.subset(train), simulated.subset(test)


@pytest.fixture(scope="module")
def families(rubric, split):
    """Every family fitted on complete training data (the network and one cumulative head small)."""
    train = split[0]
    main = [rubric.main.id]
    return {
        "network": NetworkCalibrator(rubric, {"ensemble": 1}, FAST, seed=1).fit(train),
        "ordinal": NetworkCalibrator(
            rubric, {"ensemble": 1, "head": "ordinal", "personalize": "none"}, FAST, seed=1
        ).fit(train),
        "ridge_judge": RidgeJudge(rubric).fit(train, main),
        "clmm_all": MixedOrdinal(rubric, "all").fit(train, main),
    }


def without(tables: Tables, texts, question: str = DROPPED) -> Tables:
    """``tables`` with the blocks of ``question`` removed for ``texts``."""
    f = tables.features
    gone = f.text_id.isin(set(texts)) & (f.question_id == question)
    return Tables(tables.annotations, f[~gone], tables.texts)


def with_block_values(tables: Tables, answers: AnswerModel, block: int, values: pd.Series) -> Tables:
    """``tables`` whose ``block`` rows of the texts in ``values`` have the probabilities of those column values."""
    b = answers.layout.blocks[block]
    probs = answers.distributions(block, values.to_numpy()[:, None])
    rows = pd.DataFrame(
        {
            "text_id": np.repeat(values.index.to_numpy(), len(b.options)),
            "source": b.source,
            "question_id": b.question_id,
            "option": np.tile(list(b.options), len(values)),
            "prob": probs.ravel(),
        }
    )
    f = tables.features
    keep = ~(f.text_id.isin(values.index) & (f.source == b.source) & (f.question_id == b.question_id))
    return Tables(tables.annotations, pd.concat([f[keep], rows], ignore_index=True), tables.texts)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["network", "ordinal", "ridge_judge", "clmm_all"])
def test_complete_blocks_predict_as_before(families, split, name):
    model = families[name]
    test = split[1]
    now = model.predict_proba(test)
    answers, model.answers_ = model.answers_, None  # the path of every text before absent blocks were marginalised
    try:
        before = model.predict_proba(test)
    finally:
        model.answers_ = answers
    np.testing.assert_array_equal(now, before)
    batch = batch_of(model, test)
    once = model.proba_completed(batch, batch.columns[:, None, :])[0]
    np.testing.assert_array_equal(np.nan_to_num(once, nan=-1), np.nan_to_num(now, nan=-1))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["network", "ordinal", "ridge_judge", "clmm_all"])
def test_removed_block_is_the_expectation_over_its_likely_answers(families, split, rubric, name):
    """Independent reference: Gauss–Hermite quadrature (40 nodes) over the block's conditional
    distribution, each node predicted as a complete text; marginalisation uses 64 Sobol draws and
    must agree within 0.002 in every probability (it does within about 1e-4), where the old filling
    is off by more than 0.01."""
    model, test = families[name], split[1]
    texts = test.text_ids[::2]
    partial = without(test, texts)
    main = rubric.ids.index(rubric.main.id)
    pairs, _ = question_targets(test, rubric.main)
    marginal = model.predict_proba(partial, pairs)[:, main]
    reference = quadrature(model, test, partial, texts, pairs)[:, main]
    is_partial = pairs.text_id.isin(texts).to_numpy()
    complete = model.predict_proba(test, pairs)[:, main]
    np.testing.assert_allclose(marginal[~is_partial], complete[~is_partial], atol=1e-6)  # float32 batch sizes
    error = np.abs(marginal[is_partial] - reference[is_partial]).max()
    filled = old_filling(model, partial, pairs)[:, main]  # the training mean, or zeros and a flag
    assert error < 0.002 and np.abs(filled[is_partial] - reference[is_partial]).max() > 0.01


def quadrature(model, test: Tables, partial: Tables, texts, pairs: pd.DataFrame) -> np.ndarray:
    """The expectation of ``model.predict_proba(·, pairs)`` over the :data:`DROPPED` block of ``texts`` given
    their blocks in ``partial``: Gauss–Hermite quadrature (40 nodes) over the answer model's conditional
    distribution of its column, each node predicted as a complete text (``test`` with that block value)."""
    answers = model.answers_
    block, column = dropped(answers)
    mean, sd = answers.conditional(answers.columns(partial.features, texts))
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    reference = 0.0
    for node, weight in zip(nodes, weights / weights.sum()):
        u = special.expit(mean[:, column] + node * sd[:, column])
        values = pd.Series(answers.low[column] + (answers.high[column] - answers.low[column]) * u, index=texts)
        reference = reference + weight * model.predict_proba(with_block_values(test, answers, block, values), pairs)
    return reference


def dropped(answers: AnswerModel) -> tuple[int, int]:
    """The block of :data:`DROPPED` in ``answers``' layout and its column."""
    block = next(i for i, b in enumerate(answers.layout.blocks) if b.question_id == DROPPED)
    return block, int(np.flatnonzero(answers.column_block == block)[0])


def old_filling(model, tables: Tables, pairs: pd.DataFrame) -> np.ndarray:
    """``model``'s predictions by the filling of absent blocks before they were marginalised (no answer model)."""
    answers, model.answers_ = model.answers_, None
    try:
        return model.predict_proba(tables, pairs)
    finally:
        model.answers_ = answers


def pair_nll(probs: np.ndarray, answers: np.ndarray) -> float:
    return float(-np.log(np.clip(probs[np.arange(len(answers)), answers], 1e-12, 1)).mean())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["network", "ridge_judge"])
def test_half_the_blocks_is_at_most_halfway_between_all_and_none(families, split, rubric, name):
    model, test = families[name], split[1]
    main, k = rubric.ids.index(rubric.main.id), len(rubric.main.options)
    pairs, y = question_targets(test, rubric.main)
    batch = batch_of(model, test, pairs)
    rng = np.random.default_rng(0)
    half = np.zeros(batch.absent.shape, dtype=bool)
    for t in range(len(half)):
        half[t, rng.permutation(half.shape[1])[: half.shape[1] // 2]] = True

    def nll(mask):
        hidden = batch.hide(mask)
        draws = model.answers_.sample(hidden.columns, DRAWS, SEED)
        return pair_nll(model.proba_completed(hidden, draws).mean(axis=0)[:, main, :k], y)

    every, none, some = pair_nll(model.predict_proba(test, pairs)[:, main, :k], y), nll(~half | half), nll(half)
    assert every < some <= (every + none) / 2


def test_answer_model_intervals_cover_hidden_blocks(simulated, rubric):
    train, test = holdout_texts(simulated.text_ids, 0.3, seed=0)
    layout = FeatureLayout.from_features(simulated.features, rubric)
    answers = AnswerModel.fit(simulated.subset(train).features, layout, rubric)
    truth = answers.columns(simulated.features, test)
    hidden = np.random.default_rng(0).random(truth.shape) < 0.5
    low, high = answers.interval(np.where(hidden, np.nan, truth), 0.8)
    coverage = ((truth >= low) & (truth <= high))[hidden].mean()
    assert 0.7 <= coverage <= 0.9  # 80 % nominal; benchmarks/masking.py measures it on 5 folds
    seen = ~hidden
    np.testing.assert_array_equal(low[seen], truth[seen])
    draws = answers.sample(np.where(hidden, np.nan, truth), 16)
    np.testing.assert_array_equal(draws[:, 3][seen], truth[seen])
    assert (draws[hidden.nonzero()[0], :, hidden.nonzero()[1]].std(axis=1) > 0).all()


@pytest.mark.parametrize("name", ["network", "ridge_judge", "clmm_all"])
def test_answer_model_round_trips_with_the_model(families, split, tmp_path, name, rubric):
    model, test = families[name], split[1]
    partial = without(test, test.text_ids[::3])
    if name == "network":
        model.save(tmp_path / "m.safetensors")
        again = load_model(tmp_path / "m.safetensors")
    else:
        again = type(model).from_state(rubric, *model.state())
    for key in ("mean", "cov", "low", "high", "mass"):
        np.testing.assert_array_equal(getattr(again.answers_, key), getattr(model.answers_, key))
    np.testing.assert_array_equal(again.predict_proba(partial), model.predict_proba(partial))


@pytest.mark.slow
def test_auto_mixes_its_members_completions(rubric, split):
    model = AutoCalibrator(
        rubric,
        {
            "auto": {
                "candidates": ["ridge_judge", "clmm_own"],
                "rule": "stack",
                "folds": 2,
                "system_level": "off",
                **MAIN_INTERVALS,
            }
        },
        FAST,
    )  # the completions are the members' mixture before a system level (a shift per system, docs/adaptive.md)
    model.fit(split[0])
    test = split[1]
    partial = without(test, test.text_ids[::2])
    batch = batch_of(model, partial)
    draws = model.answers_.sample(batch.columns, DRAWS, SEED)
    mixed = model.proba_completed(batch, draws).mean(axis=0)
    main = rubric.ids.index(rubric.main.id)
    np.testing.assert_allclose(model.predict_proba(partial, batch.pairs)[:, main], mixed[:, main], atol=1e-12)
    expected = sum(
        w * model.members_[n].predict_proba(partial, batch.pairs)[:, main] for n, w in model.weights_.items()
    )
    np.testing.assert_allclose(mixed[:, main], expected, atol=1e-12)


@pytest.mark.slow
def test_a_block_absent_from_every_text_is_marginalised(families, split, rubric):
    """The block gone from the whole table: each prediction is the expectation over the block's likely answers
    (:func:`quadrature`), within 0.002, where the old filling by the training mean is off by more than 0.01."""
    model, test = families["ridge_judge"], split[1]
    partial = without(test, test.text_ids)
    pairs, _ = question_targets(test, rubric.main)
    main, k = rubric.ids.index(rubric.main.id), len(rubric.main.options)
    predictions = model.predict(partial, pairs)
    predictions = predictions[predictions.question_id == rubric.main.id]
    reference = quadrature(model, test, partial, test.text_ids, pairs)[:, main, :k]
    np.testing.assert_allclose(predictions[[f"p_{key}" for key in rubric.main.keys]], reference, atol=0.002)
    block, column = dropped(model.answers_)
    fill = pd.Series(model.fill_[column], index=test.text_ids)  # the old filling: the block's training mean
    filled = model.predict_proba(with_block_values(test, model.answers_, block, fill), pairs)[:, main, :k]
    assert np.abs(filled - reference).max() > 0.01


def test_features_that_share_no_block_or_have_other_options_are_one_line_errors(families, split):
    model, test = families["network"], split[1]
    other = test.features.assign(source="another-llm")
    other.attrs["source"] = "features.csv"
    with pytest.raises(InputError, match="share no block") as error:
        model.predict_proba(Tables(test.annotations, other, test.texts))
    assert "features.csv" in str(error.value) and "\n" not in str(error.value)
    f = test.features
    renamed = f.assign(option=np.where(f.question_id == DROPPED, f.option.astype(str) + "x", f.option))
    renamed.attrs["source"] = "features.csv"
    with pytest.raises(InputError, match="has options"):
        model.predict_proba(Tables(test.annotations, renamed, test.texts))


@pytest.mark.slow
def test_score_texts_marginalises_on_its_fast_path(families, split, rubric):
    model, test = families["network"], split[1]
    partial = without(test, test.text_ids[1::2])
    judges = list(model.judges_.judges[:2])
    result = score_texts(model, partial.features, judges=judges, chunk_texts=7, keep_predictions=True)
    assert result.summary["fast_path"] and result.summary["masked_texts"] == len(test.text_ids[1::2])
    pairs = result.predictions[["text_id", "judge_id", "round"]].drop_duplicates().reset_index(drop=True)
    expected = model.predict(Tables(test.annotations.iloc[:0], partial.features), pairs)
    key = ["text_id", "judge_id", "question_id"]
    got = result.predictions.sort_values(key).reset_index(drop=True)
    expected = expected[expected.question_id.isin(got.question_id.unique())].sort_values(key).reset_index(drop=True)
    np.testing.assert_allclose(got["mean"], expected["mean"], atol=1e-5)


def test_drawn_values_map_back_to_each_kind_of_block(rubric):
    """An ordered block's drawn expected answer becomes probabilities with exactly that expected answer;
    a block of named options (its column: the first option's share) its share and the rest."""
    rng = np.random.default_rng(0)
    rows = []
    for t in range(60):
        share, p = rng.random(), rng.dirichlet([1, 1, 1, 1])
        rows += [(f"t{t}", "s", "X", "no", 0.9 * share), (f"t{t}", "s", "X", "yes", 0.9 * (1 - share))]
        rows += [(f"t{t}", "s", "Q0", str(k + 1), p[k]) for k in range(4)]
    features = pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"])
    answers = AnswerModel.fit(features, FeatureLayout.from_features(features, rubric), rubric)
    ordered = answers.distributions(0, np.array([[1.2], [2.5], [3.9]]))
    np.testing.assert_allclose(ordered @ np.arange(1, 5) / ordered.sum(axis=1), [1.2, 2.5, 3.9], atol=1e-6)
    np.testing.assert_allclose(answers.distributions(1, np.array([[0.3]])), [[0.27, 0.63]], atol=1e-6)
