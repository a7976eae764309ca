import subprocess
import sys

import numpy as np
import pytest
import torch
from support.paths import ROOT
from support.settings import FAST

from llmrubric.config import TrainConfig
from llmrubric.data.splits import text_folds
from llmrubric.model.core.accelerator import needs_fabric
from llmrubric.model.core.encoding import FeatureLayout, JudgeMap, encode
from llmrubric.model.families.network import engine
from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.model.families.network.engine import train_stacked
from llmrubric.model.families.network.net import CalibrationNet

TRAINER = {**FAST, "delta_l2": 0.01, "weight_decay": 0.001, "batch_size": 32}

# the engines draw different input dropout masks: they are compared without; bare networks are the paper's
NO_DROPOUT = {"input_dropout": 0.0}
PAPER_NET = {"inputs": "probabilities", "personalize": "deltas", **NO_DROPOUT}


@pytest.fixture(scope="module")
def few(simulated):
    """120 of the simulated texts (360 pairs): several batches per fold model, as few as show the equivalences."""
    return simulated.subset(simulated.text_ids[:120])


def _fold_data(rubric, simulated, k_folds=3):
    layout = FeatureLayout.from_features(simulated.features, rubric)
    judges = JudgeMap.from_annotations(simulated.annotations)
    folds = text_folds(simulated.text_ids, k_folds, seed=0)
    parts = []
    for k in range(k_folds):
        train = encode(
            simulated.subset(folds.text_id[(folds.fold != k) & (folds.fold != (k + 1) % k_folds)]),
            rubric,
            layout,
            judges,
        )
        val = encode(simulated.subset(folds.text_id[folds.fold == (k + 1) % k_folds]), rubric, layout, judges)
        parts.append((train, val))
    return layout, judges, parts


def _net(layout, judges, rubric, seed, train, input_dropout=0.0):
    torch.manual_seed(seed)
    options = [len(q.options) for q in rubric.questions]
    net = CalibrationNet(
        layout.values, len(judges.judges), options, h1=8, h2=8, **{**PAPER_NET, "input_dropout": input_dropout}
    )
    net.standardize_inputs(train.x, train.judge)
    return net


def _alone(nets, parts, main, configs, seeds, **kw):
    """Each network trained by itself: a stack of one."""
    configs = configs if isinstance(configs, list) else [configs] * len(nets)
    return [
        train_stacked([n], [tr], [va], main, c, [s], **kw)[0] for n, (tr, va), c, s in zip(nets, parts, configs, seeds)
    ]


@pytest.mark.slow
def test_fold_models_trained_as_one_program_equal_each_trained_alone_with_input_dropout(rubric, few):
    """Three fold models (different training rows, validation sets and seeds; input dropout on, as
    configured by default) trained stacked = each trained alone: same seeds, same batches and masks."""
    layout, judges, parts = _fold_data(rubric, few)
    config, main = TrainConfig(**{**TRAINER, "accelerator": "cpu"}), rubric.ids.index(rubric.main.id)
    alone = [_net(layout, judges, rubric, k, tr, input_dropout=0.2) for k, (tr, _) in enumerate(parts)]
    alone_summaries = _alone(alone, parts, main, config, [0, 1, 2])
    stacked = [_net(layout, judges, rubric, k, tr, input_dropout=0.2) for k, (tr, _) in enumerate(parts)]
    summaries = train_stacked(stacked, [tr for tr, _ in parts], [va for _, va in parts], main, config, [0, 1, 2])
    for a, b, sa, sb, (_, val) in zip(alone, stacked, alone_summaries, summaries, parts):
        assert np.allclose(a.probabilities(val.x, val.judge), b.probabilities(val.x, val.judge), atol=1e-4)
        for phase in ("pretrain", "finetune"):
            assert sa[phase]["best_epoch"] == sb[phase]["best_epoch"]
            assert sa[phase]["val_nll"] == pytest.approx(sb[phase]["val_nll"], abs=1e-5)
        assert len(sb["finetune"]["history"]) == sb["finetune"]["epochs"]
    undropped = _net(layout, judges, rubric, 0, parts[0][0])
    train_stacked([undropped], [parts[0][0]], [parts[0][1]], main, config, [0])
    assert not np.allclose(
        undropped.layer1.weight.detach(), alone[0].layer1.weight.detach(), atol=1e-3
    )  # dropout acted


@pytest.mark.slow
def test_ensemble_members_differ_and_seeds_share_nothing(rubric, simulated):
    folds = text_folds(simulated.text_ids, 3, seed=0)
    train = simulated.subset(folds.text_id[folds.fold != 0])
    model = {"personalize": "input", "inputs": "expected", "ensemble": 2}
    fit = NetworkCalibrator(rubric, model, TRAINER, seed=3).fit(train)
    members = [fit.nets_[m].layer1.weight for m in range(2)]
    assert not np.allclose(members[0].detach(), members[1].detach())
    seeds = {s: NetworkCalibrator(rubric, {"ensemble": 5}, seed=s).seeds for s in range(10)}
    assert len({m for members in seeds.values() for m in members}) == 50  # runs with seeds 0..9: 50 distinct members
    assert seeds[0] == NetworkCalibrator(rubric, {"ensemble": 5}, seed=0).seeds  # and reproducible


