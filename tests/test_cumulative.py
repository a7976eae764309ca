"""Cumulative-link heads (model.head=ordinal|combined): distributions, judges, monotonicity,
extrapolation to a system beyond the training ones, checkpoints and configuration errors."""

import numpy as np
import pandas as pd
import pytest
import torch
from support.settings import FAST

from llmrubric.config import group
from llmrubric.data.simulate import simulate_shift
from llmrubric.evaluation.metrics import evaluate
from llmrubric.io.errors import InputError
from llmrubric.model.families.network.calibrator import NetworkCalibrator, fit_together
from llmrubric.model.families.network.cumulative import CumulativeNet

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("cumulative")

ORDINAL, COMBINED = group("model", "ordinal"), group("model", "combined")


@pytest.fixture(scope="module")
def shift(rubric):
    tables, _ = simulate_shift(1, n_texts=360, rubric=rubric)
    best = tables.texts.text_id[tables.texts.system_id == "S01"]
    return tables.subset(set(tables.text_ids) - set(best)), tables.subset(best)


@pytest.fixture(scope="module")
def fitted(rubric, shift):
    return fit_together(
        [
            NetworkCalibrator(rubric, ORDINAL, FAST, 0),
            NetworkCalibrator(rubric, COMBINED, FAST, 0),
            NetworkCalibrator(rubric, {"ensemble": 1}, FAST, 0),
        ],
        [shift[0]] * 3,
    )


@pytest.mark.slow
def test_heads_predict_distributions_and_judges_shift_the_cut_points(fitted, shift, rubric):
    ordinal, combined, network = fitted
    assert len(ordinal.nets_) == len(combined.nets_) == ORDINAL["ensemble"] == 5  # the shipped heads: 5 members
    assert all(isinstance(n, CumulativeNet) and n.head == "ordinal" for n in ordinal.nets_)
    assert not isinstance(network.net_, CumulativeNet)
    for model in (ordinal, combined):
        pred = model.predict(shift[1])
        p = pred[pred.question_id == "Q0"][["p_1", "p_2", "p_3", "p_4"]].to_numpy()
        assert np.allclose(p.sum(1), 1) and (p >= 0).all()
        assert np.isfinite(evaluate(pred, shift[1].annotations, rubric.main, per_judge=False)["nll"])
        q8 = pred[pred.question_id == "Q8"]
        assert q8["p_4"].isna().all() and np.allclose(q8[["p_1", "p_2", "p_3"]].sum(axis=1), 1)
    net, data = ordinal.nets_[0], ordinal.encode(shift[1])
    assert net.judge_cuts.abs().sum() > 0  # judges learned their own cut points
    for j in (0, 3, -1):
        judge = torch.full((len(data),), j)
        assert torch.allclose(
            torch.softmax(net(data.x, judge), -1),
            torch.softmax(net.for_judge(j)(data.x, torch.full_like(judge, -1)), -1),
            atol=1e-6,
        )
    assert not torch.allclose(
        net(data.x, torch.zeros(len(data), dtype=torch.long)), net(data.x, torch.ones(len(data), dtype=torch.long))
    )


@pytest.mark.slow
def test_monotone_weights_are_nonnegative_on_each_questions_own_blocks(fitted):
    blocks = fitted[0].layout_.blocks
    for net in fitted[0].nets_:
        assert net.monotone_mask.sum() == len(blocks) == 27  # 9 questions x 3 sources
        for q, b in zip(*net.monotone_mask.nonzero(as_tuple=True)):
            assert blocks[int(b)].question_id == fitted[0].rubric.ids[int(q)]
        assert (net.weights()[net.monotone_mask] >= 0).all()


