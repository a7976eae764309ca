"""The CLMM's NumPy posterior (llmrubric.model.families.mixed_mode) against the torch model it fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmrubric.model.families.mixed import _QuestionFit
from llmrubric.model.families.mixed_mode import ModeProblem, posterior_mode


def problem_and_model(options: int, scale: float, seed: int) -> tuple[ModeProblem, _QuestionFit, np.ndarray]:
    """Random data and parameters; a large ``scale`` pushes answers' probabilities onto the floors."""
    rng = np.random.default_rng(seed)
    n, dim, judges = 200, 3, 5
    problem = ModeProblem(
        rng.normal(size=(n, dim)), rng.integers(0, judges, n), rng.integers(0, options, n), options, judges
    )
    model = _QuestionFit(dim, options, judges)
    x = np.concatenate(
        [rng.normal(0, scale, dim), rng.normal(0, 1, options - 1), rng.normal(0, scale / 3, judges * options)]
    )
    model.assign(*problem.split(x))
    with torch.no_grad():
        model.variances.copy_(torch.from_numpy(rng.uniform(0.1, 1.0, options)))
        model.tau2.fill_(0.7)
    return problem, model, x


def torch_loss(problem: ModeProblem, model: _QuestionFit) -> torch.Tensor:
    logp = model.log_probs(torch.from_numpy(problem.f), torch.from_numpy(problem.judge))
    return -logp.gather(1, torch.from_numpy(problem.y)[:, None]).sum() + model.penalty()


@pytest.mark.parametrize("options,scale", [(2, 1.0), (4, 1.0), (5, 1.0), (4, 40.0)])
def test_the_numpy_loss_and_gradient_are_the_torch_models(options, scale):
    problem, model, x = problem_and_model(options, scale, seed=options)
    loss = torch_loss(problem, model)
    loss.backward()
    grad = torch.cat([model.beta.grad, model.cuts.grad, model.effects.grad.ravel()]).numpy()
    value, mine = problem.loss_and_grad(x, model.variances.numpy(), float(model.tau2))
    assert value == pytest.approx(float(loss.detach()), rel=1e-10)
    np.testing.assert_allclose(mine, grad, rtol=1e-7, atol=1e-9)
    if scale > 10:  # some answers sit on the probability floor, where the gradient is zero
        assert (model.log_probs(torch.from_numpy(problem.f), torch.from_numpy(problem.judge)) <= -27).any()


def test_the_posterior_mode_zeroes_the_torch_models_gradient():
    problem, model, x = problem_and_model(4, 1.0, seed=7)
    mode = posterior_mode(problem, np.zeros_like(x), model.variances.numpy(), float(model.tau2))
    model.assign(*problem.split(mode))
    torch_loss(problem, model).backward()
    grad = torch.cat([model.beta.grad, model.cuts.grad, model.effects.grad.ravel()])
    assert float(grad.abs().max()) < 1e-4
    assert (
        problem.loss_and_grad(mode, model.variances.numpy(), 0.7)[0]
        < problem.loss_and_grad(x, model.variances.numpy(), 0.7)[0]
    )
