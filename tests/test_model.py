import pytest
import torch

from llmrubric.model import CalibrationNet
from llmrubric.module import masked_nll


@pytest.fixture
def net():
    torch.manual_seed(0)
    return CalibrationNet(in_dim=6, n_judges=3, option_counts=[4, 3], h1=5, h2=4)


def test_shapes_and_padding(net):
    logits = net(torch.rand(7, 6), torch.tensor([0, 1, 2, -1, 0, 1, 2]))
    assert logits.shape == (7, 2, 4)
    assert torch.isinf(logits[:, 1, 3]).all() and torch.isfinite(logits[:, :, :3]).all()
    probs = torch.softmax(logits, -1)
    assert torch.allclose(probs.sum(-1), torch.ones(7, 2))


def test_deltas_start_at_zero_so_judges_agree_and_unseen_uses_shared(net):
    x = torch.rand(1, 6).repeat(4, 1)
    out = net(x, torch.tensor([0, 1, 2, -1]))
    assert torch.allclose(out[0], out[3]) and torch.allclose(out[1], out[3])
    with torch.no_grad():
        net.delta_heads[1] += 1.0
    out = net(x, torch.tensor([0, 1, 2, -1]))
    assert not torch.allclose(out[1], out[3]) and torch.allclose(out[0], out[3])


def test_without_personalization_there_are_no_deltas():
    net = CalibrationNet(6, 3, [4], personalize=False)
    assert sum(p.numel() for p in net.delta_parameters()) == 0
    assert net(torch.rand(2, 6), torch.tensor([0, 1])).shape == (2, 1, 4)


def test_masked_nll_counts_observed_cells_only(net):
    logits = net(torch.rand(3, 6), torch.tensor([0, 1, 2]))
    y = torch.tensor([[2, -1], [-1, 1], [0, 2]])
    total, count = masked_nll(logits, y, torch.tensor([True, True]))
    logp = torch.log_softmax(logits, -1)
    expected = -(logp[0, 0, 2] + logp[1, 1, 1] + logp[2, 0, 0] + logp[2, 1, 2])
    assert count == 4 and torch.allclose(total, expected)
    total, count = masked_nll(logits, y, torch.tensor([True, False]))
    assert count == 2 and torch.allclose(total, -(logp[0, 0, 2] + logp[2, 0, 0]))
