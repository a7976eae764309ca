import numpy as np
import pytest
import torch
from scipy import stats
from scipy.optimize import minimize_scalar
from support.settings import FAST

from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.model.families.network.ordinal import blend, fit_ordinal_weight, ordinal_shape

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("ordinal")

PLAIN = {**FAST, "ordinal_blend": False}


@pytest.fixture(scope="module")
def member(rubric, simulated):
    """A fitted network (temperature scaled, not blended) with its early-stopping rows: the first member of
    the default ensemble (a member's seed does not depend on the ensemble's size), trained alone."""
    cal = NetworkCalibrator(rubric, {"ensemble": 1}, trainer=PLAIN, seed=0).fit(simulated)
    _, _, vals, _ = cal._members(simulated)
    return cal.nets_[0], vals[0]


def test_the_ordinal_shape_is_the_discretised_normal_of_the_forecasts_mean_and_variance():
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.7, 0.2, 0.1, 0.0]]], dtype=torch.float64)
    shape = ordinal_shape(probs, mask)[0].numpy()
    for q, k in enumerate((4, 3)):
        p, pos = probs[0, q, :k].numpy(), np.arange(k)
        mean, sd = p @ pos, np.sqrt(p @ (pos - p @ pos) ** 2)
        edges = np.concatenate([[-np.inf], pos[:-1] + 0.5, [np.inf]])
        assert np.allclose(shape[q, :k], np.diff(stats.norm.cdf(edges, mean, sd)))
    assert shape[1, 3] == 0 and np.allclose(shape.sum(axis=-1), 1)


def test_blending_with_weight_zero_leaves_the_forecast_and_weight_one_gives_the_ordinal_shape():
    mask = torch.ones(1, 4, dtype=torch.bool)
    probs = torch.softmax(torch.randn(5, 1, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert torch.equal(blend(probs, torch.zeros(1), mask), probs)
    assert torch.allclose(blend(probs, torch.ones(1), mask), ordinal_shape(probs, mask))


@pytest.mark.slow
def test_the_fitted_weight_minimises_held_out_nll_of_each_question(member, rubric):
    net, val = member
    assert torch.equal(net.ordinal_weight, torch.zeros(len(rubric.ids)))
    q = rubric.ids.index("Q0")
    keep = val.y[:, q] >= 0
    with torch.no_grad():
        probs = torch.softmax(net(val.x, val.judge), dim=-1)[keep]
    shape = ordinal_shape(probs, net.option_mask)
    answer = val.y[keep, q][:, None]
    p, o = probs[:, q].gather(1, answer).squeeze(1).double(), shape[:, q].gather(1, answer).squeeze(1).double()
    best = minimize_scalar(lambda w: float(-torch.log((1 - w) * p + w * o).mean()), bounds=(0.0, 1.0), method="bounded")
    weights = fit_ordinal_weight(net, val)
    assert weights[q] == pytest.approx(best.x, abs=0.02)
    blended = net.probabilities(val.x, val.judge)[keep, q].gather(1, answer).squeeze(1)
    assert float(-blended.log().mean()) == pytest.approx(best.fun, abs=1e-3)
    assert float(-blended.log().mean()) <= float(-p.log().mean()) + 1e-6
    net.ordinal_weight.zero_()


def test_a_question_with_too_few_held_out_cells_keeps_weight_zero(member):
    net, val = member
    cells = (val.y >= 0).sum(dim=0)
    weights = fit_ordinal_weight(net, val, min_cells=int(cells.min()) + 1)
    assert weights[int(cells.argmin())] == 0.0
    net.ordinal_weight.zero_()


@pytest.mark.slow
def test_calibrators_blend_by_default_and_the_checkpoint_keeps_the_weights(rubric, simulated, tmp_path):
    blended = NetworkCalibrator(rubric, trainer=FAST, seed=0).fit(simulated)
    plain = NetworkCalibrator(rubric, trainer=PLAIN, seed=0).fit(simulated)
    weights = blended.summaries_[0]["ordinal_weight"]
    assert blended.nets_[0].ordinal_weight.tolist() == weights and any(w > 0 for w in weights)
    assert (
        plain.nets_[0].ordinal_weight.tolist() == [0.0] * len(weights) and "ordinal_weight" not in plain.summaries_[0]
    )
    data = blended.encode(simulated)
    members = [  # each member blended with its own weights, then averaged
        blend(net.probabilities(data.x, data.judge), torch.tensor(s["ordinal_weight"]), net.option_mask)
        for net, s in zip(plain.nets_, blended.summaries_)
    ]
    expected = torch.stack(members).mean(dim=0)
    assert np.allclose(blended.predict_proba(data), expected.numpy(), atol=1e-6)  # same weights, only the blend differs
    loaded = NetworkCalibrator.load(blended.save(tmp_path / "blended.safetensors"))
    assert loaded.nets_[0].ordinal_weight.tolist() == weights
    assert np.allclose(loaded.predict(simulated)["mean"], blended.predict(simulated)["mean"])