@pytest.mark.slow
def test_ordinal_head_extrapolates_to_a_system_beyond_the_training_ones(fitted, shift, rubric):
    """S01 is much better than every training system: the ordinal head ranks it above all of them."""
    ordinal = fitted[0]
    train, best = shift
    mean = lambda model, tables: model.predict(tables, questions=["Q0"]).groupby("system_id")["mean"].mean()
    seen = mean(ordinal, train)
    assert mean(ordinal, best)["S01"] > seen.max() + 0.1


@pytest.mark.slow
def test_checkpoints_round_trip(fitted, shift, tmp_path):
    for i, model in enumerate(fitted[:2]):
        loaded = NetworkCalibrator.load(model.save(tmp_path / f"m{i}.safetensors"))
        assert loaded.model["head"] == model.model["head"] and all(isinstance(n, CumulativeNet) for n in loaded.nets_)
        pd.testing.assert_frame_equal(loaded.predict(shift[1]), model.predict(shift[1]))
    assert NetworkCalibrator.load(fitted[2].save(tmp_path / "net.safetensors")).model["head"] == "softmax"


def test_bad_head_settings_are_named(rubric):
    with pytest.raises(InputError, match="model.head"):
        NetworkCalibrator(rubric, {**ORDINAL, "head": "logit"})
    with pytest.raises(InputError, match="personalize=none"):
        NetworkCalibrator(rubric, {**ORDINAL, "personalize": "input"})
    with pytest.raises(InputError, match="inputs=expected"):
        NetworkCalibrator(rubric, {**ORDINAL, "inputs": "probabilities"})


@pytest.mark.slow
def test_scoring_fast_path_covers_the_cumulative_heads(fitted, shift):
    from llmrubric.scoring.scores import score_texts

    for model in fitted[:2]:
        result = score_texts(model, shift[1].features, shift[1].texts, keep_predictions=True)
        assert result.summary["fast_path"]
        slow = model.predict(shift[1], result.predictions[["text_id", "judge_id", "system_id"]].drop_duplicates())
        fast = result.predictions.merge(slow, on=["text_id", "judge_id", "question_id"], suffixes=("", "_slow"))
        assert len(fast) == len(result.predictions) and np.allclose(fast["mean"], fast["mean_slow"], atol=1e-5)


def test_cumulative_heads_refuse_a_categorical_question(rubric):
    from llmrubric.io.rubric import Rubric

    data = rubric.to_dict()
    for q in data["questions"]:
        if q["id"] == "Q8":
            q["ordered"] = False
    categorical = Rubric.from_dict(data, "categorical.yaml")
    with pytest.raises(InputError, match=r"categorical.yaml.*\['Q8'\] are categorical"):
        NetworkCalibrator(categorical, ORDINAL)
    assert NetworkCalibrator(categorical, {"ensemble": 1}).model["head"] == "softmax"


@pytest.mark.slow
def test_cumulative_heads_run_the_stacked_networks_epoch_loop_pruning_included(rubric, shift):
    """The L-BFGS heads report every epoch to ``on_epoch`` like the stacked networks, and can be pruned."""
    calls = []

    def prune_the_ordinal_head(phase, epoch, main_nll):
        calls.append((phase, epoch, sorted(main_nll)))
        return [0] if epoch == 1 else None

    ordinal, network = fit_together(
        [NetworkCalibrator(rubric, ORDINAL, FAST, 0), NetworkCalibrator(rubric, {"ensemble": 1}, FAST, 0)],
        [shift[0]] * 2,
        on_epoch=prune_the_ordinal_head,
    )
    assert ordinal.pruned_ and not network.pruned_
    pretrain = ordinal.summaries_[0]["pretrain"]
    assert pretrain["stopped"] == "pruned" and pretrain["epochs"] == 2
    assert "finetune" not in ordinal.summaries_[0]  # a pruned model skips its later phase
    assert [0] in [ids for _, _, ids in calls] and [1] in [ids for _, _, ids in calls]
    assert all(set(entry) == {"epoch", "train/loss", "val/nll", "iterations"} for entry in pretrain["history"])
