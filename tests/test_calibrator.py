import logging

import numpy as np
import pandas as pd
import pytest
from support.settings import FAST, PAPER

from llmrubric.data.splits import holdout_texts
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables
from llmrubric.model.families.network.calibrator import NetworkCalibrator

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("calibrator")


@pytest.fixture(scope="module")
def split(simulated):
    train_texts, test_texts = holdout_texts(simulated.text_ids, 0.3, seed=0)
    return simulated.subset(train_texts), simulated.subset(test_texts)


@pytest.fixture(scope="module")
def fitted(rubric, split):
    return NetworkCalibrator(rubric, trainer=FAST, seed=3).fit(split[0])


@pytest.mark.slow
def test_predictions_are_distributions_with_mean_and_variance(fitted, split, rubric):
    pred = fitted.predict(split[1])
    assert set(pred.question_id) == set(rubric.ids)
    q0 = pred[pred.question_id == "Q0"]
    p = q0[["p_1", "p_2", "p_3", "p_4"]].to_numpy()
    assert np.allclose(p.sum(1), 1) and (p >= 0).all()
    assert np.allclose(q0["mean"], p @ [1, 2, 3, 4])
    assert np.allclose(q0["var"], p @ np.square([1, 2, 3, 4]) - q0["mean"] ** 2)
    q8 = pred[pred.question_id == "Q8"]
    assert q8["p_4"].isna().all() and np.allclose(q8[["p_1", "p_2", "p_3"]].sum(axis=1), 1)


@pytest.mark.slow
def test_same_seed_same_predictions(rubric, split, fitted):
    again = NetworkCalibrator(rubric, trainer=FAST, seed=3).fit(split[0])
    pd.testing.assert_frame_equal(again.predict(split[1]), fitted.predict(split[1]))
    other = NetworkCalibrator(rubric, trainer=FAST, seed=4).fit(split[0])
    assert not np.allclose(other.predict(split[1])["mean"], fitted.predict(split[1])["mean"])


def test_checkpoint_round_trip_is_exact_and_pickle_free(fitted, split, tmp_path):
    path = fitted.save(tmp_path / "model.safetensors")
    assert path.read_bytes()[:8] != b"\x80\x04\x95"
    loaded = NetworkCalibrator.load(path)
    pd.testing.assert_frame_equal(loaded.predict(split[1]), fitted.predict(split[1]))
    assert loaded.layout_ == fitted.layout_ and loaded.judges_ == fitted.judges_


@pytest.mark.slow
def test_unseen_judge_gets_shared_weights_and_a_warning(rubric, split, caplog):
    fitted = NetworkCalibrator(rubric, PAPER, FAST, seed=3).fit(split[0])  # the paper's judge deltas
    test = split[1]
    pairs = pd.DataFrame({"text_id": [test.text_ids[0]] * 2, "judge_id": ["J01", "NEWJUDGE"]})
    with caplog.at_level(logging.WARNING):
        data = fitted.encode(test, pairs)
    assert "NEWJUDGE" in caplog.text
    assert data.judge.tolist() == [fitted.judges_.judges.index("J01"), -1]
    net = fitted.net_
    probs = fitted.predict(test, pairs, ["Q0"])
    saved = [d.detach().clone() for d in net.delta_parameters()]
    for d in net.delta_parameters():
        d.data.zero_()
    zeroed = fitted.predict(test, pairs, ["Q0"])
    for d, s in zip(net.delta_parameters(), saved):
        d.data.copy_(s)
    assert np.allclose(probs.iloc[1, 4:], zeroed.iloc[1, 4:]) and not np.allclose(probs.iloc[0, 4:], zeroed.iloc[0, 4:])


@pytest.mark.slow
def test_layout_mismatch_at_prediction_is_an_error(fitted, split):
    feats = split[1].features
    wrong = feats[~((feats.question_id == "Q3") & (feats.option == "4"))].copy()
    wrong.attrs["source"] = "features.csv"
    with pytest.raises(InputError, match="layout mismatch.*Q3"):
        fitted.predict(Tables(split[1].annotations, wrong))
    renamed = feats.assign(source="other-llm")
    renamed.attrs["source"] = "features.csv"
    with pytest.raises(
        InputError, match="share no block"
    ) as info:  # absent blocks are marginalised; none shared is an error
        fitted.predict(Tables(split[1].annotations, renamed))
    assert info.value.file == "features.csv"


@pytest.mark.slow
def test_restricted_inputs(rubric, split):
    q0_only = NetworkCalibrator(rubric, trainer=FAST, feature_questions=["Q0"]).fit(split[0])
    assert [b.question_id for b in q0_only.layout_.blocks] == ["Q0"] and q0_only.layout_.dim == 5


def _held_out_systems(rubric, tables, group, **trainer):
    """The systems of the early-stopping texts of each member's split (``trainer``: its settings)."""
    calibrator = NetworkCalibrator(rubric, {"ensemble": 2}, {**FAST, **trainer}, seed=0, group=group)
    _, trains, vals, _ = calibrator._members(tables)
    system = tables.texts.set_index("text_id").system_id
    return [(set(system[val.pairs.text_id]), set(system[train.pairs.text_id])) for train, val in zip(trains, vals)]


def test_early_stopping_holds_out_whole_systems_when_fitted_for_new_systems(rubric, simulated):
    for held, kept in _held_out_systems(rubric, simulated, "system", val_fraction=0.25, val_min_systems=1):
        assert len(held) == 1 and not held & kept and len(kept) == 3
    for held, kept in _held_out_systems(rubric, simulated, "system", val_fraction=0.5):
        assert len(held) == 2 and not held & kept and len(kept) == 2
    for held, _kept in _held_out_systems(rubric, simulated, "system", val_fraction=0.25, val_group="system"):
        assert len(held) == 1
    # one system of four is a single draw of the shift: val_group=auto holds out texts (2 by default)
    for held, kept in _held_out_systems(rubric, simulated, "system", val_fraction=0.25):
        assert len(held) == 4 and held == kept
    for held, kept in _held_out_systems(rubric, simulated, "system", val_fraction=0.5, val_group="text"):
        assert len(held) == 4 and held == kept
    for held, _kept in _held_out_systems(rubric, simulated, "system", val_fraction=0.1, val_group="system"):
        assert len(held) == 4  # under one system: by text
    for held, _kept in _held_out_systems(rubric, simulated, "text", val_fraction=0.5):
        assert len(held) == 4


def test_auto_fits_its_networks_for_what_it_is_fitted_for(rubric):
    from llmrubric.model.auto import AutoCalibrator

    assert AutoCalibrator(rubric, trainer=FAST, group="system")._candidate("network").group == "system"
    assert AutoCalibrator(rubric, trainer=FAST)._candidate("network").group == "text"
    with pytest.raises(InputError, match="trainer.val_group"):
        NetworkCalibrator(rubric, trainer={**FAST, "val_group": "query"})
