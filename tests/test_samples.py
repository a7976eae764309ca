"""Counted feature blocks (issue 58): the features reader's ``samples`` column, the smoothing every family reads
them through (``model.sample_prior``, saved with the layout), and the draws of ``benchmarks/samples.py``."""

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT
from support.settings import FAST, MAIN_INTERVALS

from llmrubric.extract.adaptive_stop import needs_more
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables, validate_features
from llmrubric.model.auto import AutoCalibrator
from llmrubric.model.core.checkpoints import load_model, save_model
from llmrubric.model.core.encoding import FeatureLayout
from llmrubric.model.core.samples import smoothed, smoothed_tables
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.scoring.scores import score_texts

sys.path.insert(0, str(ROOT / "benchmarks"))
import samples as bench  # noqa: E402

BLOCK = ["text_id", "source", "question_id"]


def block_table(samples) -> pd.DataFrame:
    """Two blocks of three options, rows numbered from 1 as read from a file; ``samples`` one cell per row."""
    df = pd.DataFrame(
        {
            "text_id": ["a"] * 3 + ["b"] * 3,
            "source": "llm",
            "question_id": "q",
            "option": [1, 2, 3] * 2,
            "prob": [2 / 3, 1 / 3, 0.0, 0.2, 0.3, 0.5],
            "samples": samples,
        }
    )
    df.index = pd.RangeIndex(1, len(df) + 1)
    df.attrs["source"] = "features.csv"
    return df


