import numpy as np
import pytest
import torch

from llmrubric.calibrator import Calibrator
from llmrubric.data import FeatureLayout, JudgeMap, encode
from llmrubric.model import CalibrationNet
from llmrubric.module import TrainConfig, predict_proba, train_network
from llmrubric.splits import text_folds
from llmrubric.stacked import train_stacked

from conftest import FAST

TRAINER = {**FAST, "delta_l2": 0.01, "weight_decay": 0.001, "batch_size": 32}


def _fold_data(rubric, simulated, k_folds=3):
    layout = FeatureLayout.from_features(simulated.features, rubric)
    judges = JudgeMap.from_annotations(simulated.annotations)
    folds = text_folds(simulated.text_ids, k_folds, seed=0)
    parts = []
    for k in range(k_folds):
        train = encode(simulated.subset(folds.text_id[(folds.fold != k) & (folds.fold != (k + 1) % k_folds)]), rubric, layout, judges)
        val = encode(simulated.subset(folds.text_id[folds.fold == (k + 1) % k_folds]), rubric, layout, judges)
        parts.append((train, val))
    return layout, judges, parts


def _net(layout, judges, rubric, seed, train):
    torch.manual_seed(seed)
    net = CalibrationNet(layout.values, len(judges.judges), [len(q.options) for q in rubric.questions], h1=8, h2=8)
    net.standardize_inputs(train.x, train.judge)
    return net


def test_fold_models_trained_as_one_program_equal_the_per_fold_loop(rubric, simulated):
    """Three fold models (different training rows, validation sets and seeds) trained stacked = trained one by one."""
    layout, judges, parts = _fold_data(rubric, simulated)
    config, main = TrainConfig(**TRAINER), rubric.ids.index(rubric.main.id)
    loop = [_net(layout, judges, rubric, k, tr) for k, (tr, _) in enumerate(parts)]
    loop_summaries = [train_network(net, tr, va, main, config, k) for k, (net, (tr, va)) in enumerate(zip(loop, parts))]
    stacked = [_net(layout, judges, rubric, k, tr) for k, (tr, _) in enumerate(parts)]
    summaries = train_stacked(stacked, [tr for tr, _ in parts], [va for _, va in parts], main, config, [0, 1, 2])
    for a, b, sa, sb, (_, val) in zip(loop, stacked, loop_summaries, summaries, parts):
        assert np.allclose(predict_proba(a, val), predict_proba(b, val), atol=1e-4)
        for phase in ("pretrain", "finetune"):
            assert sa[phase]["best_epoch"] == sb[phase]["best_epoch"]
            assert sa[phase]["val_nll"] == pytest.approx(sb[phase]["val_nll"], abs=1e-5)
        assert len(sb["finetune"]["history"]) == sb["finetune"]["epochs"]


def test_ensemble_engines_agree_and_members_differ(rubric, simulated):
    folds = text_folds(simulated.text_ids, 3, seed=0)
    train, test = simulated.subset(folds.text_id[folds.fold != 0]), simulated.subset(folds.text_id[folds.fold == 0])
    model = {"personalize": "input", "inputs": "expected", "ensemble": 2}
    fits = {e: Calibrator(rubric, model, {**TRAINER, "engine": e}, seed=3).fit(train) for e in ("lightning", "stacked")}
    a, b = (fits[e].predict(test) for e in ("lightning", "stacked"))
    cols = [c for c in a.columns if c.startswith("p_")]
    assert np.allclose(a[cols].fillna(0), b[cols].fillna(0), atol=1e-4)
    members = [fits["stacked"].nets_[m].layer1.weight for m in range(2)]
    assert not np.allclose(members[0].detach(), members[1].detach())