@pytest.mark.slow
def test_models_with_different_sizes_and_settings_in_one_program_equal_their_own_fits(rubric, simulated):
    """Hidden sizes, inputs, input dropout, learning rate, batch size, epochs, patience, decay and delta L2 may
    differ per model (models stop at different epochs, so the stack is compacted and narrowed on the way)."""
    layout, judges, parts = _fold_data(rubric, simulated, k_folds=3)
    main = rubric.ids.index(rubric.main.id)
    sizes = [(8, 8), (12, 5), (4, 10)]
    inputs = ["probabilities", "expected", "both"]
    dropouts = [0.0, 0.2, 0.1]
    configs = [
        TrainConfig(**TRAINER),
        TrainConfig(**{**TRAINER, "lr": 0.003, "batch_size": 64, "pretrain_epochs": 0, "delta_l2": 0.0}),
        TrainConfig(
            **{**TRAINER, "lr": 0.02, "batch_size": 17, "finetune_epochs": 7, "patience": 2, "weight_decay": 0.01}
        ),
    ]

    def make(k, train):
        torch.manual_seed(k)
        net = CalibrationNet(
            layout.values,
            len(judges.judges),
            [len(q.options) for q in rubric.questions],
            *sizes[k],
            inputs=inputs[k],
            personalize="deltas",
            input_dropout=dropouts[k],
        )
        net.standardize_inputs(train.x, train.judge)
        return net

    alone = [make(k, tr) for k, (tr, _) in enumerate(parts)]
    alone_summaries = _alone(alone, parts, main, configs, [0, 1, 2])
    together = [make(k, tr) for k, (tr, _) in enumerate(parts)]
    summaries = train_stacked(together, [tr for tr, _ in parts], [va for _, va in parts], main, configs, [0, 1, 2])
    assert "pretrain" not in summaries[1] and "pretrain" not in alone_summaries[1]
    for a, b, sa, sb, (_, val) in zip(alone, together, alone_summaries, summaries, parts):
        assert b.layer1.weight.shape == a.layer1.weight.shape
        assert np.allclose(a.probabilities(val.x, val.judge), b.probabilities(val.x, val.judge), atol=1e-4)
        assert sa["finetune"]["best_epoch"] == sb["finetune"]["best_epoch"]
        assert sa["finetune"]["val_nll"] == pytest.approx(sb["finetune"]["val_nll"], abs=1e-5)


@pytest.mark.slow
def test_pruned_and_diverged_models_stop_while_the_others_train_on(rubric, few):
    layout, judges, parts = _fold_data(rubric, few, k_folds=3)
    main = rubric.ids.index(rubric.main.id)
    parts = [*parts, parts[0]]
    nets = [_net(layout, judges, rubric, k, tr) for k, (tr, _) in enumerate(parts)]
    configs = [
        TrainConfig(**{**TRAINER, "patience": 100}),
        TrainConfig(**{**TRAINER, "lr": 1e300}),
        TrainConfig(**{**TRAINER, "patience": 100}),
        TrainConfig(
            **{**TRAINER, "patience": 100, "pretrain_epochs": 3}
        ),  # pruned in the epoch that ends its pretraining
    ]
    seen = []

    def prune_after_three(phase, epoch, val_nll):
        seen.append((phase, epoch, val_nll.clone()))
        return torch.tensor([phase == "pretrain" and epoch >= 2, False, False, phase == "pretrain" and epoch == 2])

    summaries = train_stacked(
        nets, [tr for tr, _ in parts], [va for _, va in parts], main, configs, [0, 1, 2, 3], on_epoch=prune_after_three
    )
    assert summaries[0]["pretrain"]["stopped"] == "pruned" and summaries[0]["pretrain"]["epochs"] == 3
    assert summaries[3]["pretrain"]["stopped"] == "pruned" and summaries[3]["pretrain"]["epochs"] == 3
    assert summaries[1]["pretrain"]["stopped"] == "diverged"
    assert (
        "finetune" not in summaries[0]
        and "finetune" not in summaries[1]
        and "finetune" not in summaries[3]
        and "finetune" in summaries[2]
    )
    assert (
        summaries[2]["pretrain"]["stopped"] == "max_epochs"
        and summaries[2]["pretrain"]["epochs"] == TRAINER["pretrain_epochs"]
    )
    assert all(torch.isfinite(p).all() for net in nets for p in net.parameters())
    assert torch.isnan(seen[-1][2][0]) and torch.isfinite(seen[-1][2][2])


