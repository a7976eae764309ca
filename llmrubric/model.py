"""The calibration network (LLM-Rubric eq. 3–5) with shared and judge-specific weights."""

from __future__ import annotations

import torch
from torch import nn


class CalibrationNet(nn.Module):
    """``z1 = σ((W1 + W1[a])[1; x])``, ``z2 = σ((W2 + W2[a])[1; z1])``, one softmax head per question.

    Inputs are standardised with training statistics (buffers saved with the weights).
    Judge-specific deltas start at zero; judge index -1 (unseen judge) uses the shared
    weights alone. Heads are a padded tensor ``V`` of shape (questions, max options, 1 + h2);
    padded option rows get logit -inf.

    Args:
        in_dim: length of the feature vector x (blocks and presence flags).
        n_judges: number of known judges (rows of the deltas).
        option_counts: number of answer options of each question, in rubric order.
        h1, h2: hidden sizes.
        personalize: False drops the judge-specific deltas (the "no personalization" variant).
        input_dropout: dropout probability on x during training.
    """

    def __init__(
        self,
        in_dim: int,
        n_judges: int,
        option_counts: list[int],
        h1: int = 25,
        h2: int = 25,
        personalize: bool = True,
        input_dropout: float = 0.0,
    ):
        super().__init__()
        n_q, max_opt = len(option_counts), max(option_counts)
        self.personalize = personalize
        self.layer1 = nn.Linear(in_dim, h1)
        self.layer2 = nn.Linear(h1, h2)
        self.heads = nn.Linear(h2, n_q * max_opt)
        self.dropout = nn.Dropout(input_dropout)
        shape = (n_judges if personalize else 0,)
        self.delta1 = nn.Parameter(torch.zeros(*shape, h1, in_dim + 1))
        self.delta2 = nn.Parameter(torch.zeros(*shape, h2, h1 + 1))
        self.delta_heads = nn.Parameter(torch.zeros(*shape, n_q * max_opt, h2 + 1))
        self.register_buffer("input_mean", torch.zeros(in_dim))
        self.register_buffer("input_scale", torch.ones(in_dim))
        mask = torch.arange(max_opt)[None, :] < torch.tensor(option_counts)[:, None]
        self.register_buffer("option_mask", mask, persistent=False)
        self.n_q, self.max_opt = n_q, max_opt

    def standardize_inputs(self, x: torch.Tensor) -> None:
        """Set the input standardisation from training features x: (N, in_dim); constant columns keep scale 1."""
        std = x.std(dim=0)
        self.input_mean.copy_(x.mean(dim=0))
        self.input_scale.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def shared_parameters(self) -> list[nn.Parameter]:
        return [*self.layer1.parameters(), *self.layer2.parameters(), *self.heads.parameters()]

    def delta_parameters(self) -> list[nn.Parameter]:
        return [self.delta1, self.delta2, self.delta_heads]

    def _layer(self, linear: nn.Linear, delta: torch.Tensor, inp: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        out = linear(inp)
        if self.personalize and delta.shape[0]:
            known = judge >= 0
            d = delta[judge.clamp(min=0)] * known[:, None, None]
            out = out + torch.einsum("bhi,bi->bh", d[:, :, 1:], inp) + d[:, :, 0]
        return out

    def forward(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """x: (B, in_dim), judge: (B,) long → logits (B, questions, max options), -inf where padded."""
        x = self.dropout((x - self.input_mean) / self.input_scale)
        z1 = torch.sigmoid(self._layer(self.layer1, self.delta1, x, judge))
        z2 = torch.sigmoid(self._layer(self.layer2, self.delta2, z1, judge))
        logits = self._layer(self.heads, self.delta_heads, z2, judge).view(-1, self.n_q, self.max_opt)
        return logits.masked_fill(~self.option_mask, float("-inf"))

    def delta_penalty(self) -> torch.Tensor:
        """Sum of squared judge deltas (for their separate L2)."""
        return sum((d**2).sum() for d in self.delta_parameters())
