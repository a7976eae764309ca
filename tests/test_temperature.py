import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from support.settings import FAST

from llmrubric.model.families.network.calibrator import NetworkCalibrator
from llmrubric.model.families.network.temperature import GRID, _grid_nll, best_inverse_temperature, fit_temperature

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("temperature")


@pytest.fixture(scope="module")
def member(rubric, simulated):
    """A fitted network (no temperature yet) with its early-stopping rows: the first member of the default
    ensemble (a member's seed does not depend on the ensemble's size), trained alone."""
    cal = NetworkCalibrator(rubric, {"ensemble": 1}, trainer={**FAST, "temperature_scaling": False}, seed=0).fit(
        simulated
    )
    _, _, vals, _ = cal._members(simulated)
    return cal, cal.nets_[0], vals[0]


def val_nll(net, val, q):
    with torch.no_grad():
        logits = net(val.x, val.judge)[:, q]
    keep = val.y[:, q] >= 0
    return float(torch.nn.functional.cross_entropy(logits[keep], val.y[keep, q]))


@pytest.mark.slow
def test_the_fitted_temperature_minimises_held_out_nll_of_each_question(member, rubric):
    _, net, val = member
    assert torch.equal(net.temperature, torch.ones(len(rubric.ids)))
    with torch.no_grad():
        net.heads.weight.mul_(3.0)  # an over-confident network
        net.heads.bias.mul_(3.0)
    q = rubric.ids.index("Q0")
    before = val_nll(net, val, q)
    temps = fit_temperature(net, val)
    keep = val.y[:, q] >= 0
    with torch.no_grad():
        net.temperature.fill_(1.0)
        logits = net(val.x, val.judge)[keep, q]
    best = minimize_scalar(
        lambda t: float(torch.nn.functional.cross_entropy(logits / t, val.y[keep, q])),
        bounds=(0.05, 20),
        method="bounded",
    )
    net.temperature.copy_(torch.tensor(temps))
    assert temps[q] > 1.5 and temps[q] == pytest.approx(best.x, rel=0.01)
    assert val_nll(net, val, q) == pytest.approx(best.fun, abs=1e-4) and val_nll(net, val, q) < before - 0.05
    with torch.no_grad():
        net.heads.weight.div_(3.0)
        net.heads.bias.div_(3.0)


@pytest.mark.slow
def test_a_question_with_too_few_held_out_cells_keeps_temperature_one(member, rubric):
    _, net, val = member
    cells = (val.y >= 0).sum(dim=0)
    temps = fit_temperature(net, val, min_cells=int(cells.min()) + 1)
    few = int(cells.argmin())
    assert temps[few] == 1.0 and any(t != 1.0 for t in temps)


@pytest.mark.slow
def test_calibrators_scale_by_default_and_the_checkpoint_keeps_the_temperatures(rubric, simulated, tmp_path):
    scaled = NetworkCalibrator(rubric, trainer=FAST, seed=0).fit(simulated)
    plain = NetworkCalibrator(rubric, trainer={**FAST, "temperature_scaling": False}, seed=0).fit(simulated)
    temps = scaled.summaries_[0]["temperature"]
    assert scaled.nets_[0].temperature.tolist() == temps and temps != [1.0] * len(temps)
    assert plain.nets_[0].temperature.tolist() == [1.0] * len(temps) and "temperature" not in plain.summaries_[0]
    q0 = rubric.ids.index("Q0")
    logits = {
        name: c.nets_[0](c.encode(simulated).x, c.encode(simulated).judge)[:, q0].detach()
        for name, c in (("s", scaled), ("p", plain))
    }
    assert torch.allclose(logits["s"] * temps[q0], logits["p"], atol=1e-5)  # same weights, only the scale differs
    loaded = NetworkCalibrator.load(scaled.save(tmp_path / "scaled.safetensors"))
    assert loaded.nets_[0].temperature.tolist() == temps
    assert np.allclose(loaded.predict(simulated)["mean"], scaled.predict(simulated)["mean"])


@pytest.mark.parametrize("spread", [0.05, 1.0, 5.0, 40.0])
def test_the_coarse_then_fine_search_finds_the_whole_grids_minimum(spread):
    gen = torch.Generator().manual_seed(int(spread * 100))
    logits = torch.randn(300, 5, generator=gen) * spread
    logits[:, 4] = float("-inf")  # a padded option
    y = torch.randint(0, 4, (300,), generator=gen)
    observed = torch.rand(300, generator=gen) > 0.2
    beta, finite = best_inverse_temperature(logits, y, observed)
    assert finite and beta == float(GRID[_grid_nll(logits, y, observed, GRID).argmin()])
