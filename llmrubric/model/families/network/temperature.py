"""Temperature scaling (Guo et al., 2017): one temperature per question, fitted after training.

Networks trained to early stopping are over-confident on new texts (on the LLM-Rubric
synthetic CV, answer 3's forecasts spread wider than its frequencies). Each network gets,
for every question, the temperature T that minimises the NLL of that question's held-out
cells of its early-stopping split; the NLL is convex in 1/T, and T is read off a fine
log-spaced grid. A question with fewer than ``min_cells`` held-out cells keeps T = 1.
"""

from __future__ import annotations

import torch

from llmrubric.model.core.encoding import Encoded
from llmrubric.model.families.network.net import CalibrationNet

GRID = torch.logspace(-1.3, 1.3, 521)  # inverse temperatures 0.05 .. 20, 0.5 % apart
COARSE = 20  # every COARSE-th grid point first, then the fine points around the best of them


def _grid_nll(logits: torch.Tensor, y: torch.Tensor, observed: torch.Tensor, betas: torch.Tensor) -> torch.Tensor:
    """NLL (G,) of one question's held-out cells at each inverse temperature: logits (n, O), y, observed (n,)."""
    finite = torch.isfinite(logits)
    picked = logits.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1)
    scaled = torch.where(finite, logits, torch.zeros(())).unsqueeze(0) * betas[:, None, None]
    log_z = scaled.masked_fill(~finite, float("-inf")).logsumexp(dim=-1)  # (G, n)
    return ((log_z - picked * betas[:, None]) * observed).sum(dim=1)


def best_inverse_temperature(logits: torch.Tensor, y: torch.Tensor, observed: torch.Tensor) -> tuple[float, bool]:
    """The grid's NLL-minimising inverse temperature of one question, and whether the NLL is finite.

    The NLL is convex in 1/T, so the minimum over the whole grid lies within one coarse step of the
    best coarse point: a coarse pass and a fine pass around it find the grid's own argmin."""
    coarse = torch.arange(0, len(GRID), COARSE)
    if coarse[-1] != len(GRID) - 1:
        coarse = torch.cat([coarse, torch.tensor([len(GRID) - 1])])
    nll = _grid_nll(logits, y, observed, GRID[coarse])
    centre = int(coarse[nll.argmin()])
    fine = torch.arange(max(centre - COARSE, 0), min(centre + COARSE, len(GRID) - 1) + 1)
    fine_nll = _grid_nll(logits, y, observed, GRID[fine])
    return float(GRID[fine[fine_nll.argmin()]]), bool(torch.isfinite(nll).all() and torch.isfinite(fine_nll).all())


@torch.no_grad()
def fit_temperature(net: CalibrationNet, val: Encoded, min_cells: int = 20) -> list[float]:
    """Set ``net.temperature`` from the held-out rows ``val``; returns the temperatures."""
    net.eval()
    net.temperature.fill_(1.0)
    logits = net(val.x, val.judge)  # (n, Q, O), -inf where padded
    observed = val.y >= 0  # (n, Q)
    temperatures = torch.ones(logits.shape[1])
    for q in range(logits.shape[1]):
        if int(observed[:, q].sum()) < min_cells:
            continue
        beta, finite = best_inverse_temperature(logits[:, q], val.y[:, q], observed[:, q])
        if finite:
            temperatures[q] = 1.0 / beta
    net.temperature.copy_(temperatures)
    return net.temperature.tolist()
