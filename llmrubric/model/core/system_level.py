"""A system level with honest uncertainty on top of any text-level model (issues 32, 41; docs/models.md).

A text model fitted on texts pooled over systems learns the within-system relation between LLM
answers and human labels, which is flatter than the between-system one, so the means of a new
system are pulled toward the training mean. The level ``μ_s`` of system ``s`` (the mean human
answer of the main question over its pairs) gets its own hierarchical model::

    ȳ_s ~ N(μ_s, v_s)                    v_s: the sampling variance of the system's labelled mean
    μ_s ~ N(a + b·(x_s − x̄), τ²)         x_s: the system's summary (:class:`LevelPrior`)
    a ~ N(mid-scale, range²),  b ~ N(0, slope_sd²),  τ ~ HalfNormal(tau_scale · range)

Nothing is a point estimate: given ``τ`` the coefficients' posterior is conjugate normal, and ``τ``
is integrated over a 1-D grid of equal prior mass weighted by the marginal likelihood. A new
system's level is the mixture over ``τ`` of normals ``N(d·m_τ, τ² + d·Σ_τ·d)`` (``d = (1, x − x̄)``):
wider the further its summary lies from the training systems' and the fewer they are, with heavier
tails than a normal; it is carried as a Student t of the same mean, variance and kurtosis. The line
nests the constant (``b = 0``); the slope's posterior, not a vote, says how far to trust it. A training
system's level is the same mixture updated by its own labels. The text model supplies the within-system
part: the target mean of pair ``t`` of system ``s`` is ``m_t − c_s + μ_s``, with ``m_t`` the model's
expected answer and ``c_s`` its mean over the system's pairs (the training pairs for a training
system). Each pair's distribution is exponentially tilted (``p_k ∝ p_k e^{λ v_k}``, ``λ`` by a 1-D
root find) to that target: the support and the ordering within the system stay, and the average over
equal-weight nodes of the level's t widens it by the level's uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy import special, stats

from llmrubric.io.errors import InputError, NotApplicableError
from llmrubric.io.rubric import Question, Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.columns import text_columns
from llmrubric.model.core.encoding import FeatureLayout, question_targets
from llmrubric.model.core.memo import memoised

MIN_SYSTEMS = 3  # labelled training systems for model.auto to compare a level, at the least
MIN_FIT_SYSTEMS = 2  # systems a level is fitted on (an inner fold of 3 training systems has 2)
NODES = 12  # equal-weight nodes of the level's Student t
MAX_DF = 1000.0
END_MARGIN = 0.05  # a level's mean stays this share of the range inside the scale's ends
SUMMARIES = ("auto", "llm", "model")


@memoised
def text_system_ids(tables: Tables, pairs: pd.DataFrame | None = None) -> pd.Series:
    """text id → system id from ``pairs`` (a ``system_id`` column), the texts table or the annotations;
    empty when none has one."""
    for source in (pairs, tables.texts, tables.annotations):
        if source is not None and "system_id" in source and source.system_id.notna().any():
            rows = source.dropna(subset=["system_id"]).drop_duplicates("text_id")
            return pd.Series(rows.system_id.astype(str).to_numpy(), index=rows.text_id.astype(str).to_numpy())
    return pd.Series(dtype=object)


@memoised
def source_means(tables: Tables, rubric: Rubric, texts: list[str]) -> np.ndarray:
    """(texts,) mean over the LLM sources that answered of the main question's expected answer (NaN: none)."""
    features = tables.features[tables.features.question_id.astype(str) == rubric.main.id]
    if features.empty or not len(texts):
        return np.full(len(texts), np.nan)
    features = features[features.text_id.astype(str).isin(set(texts))]
    layout = FeatureLayout.from_features(tables.features[tables.features.question_id == rubric.main.id], rubric)
    columns = text_columns(layout, rubric, features if len(features) else tables.features, texts)
    present = ~np.isnan(columns)
    total = np.where(present, columns, 0.0).sum(axis=1)
    return np.divide(total, present.sum(axis=1), out=np.full(len(texts), np.nan), where=present.any(axis=1))


