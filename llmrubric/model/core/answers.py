"""A model of the LLM's answers: the distribution of an unasked feature block given the asked ones.

It works on the text columns of :mod:`llmrubric.model.core.columns` (one per ordered block: its expected
answer; one per single-option block: its probability; one per option but the last of a categorical
block). Each column is bounded (an expected answer lies between the smallest and the largest option
value, a probability in [0, 1]), so it is scaled to [0, 1], clipped to [``EPS``, 1 - ``EPS``] and
mapped by the logit; the transformed columns of all blocks (every question and LLM source) get one
joint Gaussian: the mean and spread of each column and their correlations, estimated pairwise on the
texts where both blocks are present; with few texts per column (fewer than ``SHRINK_BELOW``) they are
shrunk towards the identity by the Ledoit–Wolf intensity (:func:`sklearn.covariance.ledoit_wolf_shrinkage`
on the standardised columns, absent values at their mean; with 9 blocks and 223–300 texts shrinking
made the 80 % intervals too wide: ``benchmarks/masking.py``). For a text, the absent columns'
distribution given the present ones is the conditional Gaussian.

A drawn column goes back to a block's probabilities (what the calibration network reads) by
:meth:`AnswerModel.distributions`: an ordered block takes the training blocks' kernel-averaged
distribution at that expected answer, exponentially tilted to have exactly that expected answer,
times the block's mean training mass; a single-option block its probability; a categorical block its
columns plus the rest of the mass on the last option.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy import special, stats
from scipy.stats import qmc
from sklearn.covariance import ledoit_wolf_shrinkage

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.model.core.columns import column_blocks, text_columns
from llmrubric.model.core.encoding import FeatureLayout
from llmrubric.model.core.memo import memoised

EPS = 0.01  # columns are clipped to [EPS, 1 - EPS] of their range before the logit
TRANSFORMS = ("logit", "identity")  # of the scaled columns; identity: a Gaussian of the raw columns (for comparison)
GRID = 41  # expected-answer grid of the typical distributions of an ordered block
BANDWIDTH = 0.05  # kernel bandwidth of the typical distributions, as a fraction of the block's range
MIN_SD = 1e-3
SHRINK_BELOW = 10  # texts per column under which the correlations are shrunk (Ledoit–Wolf)


@dataclass
class AnswerModel:
    """The conditional Gaussian of the module doc; fit with :meth:`fit`, saved by :meth:`state`.

    Attributes:
        layout: the feature blocks, in the family's order.
        column_block: (C,) index in ``layout.blocks`` of each column.
        low, high: (C,) the range of each column.
        mean, cov: (C,), (C, C) of the transformed columns.
        typical: per ordered block, its typical distributions (GRID, options) on an even grid of
            expected answers from ``low`` to ``high``; empty (0, options) for other blocks.
        mass: (blocks,) mean total probability of each block in training.
        transform: one of :data:`TRANSFORMS`.
    """

    layout: FeatureLayout
    rubric: Rubric
    column_block: np.ndarray
    low: np.ndarray
    high: np.ndarray
    mean: np.ndarray
    cov: np.ndarray
    typical: list[np.ndarray]
    mass: np.ndarray
    transform: str = "logit"

    @classmethod
    def fit(
        cls, features: pd.DataFrame, layout: FeatureLayout, rubric: Rubric, transform: str = "logit"
    ) -> AnswerModel:
        """Fit on every text of ``features`` (blocks absent for some texts are fine); each model its own arrays
        (a checkpoint saves each member's)."""
        fitted = cls._fitted(features, layout, rubric, transform)
        return copy.deepcopy(fitted, {id(layout): layout, id(rubric): rubric})

    @classmethod
    @memoised
    def _fitted(cls, features: pd.DataFrame, layout: FeatureLayout, rubric: Rubric, transform: str) -> AnswerModel:
        if transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {TRANSFORMS}, not {transform!r}")
        texts = sorted(features.text_id.unique())
        blocks = column_blocks(layout, rubric)
        column_block = np.array([layout.blocks.index(b) for b in blocks], dtype=np.int64)
        expected = [_is_expected(b, rubric) for b in layout.blocks]
        low, high = _ranges(layout, expected, column_block)
        x = layout.matrix(features, texts, absent_ok=True).astype(np.float64)
        columns = text_columns(layout, rubric, features, texts, absent_ok=True)
        mean, cov = _shrunk_gaussian(_to_latent(columns, low, high, transform))
        typical, mass = _typical_distributions(layout, x, low, high, column_block, expected)
        return cls(layout, rubric, column_block, low, high, mean, cov, typical, mass, transform)

    @property
    def n_blocks(self) -> int:
        return len(self.layout.blocks)

    def columns(self, features: pd.DataFrame, text_ids: list[str]) -> np.ndarray:
        """(texts, C) the texts' columns; NaN where a block is absent."""
        return text_columns(self.layout, self.rubric, features, text_ids, absent_ok=True)

    def absent_blocks(self, columns: np.ndarray) -> np.ndarray:
        """(texts, blocks) bool: the blocks whose columns are all NaN."""
        out = np.zeros((len(columns), self.n_blocks), dtype=bool)
        for b in range(self.n_blocks):
            out[:, b] = np.isnan(columns[:, self.column_block == b]).all(axis=1)
        return out

    def _conditionals(self, columns: np.ndarray):
        """For each pattern of absent columns: (text rows, absent columns, conditional means
        (rows, absent) and covariance (absent, absent)) of the transformed columns."""
        z = _to_latent(columns, self.low, self.high, self.transform)
        missing = np.isnan(z)
        patterns, inverse = np.unique(missing, axis=0, return_inverse=True)
        for k, pattern in enumerate(patterns):
            rows, absent = np.flatnonzero(inverse.ravel() == k), np.flatnonzero(pattern)
            if not len(absent):
                continue
            seen = np.flatnonzero(~pattern)
            s_oo, s_ao = self.cov[np.ix_(seen, seen)], self.cov[np.ix_(absent, seen)]
            gain = np.linalg.solve(s_oo, s_ao.T).T if len(seen) else np.zeros((len(absent), 0))
            mu = self.mean[absent][None] + (z[np.ix_(rows, seen)] - self.mean[seen][None]) @ gain.T
            cov = self.cov[np.ix_(absent, absent)] - gain @ s_ao.T
            yield rows, absent, mu, (cov + cov.T) / 2

    def conditional(self, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd), each (texts, C), of the transformed columns given the present ones (the
        present ones: their value and sd 0)."""
        mean, sd = _to_latent(columns, self.low, self.high, self.transform), np.zeros(columns.shape)
        for rows, absent, mu, cov in self._conditionals(columns):
            mean[np.ix_(rows, absent)] = mu
            sd[np.ix_(rows, absent)] = np.sqrt(np.clip(np.diag(cov), 0.0, None))[None]
        return mean, sd

    def interval(self, columns: np.ndarray, level: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
        """(low, high), each (texts, C): the central ``level`` interval of each column given the present ones."""
        mean, sd = self.conditional(columns)
        half = stats.norm.ppf(0.5 + level / 2) * sd
        low, high = (_from_latent(mean + sign * half, self.low, self.high, self.transform) for sign in (-1, 1))
        seen = ~np.isnan(columns)
        return np.where(seen, columns, low), np.where(seen, columns, high)

    def sample(self, columns: np.ndarray, draws: int, seed: int = 0) -> np.ndarray:
        """(texts, draws, C) completions: present columns kept, absent ones drawn jointly from their
        conditional (scrambled Sobol normals: the same ``draws`` points for every text of one pattern)."""
        out = np.repeat(np.asarray(columns, dtype=np.float64)[:, None], draws, axis=1)
        for rows, absent, mu, cov in self._conditionals(columns):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # Sobol balance needs 2^m points; any number works
                u = qmc.Sobol(len(absent), scramble=True, seed=seed).random(draws)
            normal = stats.norm.ppf(np.clip(u, 1e-9, 1 - 1e-9))
            root = _cholesky(cov)
            z = mu[:, None, :] + (normal @ root.T)[None]
            out[np.ix_(rows, np.arange(draws), absent)] = _from_latent(
                z, self.low[absent], self.high[absent], self.transform
            )
        return out

    def distributions(self, block: int, values: np.ndarray) -> np.ndarray:
        """(N, options) block ``block``'s probabilities for its column ``values`` (N, width) (module doc)."""
        options = len(self.layout.blocks[block].options)
        if options == 1:
            return values[:, :1]
        if self.typical[block].shape[0] == 0:
            rest = np.clip(1.0 - values.sum(axis=1, keepdims=True), 0.0, None)
            p = np.clip(np.hstack([values, rest]), 0.0, None)
            return p / p.sum(axis=1, keepdims=True) * self.mass[block]
        column = np.flatnonzero(self.column_block == block)[0]
        lo, hi = self.low[column], self.high[column]
        target = np.clip((values[:, 0] - lo) / (hi - lo), 0.0, 1.0)
        position = target * (GRID - 1)
        left = np.clip(np.floor(position).astype(int), 0, GRID - 2)
        share = (position - left)[:, None]
        grid = self.typical[block]
        base = (1 - share) * grid[left] + share * grid[left + 1]
        option_values = np.asarray(self.layout.blocks[block].values)
        return _tilt(base, (option_values - lo) / (hi - lo), target) * self.mass[block]

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """JSON metadata and tensors for :meth:`from_state`."""
        arrays = {
            "column_block": self.column_block,
            "low": self.low,
            "high": self.high,
            "mean": self.mean,
            "cov": self.cov,
            "mass": self.mass,
        }
        arrays.update({f"typical.{b}": t for b, t in enumerate(self.typical)})
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        return {"layout": self.layout.to_dict(), "transform": self.transform, "eps": EPS}, tensors

    @classmethod
    def from_state(
        cls, meta: dict, tensors: dict[str, torch.Tensor], rubric: Rubric, source: str = "<checkpoint>"
    ) -> AnswerModel:
        layout = FeatureLayout.from_dict(meta["layout"])
        try:
            get = lambda k: tensors[k].numpy()
            self = cls(
                layout,
                rubric,
                get("column_block"),
                get("low"),
                get("high"),
                get("mean"),
                get("cov"),
                [get(f"typical.{b}") for b in range(len(layout.blocks))],
                get("mass"),
                meta.get("transform", "logit"),
            )
        except KeyError as e:
            raise InputError(f"checkpoint's answer model lacks tensor {e}", file=source) from None
        if self.cov.shape != (len(self.mean), len(self.mean)) or len(self.column_block) != len(self.mean):
            raise InputError("checkpoint's answer model tensors do not fit together", file=source)
        return self


def answers_state(answers: AnswerModel | None, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Add ``answers``'s state to a family's checkpoint ``meta`` and ``tensors`` (prefix ``answers/``)."""
    if answers is None:
        return
    answers_meta, answers_tensors = answers.state()
    meta["answers"] = answers_meta
    tensors.update({f"answers/{k}": v for k, v in answers_tensors.items()})


def answers_from_state(meta: dict, tensors: dict, rubric: Rubric, source: str = "<checkpoint>") -> AnswerModel | None:
    """The answer model of a family's checkpoint (None for one saved without it)."""
    if "answers" not in meta:
        return None
    part = {k.removeprefix("answers/"): v for k, v in tensors.items() if k.startswith("answers/")}
    return AnswerModel.from_state(meta["answers"], part, rubric, source)


def _is_expected(block, rubric: Rubric) -> bool:
    """Whether ``block``'s column is its expected answer (numeric options of an ordered or non-rubric
    question, as :func:`llmrubric.model.core.columns.block_columns` decides), not probabilities."""
    if len(block.options) < 2 or (block.question_id in rubric and not rubric[block.question_id].ordered):
        return False
    try:
        values = [float(o) for o in block.options]
    except ValueError:
        return False
    return max(values) > min(values)


def _ranges(layout: FeatureLayout, expected: list[bool], column_block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Range of each column: an expected answer spans its block's option values, a probability [0, 1]."""
    low, high = np.zeros(len(column_block)), np.ones(len(column_block))
    for c, b in enumerate(column_block):
        if expected[b]:
            values = np.asarray(layout.blocks[b].values)
            low[c], high[c] = values.min(), values.max()
    return low, high


def _to_latent(columns: np.ndarray, low: np.ndarray, high: np.ndarray, transform: str) -> np.ndarray:
    u = np.clip((np.asarray(columns, dtype=np.float64) - low) / (high - low), EPS, 1 - EPS)
    return special.logit(u) if transform == "logit" else u


def _from_latent(z: np.ndarray, low: np.ndarray, high: np.ndarray, transform: str) -> np.ndarray:
    """Inverse of :func:`_to_latent` (onto [EPS, 1 - EPS] of each range; identity: clipped to the range)."""
    return low + (high - low) * (special.expit(z) if transform == "logit" else np.clip(z, 0.0, 1.0))


def _shrunk_gaussian(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the columns ``z`` (texts, C; NaN absent): pairwise-complete correlations,
    shrunk towards the identity by the Ledoit–Wolf intensity when a column is present on fewer than
    ``SHRINK_BELOW`` texts per column, then made positive definite."""
    n_columns = z.shape[1]
    if not len(z) or not n_columns:
        return np.zeros(n_columns), np.eye(n_columns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column absent for every text: mean 0, sd 1
        mean, sd = np.nan_to_num(np.nanmean(z, axis=0)), np.nan_to_num(np.nanstd(z, axis=0), nan=1.0)
    sd = np.where(sd > MIN_SD, sd, MIN_SD)
    standard = (z - mean) / sd
    corr = pd.DataFrame(standard).corr(min_periods=3).fillna(0.0).to_numpy(copy=True)
    np.fill_diagonal(corr, 1.0)
    observed = (~np.isnan(z)).sum(axis=0).min()
    shrink = 0.0
    if observed < SHRINK_BELOW * n_columns:
        shrink = float(ledoit_wolf_shrinkage(np.nan_to_num(standard), assume_centered=True)) if len(z) > 1 else 1.0
    corr = (1 - shrink) * corr + shrink * np.eye(n_columns)
    values, vectors = np.linalg.eigh(corr)
    corr = (vectors * np.clip(values, 1e-6, None)) @ vectors.T
    return mean, corr * sd[:, None] * sd[None, :]


def _cholesky(cov: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(cov)
    return vectors * np.sqrt(np.clip(values, 0.0, None))[None]


def _typical_distributions(layout, x, low, high, column_block, expected) -> tuple[list[np.ndarray], np.ndarray]:
    """Per block: typical normalised distributions on the expected-answer grid (ordered blocks; module
    doc) and the mean total probability of the block in training."""
    typical, mass, offset = [], np.ones(len(layout.blocks)), 0
    grid = np.linspace(0.0, 1.0, GRID)
    for b, block in enumerate(layout.blocks):
        k = len(block.options)
        p = x[:, offset : offset + k]
        offset += k
        total = p.sum(axis=1)
        present = total > 0
        if present.any():
            mass[b] = float(total[present].mean())
        columns = np.flatnonzero(column_block == b)
        if not expected[b] or not present.any():
            typical.append(np.zeros((0, k)))
            continue
        lo, hi = low[columns[0]], high[columns[0]]
        dist = p[present] / total[present, None]
        position = (dist @ (np.asarray(block.values) - lo)) / (hi - lo)
        weights = np.exp(-0.5 * ((position[None, :] - grid[:, None]) / BANDWIDTH) ** 2) + 1e-12
        smooth = weights @ dist / weights.sum(axis=1, keepdims=True)
        smooth = smooth + 1e-3
        typical.append(smooth / smooth.sum(axis=1, keepdims=True))
    return typical, mass


def _tilt(base: np.ndarray, values: np.ndarray, target: np.ndarray, steps: int = 50) -> np.ndarray:
    """(N, K) ``base`` exponentially tilted, ``p ∝ base · exp(θ values)``, so that ``p @ values ==
    target`` (values and targets in [0, 1]; bisection on θ)."""
    lo, hi = np.full(len(base), -200.0), np.full(len(base), 200.0)
    log_base = np.log(base)

    def tilted(theta):
        return special.softmax(log_base + theta[:, None] * values[None], axis=1)

    for _ in range(steps):
        mid = (lo + hi) / 2
        above = tilted(mid) @ values > target
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
    return tilted((lo + hi) / 2)
