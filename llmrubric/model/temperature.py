"""Temperature scaling (Guo et al., 2017): one temperature per question, fitted after training.

Networks trained to early stopping are over-confident on new texts (on the LLM-Rubric
synthetic CV, answer 3's forecasts spread wider than its frequencies). Each network gets,
for every question, the temperature T that minimises the NLL of that question's held-out
cells of its early-stopping split; the NLL is convex in 1/T, and T is read off a fine
log-spaced grid. A question with fewer than ``min_cells`` held-out cells keeps T = 1.
"""

from __future__ import annotations

import torch

from llmrubric.model.encoding import Encoded
from llmrubric.model.network import CalibrationNet

GRID = torch.logspace(-1.3, 1.3, 521)  # inverse temperatures 0.05 .. 20, 0.5 % apart


@torch.no_grad()
def fit_temperature(net: CalibrationNet, val: Encoded, min_cells: int = 20) -> list[float]:
    """Set ``net.temperature`` from the held-out rows ``val``; returns the temperatures."""
    net.eval()
    net.temperature.fill_(1.0)
    logits = net(val.x, val.judge)  # (n, Q, O), -inf where padded
    observed = val.y >= 0  # (n, Q)
    finite = torch.isfinite(logits)
    picked = logits.gather(-1, val.y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    scaled = torch.where(finite, logits, torch.zeros(())).unsqueeze(0) * GRID[:, None, None, None]
    log_z = scaled.masked_fill(~finite, float("-inf")).logsumexp(dim=-1)  # (G, n, Q)
    nll = ((log_z - picked * GRID[:, None, None]) * observed).sum(dim=1)  # (G, Q)
    best = GRID[nll.argmin(dim=0)]
    usable = (observed.sum(dim=0) >= min_cells) & torch.isfinite(nll).all(dim=0)
    net.temperature.copy_(torch.where(usable, 1.0 / best, torch.ones(())))
    return net.temperature.tolist()
