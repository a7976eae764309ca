"""The calibration network (LLM-Rubric eq. 3–5) with shared and judge-specific weights."""

from __future__ import annotations

import copy

import torch
from torch import nn

from llmrubric.config import ModelConfig
from llmrubric.model.families.network.ordinal import blend

PERSONALIZATION = ("deltas", "input", "none")
INPUTS = ("probabilities", "expected", "both")


def personalization_mode(value: bool | str) -> str:
    """``True`` → ``"deltas"`` (the paper's), ``False`` → ``"none"``; strings must be one of :data:`PERSONALIZATION`."""
    if isinstance(value, bool):
        return "deltas" if value else "none"
    if value not in PERSONALIZATION:
        raise ValueError(f"personalize must be one of {PERSONALIZATION} or a bool, not {value!r}")
    return value


def expected_projection(block_values: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, columns) weights and block membership of the expected-answer features: one column
    per ordered block (its option values), one per option of a categorical block (NaN values:
    an indicator of that option), so that a column is ``probs @ weights / probs @ membership``."""
    weights, mass, offset = [], [], 0
    n_probs = sum(map(len, block_values))
    for values in block_values:
        k = len(values)
        rows = torch.arange(offset, offset + k)
        columns = [torch.tensor(values, dtype=torch.float32)] if not any(v != v for v in values) else list(torch.eye(k))
        for column in columns:
            w, m = torch.zeros(n_probs), torch.zeros(n_probs)
            w[rows], m[rows] = column, 1.0
            weights.append(w)
            mass.append(m)
        offset += k
    empty = torch.zeros(n_probs, 0)
    return (torch.stack(weights, 1), torch.stack(mass, 1)) if weights else (empty, empty.clone())


class CalibrationNet(nn.Module):
    """``z1 = σ((W1 + W1[a])[1; x])``, ``z2 = σ((W2 + W2[a])[1; z1])``, one softmax head per question.

    The raw input is ``[probabilities of each block..., presence flag of each block, extra]``; the
    network turns it into its features: the probabilities, each block's expected answer
    (normalised over the block's options; 0 for an absent block; a block of one option, e.g. a
    summary's ``covered`` fraction, gives its probability; a categorical block, whose option
    values are NaN, gives its normalised distribution), or both, then the flags and any extra
    per-pair inputs.
    Features are standardised with training statistics (buffers saved with the weights).
    Each question's logits are divided by its ``temperature`` (a buffer, 1 unless
    :func:`llmrubric.model.families.network.temperature.fit_temperature` set it after training); the probabilities
    (:meth:`probabilities`) are then blended with their ordinal shape by each
    question's ``ordinal_weight`` (0 unless :func:`llmrubric.model.families.network.ordinal.fit_ordinal_weight` set it).

    Personalization: ``"deltas"`` adds judge-specific deltas to every layer (eq. 3–5; they
    start at zero, an unseen judge, index -1, uses the shared weights alone); ``"input"``
    appends the judge's one-hot indicator to the features, i.e. a judge-specific bias of the
    first layer (all zeros for an unseen judge); ``"none"`` ignores the judge. Heads are
    a padded tensor of shape (questions, max options); padded option rows get logit -inf.

    Args:
        block_values: numeric value of each option of each feature block, in layout order; NaN
            values mark a categorical block.
        n_judges: number of known judges.
        option_counts: number of answer options of each question, in rubric order.
        h1, h2: hidden sizes (defaults: :class:`llmrubric.config.ModelConfig`, as for the other settings).
        personalize: one of :data:`PERSONALIZATION` (or a bool, see :func:`personalization_mode`).
        inputs: one of :data:`INPUTS`.
        input_dropout: dropout probability on the standardised features during training.
        extra_dim: number of further per-pair inputs after the flags, used as they are.
    """

    program = (
        "stacked"  # trained by llmrubric.model.families.network.engine.train_stacked with the other stacked networks
    )

    def __init__(
        self,
        block_values: list[list[float]],
        n_judges: int,
        option_counts: list[int],
        h1: int = ModelConfig.h1,
        h2: int = ModelConfig.h2,
        personalize: bool | str = ModelConfig.personalize,
        inputs: str = ModelConfig.inputs,
        input_dropout: float = ModelConfig.input_dropout,
        extra_dim: int = 0,
    ):
        super().__init__()
        if inputs not in INPUTS:
            raise ValueError(f"inputs must be one of {INPUTS}, not {inputs!r}")
        self.personalize, self.inputs, self.n_judges = personalization_mode(personalize), inputs, n_judges
        n_probs, n_blocks = sum(map(len, block_values)), len(block_values)
        weights, mass = expected_projection(block_values)
        self.register_buffer("expected_weights", weights, persistent=False)
        self.register_buffer("expected_mass", mass, persistent=False)
        self.register_buffer("single_option", mass.sum(dim=0) == 1, persistent=False)
        self.n_probs, self.n_blocks, self.n_expected, self.extra_dim = n_probs, n_blocks, weights.shape[1], extra_dim
        in_dim = (
            (n_probs if inputs != "expected" else 0)
            + (self.n_expected if inputs != "probabilities" else 0)
            + n_blocks
            + extra_dim
        )
        in_dim += n_judges if self.personalize == "input" else 0
        n_q, max_opt = len(option_counts), max(option_counts)
        self.layer1 = nn.Linear(in_dim, h1)
        self.layer2 = nn.Linear(h1, h2)
        self.heads = nn.Linear(h2, n_q * max_opt)
        self.dropout = nn.Dropout(input_dropout)
        shape = (n_judges if self.personalize == "deltas" else 0,)
        self.delta1 = nn.Parameter(torch.zeros(*shape, h1, in_dim + 1))
        self.delta2 = nn.Parameter(torch.zeros(*shape, h2, h1 + 1))
        self.delta_heads = nn.Parameter(torch.zeros(*shape, n_q * max_opt, h2 + 1))
        self.register_buffer("input_mean", torch.zeros(in_dim))
        self.register_buffer("input_scale", torch.ones(in_dim))
        self.register_buffer("temperature", torch.ones(len(option_counts)))
        self.register_buffer("ordinal_weight", torch.zeros(len(option_counts)))
        mask = torch.arange(max_opt)[None, :] < torch.tensor(option_counts)[:, None]
        self.register_buffer("option_mask", mask, persistent=False)
        self.n_q, self.max_opt = n_q, max_opt

    @property
    def has_deltas(self) -> bool:
        return self.personalize == "deltas"

    @property
    def feature_columns(self) -> torch.Tensor:
        """Where this network's features sit among the widest feature set of its kind: probabilities,
        expected answers, flags and extra inputs, then (unless personalized by deltas) the judge
        indicator. Networks with other ``inputs`` are trained together on that set."""
        n_rest = self.n_blocks + self.extra_dim  # presence flags and extra inputs
        parts = [torch.arange(self.n_probs)] if self.inputs != "expected" else []
        if self.inputs != "probabilities":
            parts.append(self.n_probs + torch.arange(self.n_expected))
        start = self.n_probs + self.n_expected
        parts.append(start + torch.arange(n_rest))
        if self.personalize == "input":
            parts.append(start + n_rest + torch.arange(self.n_judges))
        return torch.cat(parts)

    @property
    def n_widest_features(self) -> int:
        """Size of the widest feature set of this network's kind (see :attr:`feature_columns`)."""
        return (
            self.n_probs + self.n_expected + self.n_blocks + self.extra_dim + (0 if self.has_deltas else self.n_judges)
        )

    def features(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """Raw input x: (B, probs + flags + extra), judge: (B,) → unstandardised features (B, in_dim)."""
        probs, rest = x[:, : self.n_probs], x[:, self.n_probs :]
        parts = [probs] if self.inputs != "expected" else []
        if self.inputs != "probabilities":
            mass = probs @ self.expected_mass
            weighted = probs @ self.expected_weights
            expected = torch.where(mass > 0, weighted / mass.clamp(min=1e-12), torch.zeros_like(mass))
            parts.append(torch.where(self.single_option, mass, expected))
        parts.append(rest)
        if self.personalize == "input":
            parts.append((judge[:, None] == torch.arange(self.n_judges, device=judge.device)[None, :]).to(x.dtype))
        return torch.cat(parts, dim=1)

    def standardize_inputs(self, x: torch.Tensor, judge: torch.Tensor) -> None:
        """Set the feature standardisation from training inputs; constant features keep scale 1."""
        f = self.features(x, judge)
        std = f.std(dim=0)
        self.input_mean.copy_(f.mean(dim=0))
        self.input_scale.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def shared_parameters(self) -> list[nn.Parameter]:
        return [*self.layer1.parameters(), *self.layer2.parameters(), *self.heads.parameters()]

    def delta_parameters(self) -> list[nn.Parameter]:
        return [self.delta1, self.delta2, self.delta_heads]

    def forward(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """x: (B, probs + flags + extra), judge: (B,) long → logits (B, questions, max options), -inf where
        padded, divided by each question's temperature. Input dropout applies in training mode."""
        params = {k: v[None] for k, v in self.named_parameters()}
        f = self.dropout(self.stacked_features(self.input_mean[None], self.input_scale[None], x[None], judge[None]))
        return self.stacked_logits(params, f, judge[None])[0] / self.temperature[:, None]

    @torch.no_grad()
    def probabilities(self, x: torch.Tensor, judge: torch.Tensor, batch_size: int = 65536) -> torch.Tensor:
        """Predicted probabilities (B, questions, max options), padded options 0: the softmax, blended
        with its ordinal shape by each question's ``ordinal_weight`` (:mod:`llmrubric.model.families.network.ordinal`)."""
        self.eval()
        out = [
            blend(
                torch.softmax(self(x[i : i + batch_size], judge[i : i + batch_size]), dim=-1),
                self.ordinal_weight,
                self.option_mask,
            )
            for i in range(0, len(x), batch_size)
        ]
        return torch.cat(out) if out else torch.zeros(0, self.n_q, self.max_opt)

    def stacked_features(
        self, mean: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, judge: torch.Tensor
    ) -> torch.Tensor:
        """Standardised features of M networks of this architecture at once: mean/scale (M, in_dim),
        x (M, B, raw), judge (M, B) → (M, B, in_dim)."""
        n_models, batch = judge.shape
        f = self.features(x.reshape(n_models * batch, -1), judge.reshape(-1)).view(n_models, batch, -1)
        return (f - mean[:, None]) / scale[:, None]

    def stacked_logits(self, params: dict[str, torch.Tensor], f: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """M networks of this architecture at once: ``params`` are this net's named parameters with a
        leading model dimension (hidden sizes may be larger, zero-padded), standardised features
        f (M, B, in_dim), judge (M, B) → logits (M, B, Q, O), -inf where padded (no temperature)."""
        n_models, batch = judge.shape
        z1 = torch.sigmoid(self._layer(params, "layer1", "delta1", f, judge))
        z2 = torch.sigmoid(self._layer(params, "layer2", "delta2", z1, judge))
        logits = self._layer(params, "heads", "delta_heads", z2, judge).view(n_models, batch, self.n_q, self.max_opt)
        return logits.masked_fill(~self.option_mask, float("-inf"))

    def _layer(self, params: dict, linear: str, delta: str, inp: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """(M, B, in) → (M, B, out): the shared affine map plus the judge's delta where known.

        The deltas of all judges are applied as one batched matmul, ``[1; input]`` times every
        judge's delta, and each row then keeps its own judge's block (zero for an unseen judge).
        """
        out = torch.einsum("mbi,moi->mbo", inp, params[f"{linear}.weight"]) + params[f"{linear}.bias"][:, None]
        if self.has_deltas:
            n_models, batch, _ = inp.shape
            n_out = out.shape[-1]
            inp1 = torch.cat([torch.ones_like(inp[..., :1]), inp], dim=-1)
            weights = params[delta].permute(0, 3, 1, 2).reshape(n_models, inp1.shape[-1], -1)
            every = torch.bmm(inp1, weights).view(n_models, batch, self.n_judges, n_out)
            pick = judge.clamp(min=0)[..., None, None].expand(n_models, batch, 1, n_out)
            out = out + every.gather(2, pick).squeeze(2) * (judge >= 0)[..., None]
        return out

    @torch.no_grad()
    def for_judge(self, judge: int) -> CalibrationNet:
        """A copy without personalization that predicts what this network predicts for judge
        index ``judge`` (-1: an unseen judge): the judge's deltas are added to the shared weights,
        or its standardised indicator, times its ``layer1`` columns, to the ``layer1`` bias."""
        net = copy.deepcopy(self).eval()
        if self.has_deltas and judge >= 0:
            for linear, delta in ((net.layer1, self.delta1), (net.layer2, self.delta2), (net.heads, self.delta_heads)):
                linear.weight += delta[judge, :, 1:]
                linear.bias += delta[judge, :, 0]
        if self.personalize == "input":
            k = self.n_judges
            indicator = (torch.arange(k) == judge).to(self.input_mean.dtype)
            net.layer1.bias += self.layer1.weight[:, -k:] @ ((indicator - self.input_mean[-k:]) / self.input_scale[-k:])
            net.layer1.weight = nn.Parameter(self.layer1.weight[:, :-k].clone())
            net.layer1.in_features -= k
            net.input_mean, net.input_scale = self.input_mean[:-k].clone(), self.input_scale[:-k].clone()
        for name in ("delta1", "delta2", "delta_heads"):
            setattr(net, name, nn.Parameter(getattr(self, name)[:0].clone()))
        net.personalize = "none"
        return net

    def delta_penalty(self) -> torch.Tensor:
        """Sum of squared judge deltas (for their separate L2)."""
        return sum((d**2).sum() for d in self.delta_parameters())