def counted(tables: Tables, k: int, seed: int = 0) -> Tables:
    """``tables`` with every block replaced by drawn answers, ``k`` for the first half of the texts and ``4 k`` for
    the others (with one k for all, smoothing is an affine map of each block's expected answer, which the
    network's standardised inputs absorb), validated as a features file is."""
    features = tables.features.reset_index(drop=True)
    first = features.text_id.isin(tables.text_ids[: len(tables.text_ids) // 2])
    parts = [bench.drawn_features(features[rows], n, seed) for rows, n in ((first, k), (~first, 4 * k))]
    drawn = pd.concat(parts, ignore_index=True)
    drawn.index = pd.RangeIndex(1, len(drawn) + 1)
    drawn.attrs["source"] = f"<k={k}>"
    return Tables(tables.annotations, validate_features(drawn), tables.texts)


@pytest.fixture(scope="module")
def split(simulated):
    texts = simulated.text_ids
    return simulated.subset(texts[:200]), simulated.subset(texts[200:260])


def test_the_reader_carries_samples_as_whole_numbers_na_for_distributions_read_otherwise():
    df = validate_features(block_table(["3", "3", "3", None, None, None]))
    assert str(df["samples"].dtype) == "Int64"
    assert df["samples"].tolist()[:3] == [3, 3, 3] and df["samples"].isna().tolist()[3:] == [True] * 3


@pytest.mark.parametrize(
    ("samples", "row", "says"),
    [
        (["3", "3", "3", "0", "0", "0"], 4, "not a whole number >= 1"),
        (["3", "2.5", "3", None, None, None], 2, "not a whole number >= 1"),
        (["three"] * 6, 1, "not a whole number >= 1"),
        (["3", "3", "4", None, None, None], 3, "differ between rows 1 and 3"),
        (["3", "3", None, None, None, None], 3, "one value per block"),
    ],
)
def test_a_bad_samples_cell_is_one_error_naming_file_row_and_column(samples, row, says):
    with pytest.raises(InputError) as error:
        validate_features(block_table(samples))
    assert error.value.file == "features.csv" and error.value.row == row and error.value.column == "samples"
    assert says in str(error.value) and "\n" not in str(error.value)


def test_smoothing_is_a_dirichlet_toward_uniform_on_counted_blocks_only():
    df = validate_features(block_table(["3", "3", "3", None, None, None]))
    out = smoothed(df, 1.5)
    # (counts + 1.5 / 3) / (3 + 1.5): counts 2, 1, 0
    assert out["prob"].to_numpy()[:3] == pytest.approx([2.5 / 4.5, 1.5 / 4.5, 0.5 / 4.5])
    assert out["prob"].to_numpy()[3:].tolist() == df["prob"].to_numpy()[3:].tolist()
    assert "samples" not in out and smoothed(out, 1.5) is out  # consumed: a second smoothing changes nothing
    assert out.attrs["source"] == "features.csv"


@pytest.mark.slow
def test_logprob_features_are_read_bit_for_bit_whatever_the_prior(split, rubric):
    train, test = split
    assert "samples" not in train.features
    assert FeatureLayout.from_features(train.features, rubric, 5.0).sample_prior is None
    predictions = [
        NetworkCalibrator(rubric, {"ensemble": 1, "sample_prior": prior}, FAST, seed=3).fit(train).predict_proba(test)
        for prior in (0.0, 5.0)
    ]
    assert np.array_equal(predictions[0], predictions[1])


def test_a_bad_sample_prior_names_the_setting(rubric):
    with pytest.raises(InputError) as error:
        NetworkCalibrator(rubric, {"sample_prior": -1})
    assert error.value.setting == "model.sample_prior"


@pytest.mark.slow
def test_the_network_reads_counted_blocks_smoothed_and_its_checkpoint_keeps_the_prior(split, rubric):
    train, test = (counted(t, 2) for t in split)
    model = NetworkCalibrator(rubric, {"ensemble": 1, "sample_prior": 2.0}, FAST, seed=3).fit(train)
    assert model.layout_.sample_prior == 2.0
    by_hand = smoothed_tables(test, 2.0)
    assert "samples" not in by_hand.features
    probs = model.predict_proba(test)
    assert np.array_equal(probs, model.predict_proba(by_hand))
    plain = NetworkCalibrator(rubric, {"ensemble": 1, "sample_prior": 0.0}, FAST, seed=3).fit(train)
    assert not np.allclose(plain.predict_proba(test), probs)  # the prior changed what the network read
    with tempfile.TemporaryDirectory() as folder:
        restored = load_model(save_model(model, Path(folder) / "network.safetensors"))
    assert restored.layout_.sample_prior == 2.0
    assert np.array_equal(restored.predict_proba(test), probs)


@pytest.mark.slow
def test_every_member_of_model_auto_reads_the_smoothed_blocks_and_scoring_does_too(split, rubric):
    train, test = (counted(t, 3) for t in split)
    settings = {
        "ensemble": 1,
        "sample_prior": 1.0,
        "auto": {**MAIN_INTERVALS, "candidates": ["ridge_judge", "clmm_all"], "system_level": "off", "folds": 3},
    }
    model = AutoCalibrator(rubric, settings, FAST, seed=0).fit(train)
    by_hand = AutoCalibrator(rubric, settings, FAST, seed=0).fit(smoothed_tables(train, 1.0))
    assert model.layout_.sample_prior == 1.0 and by_hand.layout_.sample_prior is None
    assert np.allclose(model.predict_proba(test), by_hand.predict_proba(smoothed_tables(test, 1.0)))
    with tempfile.TemporaryDirectory() as folder:
        restored = load_model(save_model(model, Path(folder) / "auto.safetensors"))
    assert restored.layout_.sample_prior == 1.0
    scored = score_texts(restored, test.features, test.texts).scores
    expected = score_texts(by_hand, smoothed(test.features, 1.0), test.texts).scores
    pd.testing.assert_frame_equal(scored, expected, check_exact=False, rtol=1e-6)


@pytest.mark.slow
def test_k_draws_count_k_answers_per_block_and_a_seed_reproduces_them(simulated):
    features = simulated.features.reset_index(drop=True)
    drawn = bench.drawn_features(features, 5, 0)
    counts = (drawn["prob"] * 5).round(9)
    assert np.allclose(counts, counts.round()) and (drawn["samples"] == 5).all()
    assert np.allclose(drawn.groupby(BLOCK, sort=False)["prob"].sum(), 1.0)
    assert drawn["prob"].equals(bench.drawn_features(features, 5, 0)["prob"])
    assert not drawn["prob"].equals(bench.drawn_features(features, 5, 1)["prob"])  # seeds share nothing


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["t", "p", "m"])
def test_the_adaptive_draws_stop_where_the_rule_says_on_the_answers_fixed_k_reads(simulated, rule):
    features = simulated.features.reset_index(drop=True).iloc[:600]
    drawn = bench.adaptive_features(features, 0.15, 12, 0, rule)
    more = {}
    for (text, source, question), block in drawn.groupby(BLOCK, sort=False):
        k = int(block["samples"].iloc[0])
        counts = np.round(block["prob"].to_numpy() * k).astype(int)
        assert counts.sum() == k and 1 <= k <= 12
        assert not bench.stop_rule(rule, block["option"].tolist(), 0.15, 12)(counts)
        more[(text, source, question)] = k
    assert drawn["prob"].equals(bench.adaptive_features(features, 0.15, 12, 0, rule)["prob"])
    sequences = bench.answer_sequences(features, 0, bench.MAX_SAMPLES)
    rows, answers = sequences[0]
    k = int(drawn["samples"].iloc[rows[0]])
    prefix = np.bincount(answers[:k], minlength=len(rows)) / k
    assert np.allclose(drawn["prob"].iloc[rows], prefix)  # the first k answers of the seed's sequence
    assert np.allclose(bench.drawn_features(features, k, 0)["prob"].iloc[rows], prefix)  # as fixed k reads them


def test_the_extractor_rule_spends_answers_in_proportion_to_the_shrunk_spread():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert needs_more([1, 0, 0, 0, 0], 0.5, 40, values)  # one answer estimates no spread
    # n agreeing answers: spread 0, shrunk toward 0.5 (half the gap) by one degree of freedom: sqrt(0.25 / n)
    assert needs_more([3, 0, 0, 0, 0], 0.09, 40, values) and not needs_more([3, 0, 0, 0, 0], 0.1, 40, values)
    # half 1s, half 2s: unbiased variance n / (4 (n - 1)); shrunk: (n / 4 + 0.25) / n; 4 answers 0.559, 6 0.540
    assert needs_more([2, 2, 0, 0, 0], 0.1, 40, values) and not needs_more([3, 3, 0, 0, 0], 0.1, 40, values)
    assert needs_more([2, 2, 2, 0, 0], 0.1, 40, None)  # categories: the indicators' sd (0.866 shrunk) > 0.6
    assert not needs_more([20, 20, 0, 0, 0], 0.1, 40, values)  # the maximum stops it


def test_equal_nll_k_interpolates_in_one_over_k_between_the_grid_points():
    curve = {1: 1.2, 2: 1.0, 10: 0.9}
    assert bench.equal_nll_k(curve, 0.95) == pytest.approx(1 / (0.5 + 0.5 * (0.1 - 0.5)))  # 1/k halfway: 10/3
    assert bench.equal_nll_k(curve, 1.3) == 1.0
    assert bench.equal_nll_k(curve, 0.8) is None  # no k of the grid is as good
    assert bench.equal_nll_k({1: 1.2, 2: 0.9, 5: 1.0}, 0.95) < 2  # not monotone: the first k that reaches it


def test_adaptive_against_fixed_pairs_each_seed_with_its_own_curve():
    rows = [
        {
            "set": "s",
            "protocol": "cv",
            "method": "m",
            "kind": "k",
            "value": k,
            "seed": seed,
            "draws": "paired",
            "pair_nll": 0.9 + (0.3 + seed / 10) / k,
        }
        for seed in (0, 1)
        for k in (1, 2, 5, 10)
    ]
    rows += [
        {
            "set": "s",
            "protocol": "cv",
            "method": "m",
            "kind": "t",
            "value": 0.1,
            "seed": seed,
            "draws": "paired",
            "pair_nll": 0.95,
            "mean_samples_per_block": 3.0,
        }
        for seed in (0, 1)
    ]
    rows.append({**rows[-1], "seed": 7})  # a seed without its fixed-k curve is left out
    out = bench.adaptive_vs_fixed(rows)["s/cv/m"]["t0.1"]
    assert out["seeds"] == 2
    assert out["samples_saved_by_seed"] == pytest.approx([1 - 3 / 6, 1 - 3 / 8])
    assert out["fixed_k_at_equal_nll"] == pytest.approx(0.35 / 0.05)  # the seeds' mean curve: 0.9 + 0.35 / k
    assert out["samples_saved"] == pytest.approx(1 - 3 / 7) and out["seeds_beyond_the_grid"] == 0


def test_the_equal_precision_rules_bound_a_posterior_sd():
    values = np.array([1.0, 2.0, 3.0])
    alpha = np.array([5.0, 1.0, 1.0])  # counts 4, 0, 0
    mean = alpha @ values / alpha.sum()
    sd = np.sqrt((alpha @ values**2 / alpha.sum() - mean**2) / (alpha.sum() + 1))
    assert bench.mean_needs_more(np.array([4, 0, 0]), values, sd - 1e-9, 100)
    assert not bench.mean_needs_more(np.array([4, 0, 0]), values, sd + 1e-9, 100)
    assert not bench.mean_needs_more(np.array([4, 0, 0]), values, 0.0, 4)  # the maximum stops it
    total = alpha.sum()
    option_sd = np.sqrt(alpha * (total - alpha) / (total**2 * (total + 1))).max()
    assert bench.posterior_needs_more(np.array([4, 0, 0]), option_sd - 1e-9, 100)
    assert not bench.posterior_needs_more(np.array([4, 0, 0]), option_sd + 1e-9, 100)