@pytest.mark.slow
def test_calibrators_of_every_kind_fitted_together_equal_their_own_fits(rubric, few):
    from llmrubric.model.families.network.calibrator import fit_together

    folds = text_folds(few.text_ids, 3, seed=0)
    train, test = few.subset(folds.text_id[folds.fold != 0]), few.subset(folds.text_id[folds.fold == 0])
    kinds = [("expected", "input"), ("probabilities", "none"), ("both", "input"), ("expected", "deltas")]
    make = lambda: [
        NetworkCalibrator(
            rubric, {"inputs": i, "personalize": p, "h1": 6 + k, "ensemble": 1, **NO_DROPOUT}, TRAINER, seed=k
        )
        for k, (i, p) in enumerate(kinds)
    ]
    judges = JudgeMap.from_annotations(few.annotations)
    alone = [fit_together([c], [train], judges)[0] for c in make()]
    together = fit_together(make(), [train] * len(kinds), judges)
    for a, b in zip(alone, together):
        pa, pb = a.predict(test), b.predict(test)
        cols = [c for c in pa.columns if c.startswith("p_")]
        assert np.allclose(pa[cols].fillna(0), pb[cols].fillna(0), atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_stacked_training_on_cuda_equals_each_model_alone_there_and_weights_come_back(rubric, simulated):
    layout, judges, parts = _fold_data(rubric, simulated)
    config, main = TrainConfig(**{**TRAINER, "accelerator": "cuda"}), rubric.ids.index(rubric.main.id)
    alone = [_net(layout, judges, rubric, k, tr, input_dropout=0.2) for k, (tr, _) in enumerate(parts)]
    _alone(alone, parts, main, config, [0, 1, 2])
    stacked = [_net(layout, judges, rubric, k, tr, input_dropout=0.2) for k, (tr, _) in enumerate(parts)]
    train_stacked(stacked, [tr for tr, _ in parts], [va for _, va in parts], main, config, [0, 1, 2])
    for a, b, (_, val) in zip(alone, stacked, parts):
        assert b.layer1.weight.device.type == "cpu"
        assert np.allclose(a.probabilities(val.x, val.judge), b.probabilities(val.x, val.judge), atol=1e-4)
    on_cpu = _net(layout, judges, rubric, 0, parts[0][0])
    on_cuda = _net(layout, judges, rubric, 0, parts[0][0])
    train_stacked([on_cpu], [parts[0][0]], [parts[0][1]], main, TrainConfig(**{**TRAINER, "accelerator": "cpu"}), [0])
    train_stacked([on_cuda], [parts[0][0]], [parts[0][1]], main, config, [0])
    val = parts[0][1]
    assert np.allclose(on_cpu.probabilities(val.x, val.judge), on_cuda.probabilities(val.x, val.judge), atol=1e-3)


@pytest.mark.slow
def test_training_on_the_cpu_without_fabric_equals_training_through_fabric(rubric, few, monkeypatch):
    """The CPU path (:class:`~llmrubric.model.core.accelerator.OnCpu`) trains the weights Lightning Fabric trains
    on the CPU, bit for bit: three models in one program, input dropout on."""
    layout, judges, parts = _fold_data(rubric, few)
    config, main = TrainConfig(**{**TRAINER, "accelerator": "cpu"}), rubric.ids.index(rubric.main.id)

    def fit():
        nets = [_net(layout, judges, rubric, k, tr, input_dropout=0.2) for k, (tr, _) in enumerate(parts)]
        return nets, train_stacked(nets, [tr for tr, _ in parts], [va for _, va in parts], main, config, [0, 1, 2])

    plain, plain_summaries = fit()
    monkeypatch.setattr(engine, "needs_fabric", lambda accelerator: True)
    fabric, fabric_summaries = fit()
    assert plain_summaries == fabric_summaries
    for a, b in zip(plain, fabric):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.equal(x, y), name
    assert needs_fabric("cpu") is False and needs_fabric("cuda") is True and needs_fabric("mps") is True
    assert needs_fabric("auto") is (torch.cuda.is_available() or torch.backends.mps.is_available())


@pytest.mark.slow
def test_a_fit_on_the_cpu_does_not_import_lightning_fabric():
    code = (
        "import sys; from support.paths import ROOT; from support.settings import FAST, SIMULATED; "
        "from llmrubric.io.rubric import Rubric; from llmrubric.io.tables import load_tables; "
        "from llmrubric.model.families.network.calibrator import NetworkCalibrator; "
        "rubric = Rubric.load(ROOT / 'conf' / 'rubric' / 'llm_rubric.yaml'); "
        "t = load_tables(*(SIMULATED / f'{n}.csv' for n in ('annotations', 'features')), rubric); "
        "NetworkCalibrator(rubric, {'ensemble': 1}, {**FAST, 'pretrain_epochs': 1, 'finetune_epochs': 1}, seed=0)"
        ".fit(t.subset(sorted(t.text_ids)[:30])); print('lightning_fabric' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
