import pytest
import torch

from llmrubric.model.families.network.engine import masked_nll
from llmrubric.model.families.network.net import CalibrationNet

# the paper's network (conf/model/paper.yaml)
PAPER_NET = {"inputs": "probabilities", "personalize": "deltas", "input_dropout": 0.0}


@pytest.fixture
def net():
    torch.manual_seed(0)
    return CalibrationNet([[1, 2, 3], [0, 1]], n_judges=3, option_counts=[4, 3], h1=5, h2=4, **PAPER_NET)


def test_shapes_and_padding(net):
    logits = net(torch.rand(7, 7), torch.tensor([0, 1, 2, -1, 0, 1, 2]))
    assert logits.shape == (7, 2, 4)
    assert torch.isinf(logits[:, 1, 3]).all() and torch.isfinite(logits[:, :, :3]).all()
    probs = torch.softmax(logits, -1)
    assert torch.allclose(probs.sum(-1), torch.ones(7, 2))


def test_deltas_start_at_zero_so_judges_agree_and_unseen_uses_shared(net):
    x = torch.rand(1, 7).repeat(4, 1)
    out = net(x, torch.tensor([0, 1, 2, -1]))
    assert torch.allclose(out[0], out[3]) and torch.allclose(out[1], out[3])
    with torch.no_grad():
        net.delta_heads[1] += 1.0
    out = net(x, torch.tensor([0, 1, 2, -1]))
    assert not torch.allclose(out[1], out[3]) and torch.allclose(out[0], out[3])


def test_without_personalization_there_are_no_deltas():
    net = CalibrationNet([[1, 2, 3], [0, 1]], 3, [4], personalize=False)
    assert sum(p.numel() for p in net.delta_parameters()) == 0
    assert net(torch.rand(2, 7), torch.tensor([0, 1])).shape == (2, 1, 4)


def test_masked_nll_counts_observed_cells_only(net):
    logits = net(torch.rand(3, 7), torch.tensor([0, 1, 2]))
    y = torch.tensor([[2, -1], [-1, 1], [0, 2]])
    logp = torch.log_softmax(logits, -1)
    mean = masked_nll(logp[None], y[None], torch.tensor([True, True]))
    expected = -(logp[0, 0, 2] + logp[1, 1, 1] + logp[2, 0, 0] + logp[2, 1, 2])
    assert mean.shape == (1,) and torch.allclose(mean[0], expected / 4)
    mean = masked_nll(logp[None], y[None], torch.tensor([True, False]))
    assert torch.allclose(mean[0], -(logp[0, 0, 2] + logp[2, 0, 0]) / 2)
    summed = masked_nll(logp[None], y[None], torch.tensor([True, False]), denom=torch.ones(1))
    assert torch.allclose(summed[0], -(logp[0, 0, 2] + logp[2, 0, 0]))


def test_expected_inputs_are_block_means_and_absent_blocks_are_zero():
    net = CalibrationNet([[1, 2, 3], [0, 1]], 2, [4], inputs="expected", personalize="input")
    x = torch.tensor([[0.2, 0.2, 0.4, 0.0, 0.0, 1.0, 0.0]])
    f = net.features(x, torch.tensor([1]))
    assert torch.allclose(f, torch.tensor([[(0.2 + 0.4 + 1.2) / 0.8, 0.0, 1.0, 0.0, 0.0, 1.0]]))
    assert net.features(x, torch.tensor([-1]))[0, -2:].abs().sum() == 0


def test_judge_input_personalizes_through_the_first_layer():
    torch.manual_seed(0)
    net = CalibrationNet([[1, 2, 3], [0, 1]], 3, [4], inputs="probabilities", personalize="input")
    assert net.layer1.in_features == 5 + 2 + 3 and sum(p.numel() for p in net.delta_parameters()) == 0
    out = net(torch.rand(1, 7).repeat(3, 1), torch.tensor([0, 1, -1]))
    assert not torch.allclose(out[0], out[1])


def test_unknown_settings_are_rejected():
    with pytest.raises(ValueError, match="personalize"):
        CalibrationNet([[1, 2]], 1, [2], personalize="sometimes")
    with pytest.raises(ValueError, match="inputs"):
        CalibrationNet([[1, 2]], 1, [2], inputs="logits")


@pytest.mark.parametrize("personalize", ["deltas", "input", "none"])
def test_for_judge_predicts_what_the_network_predicts_for_that_judge(personalize):
    torch.manual_seed(0)
    net = CalibrationNet([[1, 2, 3], [0, 1]], 3, [4, 3], inputs="both", personalize=personalize, extra_dim=1)
    x, judge = torch.rand(40, 8), torch.randint(0, 3, (40,))
    net.standardize_inputs(x, judge)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
        net.temperature.copy_(torch.tensor([1.5, 0.7]))
    net.eval()
    for a in (0, 2, -1):
        plain = net.for_judge(a)
        assert plain.personalize == "none" and sum(p.numel() for p in plain.delta_parameters()) == 0
        expected = net(x, torch.full((40,), a))
        assert torch.allclose(plain(x, torch.full((40,), -1)), expected, atol=1e-5)
    if personalize != "none":
        assert not torch.allclose(net.for_judge(0)(x, judge), net.for_judge(1)(x, judge))
