"""Ordinal blending: each question's forecast mixed with its moment-matched discretised normal.

A softmax head treats a Likert question's options as unordered categories, and on texts
unlike the training ones it can put too little mass next to its mode (on the LLM-Rubric data,
trained on synthetic dialogues and tested on real ones, answers one step away from the
prediction are the costly misses). The ordinal shape of a forecast ``p`` is the normal with
``p``'s mean and variance over the option positions 0..K-1, discretised onto them (bins
between midpoints, open at both ends), the form the ridge baseline predicts. Each network
predicts ``(1 - w) p + w ordinal(p)`` (the mean changes little), with one weight ``w`` per
question fitted on the held-out cells of its early-stopping split (after temperature
scaling), read off a grid over [0, 1]. A question with fewer than ``min_cells`` held-out
cells, or a categorical one (options not ordered), keeps w = 0.
"""

from __future__ import annotations

import torch
from torch import nn

from llmrubric.model.core.encoding import Encoded

GRID = torch.linspace(0.0, 1.0, 51)


def ordinal_shape(probs: torch.Tensor, option_mask: torch.Tensor) -> torch.Tensor:
    """probs (…, Q, O) with zeros on padded options, option_mask (Q, O) → the discretised normals
    of each forecast's mean and variance over the option positions (zeros on padded options)."""
    positions = torch.arange(probs.shape[-1], dtype=probs.dtype)
    mean = (probs * positions).sum(dim=-1, keepdim=True)
    sd = ((probs * (positions - mean) ** 2).sum(dim=-1, keepdim=True)).sqrt().clamp(min=1e-6)
    last = option_mask.sum(dim=-1, keepdim=True) - 1  # (Q, 1): the last real option
    upper = torch.where(positions < last, positions + 0.5, torch.tensor(float("inf")))
    lower = torch.where(positions > 0, positions - 0.5, torch.tensor(float("-inf")))
    mass = torch.special.ndtr((upper - mean) / sd) - torch.special.ndtr((lower - mean) / sd)
    return mass * option_mask


def blend(probs: torch.Tensor, weight: torch.Tensor, option_mask: torch.Tensor) -> torch.Tensor:
    """``(1 - w) p + w ordinal(p)`` with one weight per question, weight (Q,)."""
    if not bool((weight > 0).any()):
        return probs
    w = weight[:, None]
    return (1 - w) * probs + w * ordinal_shape(probs, option_mask)


@torch.no_grad()
def fit_ordinal_weight(
    net: nn.Module, val: Encoded, ordered: list[bool] | None = None, min_cells: int = 20
) -> list[float]:
    """Set ``net.ordinal_weight`` (a :class:`~llmrubric.model.families.network.net.CalibrationNet`'s) from the held-out rows ``val`` (only questions ``ordered``, default
    all); returns the weights."""
    net.eval()
    net.ordinal_weight.zero_()
    probs = torch.softmax(net(val.x, val.judge), dim=-1)  # (n, Q, O)
    shape = ordinal_shape(probs, net.option_mask)
    observed = val.y >= 0
    index = val.y.clamp(min=0).unsqueeze(-1)
    p, o = probs.gather(-1, index).squeeze(-1), shape.gather(-1, index).squeeze(-1)  # (n, Q)
    mixed = (1 - GRID[:, None, None]) * p + GRID[:, None, None] * o  # (G, n, Q)
    nll = -(mixed.clamp(min=1e-30).log() * observed).sum(dim=1)  # (G, Q)
    best = GRID[nll.argmin(dim=0)]
    usable = (observed.sum(dim=0) >= min_cells) & torch.isfinite(nll).all(dim=0)
    if ordered is not None:
        usable &= torch.tensor(ordered, dtype=torch.bool)
    net.ordinal_weight.copy_(torch.where(usable, best, torch.zeros(())))
    return net.ordinal_weight.tolist()