def system_summaries(tables: Tables, rubric: Rubric, systems: pd.Series) -> pd.Series:
    """system → ``x_s``, the mean over its texts (those of ``systems``: text → system) of :func:`source_means`."""
    texts = list(systems.index)
    x = pd.Series(source_means(tables, rubric, texts), index=texts)
    return x.groupby(systems.to_numpy()).mean()


def tilt(probs: np.ndarray, values: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(n, K): each row of ``probs`` exponentially tilted, ``p_k e^{λ v_k}`` normalised, so that its
    mean is ``targets`` (clipped into the row's support); ``λ`` by Newton steps kept inside a
    bisection bracket (the mean rises with ``λ``, its derivative is the tilted variance)."""
    logp = np.log(np.clip(np.asarray(probs, dtype=np.float64), 1e-300, None))
    support = probs > 0
    low = np.where(support, values, np.inf).min(axis=1)
    high = np.where(support, values, -np.inf).max(axis=1)
    margin = 1e-4 * (values.max() - values.min())
    target = np.clip(targets, low + margin, np.maximum(high - margin, low + margin))
    bound = 60.0 / max(float(values.max() - values.min()), 1e-9)
    lo, hi, lam = np.full(len(probs), -bound), np.full(len(probs), bound), np.zeros(len(probs))
    for _ in range(100):
        z = logp + lam[:, None] * values
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        mean = p @ values
        gap = mean - target
        if np.all(np.abs(gap) < 1e-8):
            break
        hi, lo = np.where(gap > 0, lam, hi), np.where(gap > 0, lo, lam)
        step = lam - gap / np.maximum(p @ values**2 - mean**2, 1e-12)
        lam = np.where((step > lo) & (step < hi), step, (lo + hi) / 2)
    return np.where(support, special.softmax(logp + lam[:, None] * values, axis=1), 0.0)


def _keep_system_means(targets: np.ndarray, support: np.ndarray, values: np.ndarray, system: np.ndarray):
    """``targets`` (pairs, nodes) of new systems' pairs shifted by one constant per (system, node) so
    that, once each is clipped into its pair's support (as :func:`tilt` does), their mean over the
    system's pairs is still the unclipped mean (the level), as far as the scale allows."""
    margin = 1e-4 * (values.max() - values.min())
    low = np.where(support, values, np.inf).min(axis=1)[:, None] + margin
    high = np.where(support, values, -np.inf).max(axis=1)[:, None] - margin
    codes, group = np.unique(system, return_inverse=True)
    count = np.bincount(group, minlength=len(codes))[:, None]

    def means(x):
        return np.stack([np.bincount(group, x[:, j], len(codes)) for j in range(x.shape[1])], axis=1) / count

    goal = np.clip(
        means(targets), means(np.broadcast_to(low, targets.shape)), means(np.broadcast_to(high, targets.shape))
    )
    span = float(values.max() - values.min()) + 1.0
    lo, hi = np.full(goal.shape, -span), np.full(goal.shape, span)
    for _ in range(50):
        mid = (lo + hi) / 2
        above = means(np.clip(targets + mid[group], low, high)) > goal
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
    return targets + ((lo + hi) / 2)[group]


@dataclass(frozen=True)
class LevelPrior:
    """The level's priors and summary (``model.auto.level_*``; docs/models.md, "The system level").

    Attributes:
        summary: what ``x_s`` is: ``llm`` (the sources' mean expected answer of the main question),
            ``model`` (the text model's mean expected answer over the system's pairs: every rubric has
            it) or ``auto`` (``llm`` where every labelled training system has it, else ``model``).
        slope_sd: the slope's prior ``b ~ N(0, slope_sd²)`` (``x`` and the level share the answer scale).
        beyond_sd: outside the training systems' range of ``x`` the slope may change by ``N(0, beyond_sd²)``
            (hinge terms at the range's ends that no training system informs: a new system ``δ`` beyond
            the range gets ``beyond_sd² δ²`` more variance, its mean unchanged).
        tau_scale: ``τ ~ HalfNormal(tau_scale · range)``, ``range`` the main question's value range.
        grid: points of the 1-D quadrature over ``τ`` (equal prior mass each).
    """

    summary: str = "auto"
    slope_sd: float = 5.0
    tau_scale: float = 0.25
    beyond_sd: float = 2.0
    grid: int = 64

    @classmethod
    def from_settings(cls, settings) -> LevelPrior:
        """From :class:`llmrubric.config.AutoConfig` (its ``level_*`` fields), checked."""
        prior = cls(
            settings.level_summary,
            float(settings.level_slope_sd),
            float(settings.level_tau_scale),
            float(settings.level_beyond_sd),
        )
        if prior.summary not in SUMMARIES:
            raise InputError(f"{prior.summary!r} is not one of {list(SUMMARIES)}", setting="model.auto.level_summary")
        for name in ("slope_sd", "tau_scale", "beyond_sd"):
            if not getattr(prior, name) >= (0 if name == "beyond_sd" else 1e-12):
                raise InputError(f"must be > 0, got {getattr(prior, name)}", setting=f"model.auto.level_{name}")
        return prior


def mixture_moments(means: np.ndarray, variances: np.ndarray, weights: np.ndarray):
    """(mean, variance, degrees of freedom) of mixtures of normals (rows: mixtures, columns: components
    with ``weights``); the degrees of freedom ``ν`` give a Student t of the same excess kurtosis
    ``6 / (ν − 4)`` (the mixture over ``τ`` has heavier tails than any one normal)."""
    mean = means @ weights
    d = means - mean[:, None]
    var = (variances + d**2) @ weights
    fourth = (3 * variances**2 + 6 * variances * d**2 + d**4) @ weights
    excess = fourth / np.maximum(var, 1e-300) ** 2 - 3.0
    df = np.where(excess > 6.0 / (MAX_DF - 4.0), 4.0 + 6.0 / np.maximum(excess, 1e-12), MAX_DF)
    return mean, var, np.minimum(df, MAX_DF)


def level_nodes(mean: np.ndarray, var: np.ndarray, df: np.ndarray, nodes: int = NODES) -> np.ndarray:
    """(systems, nodes) equal-weight points of each level's Student t (quantiles at ``(i − ½)/n``,
    rescaled so that their variance is the level's)."""
    u = (np.arange(nodes) + 0.5) / nodes
    q = stats.t.ppf(u[None, :], np.asarray(df, float)[:, None])
    q = q / np.sqrt(np.mean(q**2, axis=1, keepdims=True))
    return np.asarray(mean, float)[:, None] + np.sqrt(np.asarray(var, float))[:, None] * q


def t_interval(mean, var, df, coverage: float) -> tuple[np.ndarray, np.ndarray]:
    """The central ``coverage`` interval of levels with ``mean``, ``var`` and ``df`` (a Student t)."""
    df = np.asarray(df, float)
    scale = np.sqrt(np.asarray(var, float) * (df - 2.0) / df)
    half = stats.t.ppf(0.5 + coverage / 2, df) * scale
    return np.asarray(mean, float) - half, np.asarray(mean, float) + half


class SystemLevel:
    """The system level (module doc) of the main question over one text model's predictions.

    ``fit(tables, expected)``: ``expected`` holds the text model's in-sample expected answers of the
    main question's annotated pairs (:func:`llmrubric.model.core.encoding.question_targets` order).
    ``apply(tables, pairs, probs)`` returns the main question's distributions with the level.
    """

    def __init__(self, rubric: Rubric, prior: LevelPrior | None = None, min_systems: int = MIN_FIT_SYSTEMS):
        self.rubric, self.prior_settings, self.min_systems = rubric, prior or LevelPrior(), min_systems
        self.question: Question = rubric.main
        if not self.question.ordered:
            raise InputError(
                f"a system level needs an ordered main question; {self.question.id} is categorical",
                setting="model.auto.system_level",
            )
        self.values = np.asarray(self.question.values, dtype=float)
        self.range = float(np.ptp(self.values)) or 1.0

    def fit(self, tables: Tables, expected: np.ndarray) -> SystemLevel:
        pairs, index = question_targets(tables, self.question)
        keep = index >= 0
        systems = text_system_ids(tables)
        frame = pd.DataFrame(
            {
                "system": pairs.text_id.astype(str).map(systems).to_numpy(),
                "text": pairs.text_id.astype(str).to_numpy(),
                "y": self.values[np.maximum(index, 0)],
                "m": expected,
            }
        )[keep & pairs.text_id.astype(str).isin(systems.index).to_numpy()]
        per_system = self._system_table(frame, tables)
        self.summary_ = self._summary(per_system)
        per_system["x"] = per_system.c if self.summary_ == "model" else per_system.x_llm
        usable = per_system.dropna(subset=["x"])
        self.without_summary_ = sorted(map(str, per_system.index[per_system.x.isna()]))
        if len(usable) < self.min_systems:
            raise NotApplicableError(
                f"a system level needs at least {self.min_systems} training systems with labels and a summary, "
                f"found {len(usable)}",
                setting="model.auto.system_level",
            )
        x = usable.x.to_numpy(float)
        self.form_ = "line" if np.ptp(x) > 1e-9 * self.range else "constant"
        self.x_centre_, self.x_range_ = float(np.mean(x)), (float(x.min()), float(x.max()))
        self.train_x_ = x
        y, v = usable.y.to_numpy(float), usable.v.to_numpy(float)
        self.tau_, self.weight_, self.means_, self.covs_ = self._posterior_grid(y, v, self._design(x))
        known = self._known(per_system.y.to_numpy(float), per_system.v.to_numpy(float), per_system.x.to_numpy(float))
        self.known_ = pd.DataFrame(
            {"mean": known[0], "var": known[1], "df": known[2], "centre": per_system.c.to_numpy(float)},
            index=per_system.index.astype(str),
        )
        residual = frame.y - frame.m - frame.system.map(per_system.y - per_system.c)
        self.sigma_within_ = float(np.sqrt(np.mean(residual**2))) if len(residual) else 0.0
        self.systems_ = len(usable)
        return self

    def _summary(self, per_system: pd.DataFrame) -> str:
        """``llm`` or ``model`` (:class:`LevelPrior`); ``llm`` asked for without LLM answers of the main question is an error."""
        asked, present = self.prior_settings.summary, per_system.x_llm.notna()
        if asked == "llm" and not present.any():
            raise InputError(
                f"the main question {self.question.id} has no LLM answers to summarise systems by; "
                "use model.auto.level_summary=model or auto",
                setting="model.auto.level_summary",
            )
        if asked == "auto":
            return "llm" if present.all() else "model"
        return asked

    def _system_table(self, frame: pd.DataFrame, tables: Tables) -> pd.DataFrame:
        """Per training system: human mean ``y``, its sampling variance ``v`` (texts as clusters),
        the model's mean ``c`` and the LLM summary ``x_llm`` (NaN: no LLM answer of the main question)."""
        by_text = frame.groupby(["system", "text"]).y.mean()
        texts = by_text.groupby(level=0)
        pooled = float(np.nanmean(texts.var(ddof=1))) if len(by_text) else 0.0
        counts = texts.size()
        v = texts.var(ddof=1).fillna(pooled).clip(lower=max(pooled, 1e-6) * 0.05) / counts
        systems = text_system_ids(tables)
        x = system_summaries(tables, self.rubric, systems[systems.isin(frame.system.unique())])
        table = pd.DataFrame({"y": frame.groupby("system").y.mean(), "c": frame.groupby("system").m.mean(), "v": v})
        return table.assign(x_llm=x.reindex(table.index))

    def _design(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float) - self.x_centre_
        return np.stack([np.ones_like(x), x], axis=1) if self.form_ == "line" else np.ones((len(x), 1))

    def _coefficient_prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and precision of the coefficients' normal prior: the intercept (at the training systems'
        mean summary) ``N(mid-scale, range²)``, the slope ``N(0, slope_sd²)``."""
        mid = float(self.values.min() + self.values.max()) / 2
        mean, sd = np.array([mid, 0.0]), np.array([self.range, self.prior_settings.slope_sd])
        p = 2 if self.form_ == "line" else 1
        return mean[:p], np.diag(1.0 / sd[:p] ** 2)

    def _posterior_grid(self, y: np.ndarray, v: np.ndarray, design: np.ndarray):
        """``τ`` grid (equal prior mass under its half-normal), the posterior weight of each point and
        the conjugate normal posterior of the coefficients given each ``τ``."""
        g = self.prior_settings.grid
        tau = self.prior_settings.tau_scale * self.range * stats.halfnorm.ppf((np.arange(g) + 0.5) / g)
        m0, p0 = self._coefficient_prior()
        prior_cov = np.linalg.inv(p0)
        logw, means, covs = np.empty(g), np.empty((g, len(m0))), np.empty((g, len(m0), len(m0)))
        for j, t in enumerate(tau):
            w = 1.0 / (t**2 + v)
            cov = np.linalg.inv(design.T @ (design * w[:, None]) + p0)
            means[j], covs[j] = cov @ (design.T @ (w * y) + p0 @ m0), cov
            marginal = design @ prior_cov @ design.T + np.diag(t**2 + v)
            r = y - design @ m0
            sign, logdet = np.linalg.slogdet(marginal)
            logw[j] = -0.5 * (logdet + r @ np.linalg.solve(marginal, r))
        weight = np.exp(logw - logw.max())
        return tau, weight / weight.sum(), means, covs

    def _components(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(systems, grid) means and variances of the level of new systems with summaries ``x`` given each
        ``τ``; a NaN ``x`` (no summary) pools the predictives at every training system's summary."""
        x = np.asarray(x, dtype=float)
        filled = np.where(np.isnan(x), self.x_centre_, x)
        d = self._design(filled)
        mean = d @ self.means_.T
        var = self.tau_[None, :] ** 2 + np.einsum("ip,gpq,iq->ig", d, self.covs_, d)
        beyond = np.maximum(np.maximum(filled - self.x_range_[1], self.x_range_[0] - filled), 0.0)
        var = var + (self.prior_settings.beyond_sd * beyond)[:, None] ** 2
        if np.isnan(x).any():
            dt = self._design(self.train_x_)
            m_t = dt @ self.means_.T  # (train, grid)
            v_t = self.tau_[None, :] ** 2 + np.einsum("ip,gpq,iq->ig", dt, self.covs_, dt)
            pooled_mean = m_t.mean(axis=0)
            pooled_var = (v_t + m_t**2).mean(axis=0) - pooled_mean**2
            mean[np.isnan(x)], var[np.isnan(x)] = pooled_mean, pooled_var
        return mean, var

    def predictive(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, variance, degrees of freedom) of the level of new systems with summaries ``x``: the
        mixture over ``τ`` of the conjugate predictives (wider away from the training systems' summaries)."""
        mean, var = self._components(x)
        return mixture_moments(mean, var, self.weight_)

    def prior(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of the level of new systems with summaries ``x`` (:meth:`predictive`)."""
        mean, var, _ = self.predictive(x)
        return mean, var

    def _known(self, y: np.ndarray, v: np.ndarray, x: np.ndarray):
        """(mean, variance, df) of training systems' levels given all the labels: per ``τ``, the normal
        update of the prior by the system's own mean, the coefficients' uncertainty carried through."""
        mean, var = self._components(x)
        precision = 1.0 / var + 1.0 / v[:, None]
        shrink = (1.0 / var) / precision
        post_mean = shrink * mean + (1.0 / v[:, None]) / precision * y[:, None]
        post_var = 1.0 / precision
        return mixture_moments(post_mean, post_var, self.weight_)

    def posterior(self, prior_mean, prior_var, label_mean, label_var) -> tuple[np.ndarray, np.ndarray]:
        """Normal–normal update of the level with an estimate ``label_mean`` of variance ``label_var``
        (NaN or inf: no labels)."""
        prior_var = np.maximum(np.asarray(prior_var, float), 1e-12)
        label_var = np.where(np.isfinite(label_var), label_var, np.inf)
        label_mean = np.where(np.isfinite(label_var), label_mean, 0.0)
        precision = 1.0 / prior_var + 1.0 / label_var
        return (prior_mean / prior_var + label_mean / label_var) / precision, 1.0 / precision

    def levels(self, tables: Tables, pairs: pd.DataFrame, expected: np.ndarray) -> pd.DataFrame:
        """Per system of ``pairs``: the level's ``mean``, ``var`` and ``df`` (a Student t), the
        ``centre`` its pairs are centred on, its summary ``x`` and whether it is ``known`` (a training
        system) or gets the prior."""
        systems = text_system_ids(tables, pairs)
        system = pairs.text_id.astype(str).map(systems)
        if system.isna().any():
            raise InputError(
                f"text {pairs.text_id[system.isna()].iloc[0]!r} has no system_id: a model with a system level "
                "scores texts of known systems (give system_id in the texts table)",
                column="system_id",
            )
        names = sorted(system.unique())
        centre = pd.Series(expected).groupby(system.to_numpy()).mean().reindex(names)
        if self.summary_ == "model":
            x = centre
        else:
            x = system_summaries(tables, self.rubric, system.groupby(pairs.text_id.astype(str).to_numpy()).first())
            x = x.reindex(names)
        mean, var, df = self.predictive(x.to_numpy(float))
        out = pd.DataFrame({"mean": mean, "var": var, "df": df, "centre": centre.to_numpy()}, index=names)
        out["known"] = out.index.isin(self.known_.index)
        columns = ["mean", "var", "df", "centre"]
        out.loc[out.known, columns] = self.known_.loc[out.index[out.known], columns].to_numpy()
        out["x"] = x.to_numpy()
        lo, hi = self.x_range_
        out["beyond"] = ~out.known & np.isfinite(out.x) & ((out.x < lo) | (out.x > hi))
        return out

    def apply(self, tables: Tables, pairs: pd.DataFrame, probs: np.ndarray, fixed=None) -> np.ndarray:
        """(pairs, options) main-question distributions with the level: each pair tilted to
        ``m_t − c_s + μ`` and averaged over equal-weight nodes of ``μ``'s Student t. ``fixed``:
        :meth:`levels` computed over all the texts of the systems (when ``pairs`` are a chunk of them)."""
        k = len(self.values)
        expected = probs[:, :k] @ self.values
        table = self.levels(tables, pairs, expected) if fixed is None else fixed
        system = pairs.text_id.astype(str).map(text_system_ids(tables, pairs)).to_numpy()
        row = table.reindex(system)
        df = row["df"].to_numpy(float) if "df" in row else np.full(len(row), MAX_DF)
        level = self._on_scale(
            level_nodes(
                np.nan_to_num(row["mean"].to_numpy(float)),
                np.nan_to_num(row["var"].to_numpy(float)),
                np.nan_to_num(df, nan=MAX_DF),
            )
        )
        targets = (expected - row.centre.to_numpy(float))[:, None] + level  # (pairs, nodes)
        new = ~row.known.to_numpy(bool) & np.isfinite(row["mean"].to_numpy(float))
        if new.any():
            targets[new] = _keep_system_means(targets[new], probs[new, :k] > 0, self.values, system[new])
        tilted = tilt(np.repeat(probs[:, :k], NODES, axis=0), self.values, targets.reshape(-1))
        out = tilted.reshape(len(pairs), NODES, k).mean(axis=1)
        unknown = ~np.isfinite(row["mean"].to_numpy(float))  # a system no summary reaches: the text model alone
        out[unknown] = probs[unknown, :k]
        return out

    def _on_scale(self, nodes: np.ndarray) -> np.ndarray:
        """(rows, nodes) level nodes moved within the scale (a system's mean answer lies on it) by one
        shift per row that keeps their mean, the level's: a wide level near an end of the scale keeps its
        mean and loses spread, instead of its mean being pulled inward by clipping. A mean within
        :data:`END_MARGIN` of the range of an end (a line extrapolated off the scale) is held there, so
        the nodes keep some spread."""
        margin = 1e-4 * self.range
        low, high = self.values.min() + margin, self.values.max() - margin
        end = END_MARGIN * self.range
        goal = np.clip(nodes.mean(axis=1), self.values.min() + end, self.values.max() - end)
        lo, hi = np.full(len(nodes), -self.range - 1.0), np.full(len(nodes), self.range + 1.0)
        for _ in range(60):
            mid = (lo + hi) / 2
            above = np.clip(nodes + mid[:, None], low, high).mean(axis=1) > goal
            hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
        return np.clip(nodes + ((lo + hi) / 2)[:, None], low, high)

    def record(self) -> dict:
        """JSON summary: the summary used, the form, the slope's and ``τ``'s posteriors, the systems."""
        slope = (
            {
                "mean": float(self.weight_ @ self.means_[:, 1]),
                "sd": float(
                    np.sqrt(
                        self.weight_ @ (self.covs_[:, 1, 1] + self.means_[:, 1] ** 2)
                        - (self.weight_ @ self.means_[:, 1]) ** 2
                    )
                ),
            }
            if self.form_ != "constant"
            else None
        )
        order = np.argsort(self.tau_)
        cdf = np.cumsum(self.weight_[order])
        quantile = lambda q: float(self.tau_[order][min(np.searchsorted(cdf, q), len(cdf) - 1)])  # noqa: E731
        return {
            "summary": self.summary_,
            "form": self.form_,
            "intercept": float(self.weight_ @ self.means_[:, 0]),
            "x_centre": self.x_centre_,
            "x_range": list(self.x_range_),
            "slope": slope,
            "tau": {"mean": float(self.weight_ @ self.tau_), "q10": quantile(0.1), "q90": quantile(0.9)},
            "sigma_within": self.sigma_within_,
            "systems": self.systems_,
            "systems_without_summary": self.without_summary_,
            "prior": {k: v for k, v in vars(self.prior_settings).items() if k != "summary"},
        }

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        meta = {**self.record(), "known": list(self.known_.index)}
        tensors = {
            "tau": torch.from_numpy(np.array(self.tau_, dtype=np.float64)),
            "weight": torch.from_numpy(np.array(self.weight_, dtype=np.float64)),
            "means": torch.from_numpy(np.array(self.means_, dtype=np.float64)),
            "covs": torch.from_numpy(np.array(self.covs_, dtype=np.float64)),
            "train_x": torch.from_numpy(np.array(self.train_x_, dtype=np.float64)),
            "known": torch.from_numpy(self.known_[["mean", "var", "df", "centre"]].to_numpy(np.float64).copy()),
        }
        return meta, tensors

    @classmethod
    def from_state(cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor]) -> SystemLevel:
        if "tau" not in tensors:
            raise ValueError("a system level saved before its Bayesian form (issue 41): retrain the model")
        self = cls(rubric, LevelPrior(meta["summary"], **meta["prior"]))
        self.summary_, self.form_, self.systems_ = meta["summary"], meta["form"], int(meta["systems"])
        self.sigma_within_, self.x_centre_ = float(meta["sigma_within"]), float(meta["x_centre"])
        self.x_range_ = tuple(float(v) for v in meta["x_range"])
        self.without_summary_ = list(meta.get("systems_without_summary", []))
        self.tau_, self.weight_ = tensors["tau"].numpy(), tensors["weight"].numpy()
        self.means_, self.covs_, self.train_x_ = (
            tensors["means"].numpy(),
            tensors["covs"].numpy(),
            tensors["train_x"].numpy(),
        )
        self.known_ = pd.DataFrame(
            tensors["known"].numpy().reshape(-1, 4), index=list(meta["known"]), columns=["mean", "var", "df", "centre"]
        )
        return self


def level_table(level: SystemLevel, table: pd.DataFrame, applied: np.ndarray) -> pd.DataFrame:
    """Per system of ``table`` (:meth:`SystemLevel.levels`) the main question's level as scoring reports it:
    ``level``, ``level_sd``, ``level_df``, ``known``, ``applied`` (whether the predictions use it), ``x``,
    ``beyond`` (a new system whose summary lies outside the training systems' range), ``centre``, ``sigma_within``."""
    return pd.DataFrame(
        {
            "system_id": table.index,
            "level": table["mean"].to_numpy(),
            "level_sd": np.sqrt(table["var"].to_numpy()),
            "level_df": table["df"].to_numpy(),
            "known": table.known.to_numpy(),
            "applied": applied,
            "x": table.x.to_numpy(),
            "beyond": table.beyond.to_numpy(bool),
            "centre": table.centre.to_numpy(),
            "sigma_within": level.sigma_within_,
        }
    )


@dataclass(frozen=True)
class Part:
    """One thing ``model=auto`` combines: the candidate ``member`` alone (``where`` None) or wrapped in its system
    level (:class:`llmrubric.model.families.levelled.Levelled`: ``where`` ``all`` or ``beyond``). Its
    :attr:`label` names it in the records and weights (``network``, ``network-level``, ``network-beyond``);
    code reads ``member`` and ``where``, never the label."""

    member: str
    where: str | None = None

    @property
    def label(self) -> str:
        return self.member if self.where is None else f"{self.member}-{LABELS[self.where]}"

    def to_list(self) -> list:
        return [self.member, self.where]


LABELS = {"all": "level", "beyond": "beyond"}  # a part's label: ``<member>-<LABELS[where]>``


SETTINGS = ("auto", "on", "off")


def level_plan(
    rubric: Rubric, tables: Tables, setting: str, prior: LevelPrior | None = None, min_systems: int = MIN_SYSTEMS
) -> dict:
    """Whether ``model=auto`` compares its candidates with the system level on ``tables``, and why
    (``model.auto.system_level``: ``auto`` where the data allow it, ``on``: only with it, an error
    where the data do not allow it, ``off``; ``min_systems``: ``model.auto.level_min_systems``, the
    training systems ``auto`` needs, ``on`` needing :data:`MIN_SYSTEMS`)."""
    if setting not in SETTINGS:
        raise InputError(f"{setting!r} is not one of {list(SETTINGS)}", setting="model.auto.system_level")
    record = {"setting": setting, "compared": False}
    if setting == "off":
        return {**record, "reason": "model.auto.system_level=off"}
    pairs, index = question_targets(tables, rubric.main)
    systems = text_system_ids(tables)
    labelled = pairs.text_id[index >= 0].astype(str).map(systems).dropna().unique()
    unlabelled = sorted(set(systems.unique()) - set(labelled))
    needed = MIN_SYSTEMS if setting == "on" else max(min_systems, MIN_SYSTEMS)
    reason = None
    if not rubric.main.ordered:
        reason = f"the main question {rubric.main.id} is categorical"
    elif systems.empty:
        reason = "the training texts have no system_id"
    elif len(labelled) < needed:
        reason = f"{len(labelled)} training system(s) with labels of {rubric.main.id}; a system level needs {needed}"
        reason += "" if needed == MIN_SYSTEMS else " (model.auto.level_min_systems)"
    elif (prior or LevelPrior()).summary == "llm" and not (
        tables.features.question_id.astype(str) == rubric.main.id
    ).any():
        reason = f"model.auto.level_summary=llm but the main question {rubric.main.id} has no LLM answers"
    if reason and setting == "on":
        raise InputError(f"model.auto.system_level=on: {reason}", setting="model.auto.system_level")
    extra = {"systems_without_labels": unlabelled} if unlabelled else {}
    if reason:
        return {**record, "reason": f"{reason}: candidates without the system level", **extra}
    return {**record, "compared": True, "reason": f"{len(labelled)} training systems", **extra}


def levels_state(levels: dict) -> dict[str, torch.Tensor]:
    """The tensors of each member's level, named ``level.<member>/…``."""
    return {f"level.{name}/{k}": v for name, level in levels.items() for k, v in level.state()[1].items()}


def levels_from_state(rubric: Rubric, record: dict, tensors: dict[str, torch.Tensor], source: str) -> dict:
    """The levels of a checkpoint (``record["levels"]``: each member's :meth:`SystemLevel.state` meta)."""
    levels = {}
    for name, meta in record.get("levels", {}).items():
        start = f"level.{name}/"
        part = {key[len(start) :]: v for key, v in tensors.items() if key.startswith(start)}
        try:
            levels[name] = SystemLevel.from_state(rubric, meta, part)
        except (KeyError, ValueError, RuntimeError) as e:
            raise InputError(f"checkpoint system level of {name} does not fit its metadata: {e!r}", file=source) from e
    return levels
