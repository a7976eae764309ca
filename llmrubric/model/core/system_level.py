"""A system level with partial pooling on top of any text-level model (issue 32; docs/models.md).

A text model fitted on texts pooled over systems learns the within-system relation between LLM
answers and human labels, which is flatter than the between-system one, so the means of a new
system are pulled toward the training mean. The level ``μ_s`` of system ``s`` (the mean human
answer of the main question over its pairs) gets its own model::

    ȳ_s ~ N(μ_s, v_s)              v_s: the sampling variance of the system's labelled mean
    μ_s ~ N(a + b·x_s, τ²)          x_s: mean over its texts of the sources' mean expected answer

``a, b`` (or ``a`` alone: the one with the lower leave-one-system-out error) and ``τ²`` are
estimated from the training systems by REML (empirical Bayes). The posterior of ``μ_s`` is the
prior (a new system), narrowed by its labels (a few of a new system, all of a training one: close
to its own mean). The text model supplies the within-system part: the target mean of pair ``t``
of system ``s`` is ``m_t − c_s + μ_s``, with ``m_t`` the model's expected answer and ``c_s`` its
mean over the system's pairs (the training pairs for a training system). Each pair's distribution
is exponentially tilted (``p_k ∝ p_k e^{λ v_k}``, ``λ`` by a 1-D root find) to that target: the
support and the ordering within the system stay, and the mixture over Gauss–Hermite nodes of the
level's posterior widens it by the level's uncertainty.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy import optimize, special

from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Question, Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.columns import text_columns
from llmrubric.model.core.encoding import FeatureLayout, question_targets

MIN_SYSTEMS = 3
NODES = 9  # Gauss–Hermite nodes of the level's posterior
TAU2_CEILING = 100.0


def text_system_ids(tables: Tables, pairs: pd.DataFrame | None = None) -> pd.Series:
    """text id → system id from ``pairs`` (a ``system_id`` column), the texts table or the annotations;
    empty when none has one."""
    for source in (pairs, tables.texts, tables.annotations):
        if source is not None and "system_id" in source and source.system_id.notna().any():
            rows = source.dropna(subset=["system_id"]).drop_duplicates("text_id")
            return pd.Series(rows.system_id.astype(str).to_numpy(), index=rows.text_id.astype(str).to_numpy())
    return pd.Series(dtype=object)


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


def reml(y: np.ndarray, v: np.ndarray, design: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(coefficients, their covariance, τ²) of ``y ~ N(design·β, τ² + v)`` by restricted maximum likelihood."""

    def fit(tau2: float):
        w = 1.0 / (tau2 + v)
        info = design.T @ (design * w[:, None])
        cov = np.linalg.pinv(info)
        beta = cov @ (design.T @ (w * y))
        r = y - design @ beta
        loss = 0.5 * (np.sum(np.log(tau2 + v)) + np.sum(w * r**2) + np.linalg.slogdet(info)[1])
        return beta, cov, loss

    if len(y) > design.shape[1]:
        result = optimize.minimize_scalar(
            lambda s: fit(math.exp(s))[2],
            bounds=(math.log(1e-8), math.log(TAU2_CEILING)),
            method="bounded",
            options={"xatol": 1e-3},
        )
        tau2 = math.exp(result.x)
    else:
        tau2 = 0.0
    tau2 = 0.0 if tau2 < 1e-6 else tau2
    beta, cov, _ = fit(tau2)
    return beta, cov, tau2


class SystemLevel:
    """The system level (module doc) of the main question over one text model's predictions.

    ``fit(tables, expected)``: ``expected`` holds the text model's in-sample expected answers of the
    main question's annotated pairs (:func:`llmrubric.model.core.encoding.question_targets` order).
    ``apply(tables, pairs, probs)`` returns the main question's distributions with the level.
    """

    def __init__(self, rubric: Rubric):
        self.rubric = rubric
        self.question: Question = rubric.main
        if not self.question.ordered:
            raise InputError(
                f"a system level needs an ordered main question; {self.question.id} is categorical",
                setting="model.auto.system_level",
            )
        self.values = np.asarray(self.question.values, dtype=float)

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
        usable = per_system.dropna(subset=["x"])
        if len(usable) < MIN_SYSTEMS:
            raise InputError(
                f"a system level needs at least {MIN_SYSTEMS} training systems with labels and LLM answers, "
                f"found {len(usable)}",
                setting="model.auto.system_level",
            )
        self.form_ = self._choose_form(usable)
        design = self._design(usable.x.to_numpy())
        self.beta_, self.cov_, self.tau2_ = reml(usable.y.to_numpy(), usable.v.to_numpy(), design)
        prior_mean, prior_var = self.prior(usable.x.to_numpy())
        precision = 1.0 / np.maximum(prior_var, 1e-12) + 1.0 / usable.v.to_numpy()
        self.known_ = pd.DataFrame(
            {
                "mean": (prior_mean / np.maximum(prior_var, 1e-12) + usable.y.to_numpy() / usable.v.to_numpy())
                / precision,
                "var": 1.0 / precision,
                "centre": usable.c.to_numpy(),
            },
            index=usable.index.astype(str),
        )
        residual = frame.y - frame.m - frame.system.map(per_system.y - per_system.c)
        self.sigma_within_ = float(np.sqrt(np.mean(residual**2))) if len(residual) else 0.0
        self.systems_ = len(usable)
        return self

    def _system_table(self, frame: pd.DataFrame, tables: Tables) -> pd.DataFrame:
        """Per training system: human mean ``y``, its sampling variance ``v`` (texts as clusters),
        the model's mean ``c`` and the feature summary ``x``."""
        by_text = frame.groupby(["system", "text"]).y.mean()
        texts = by_text.groupby(level=0)
        pooled = float(np.nanmean(texts.var(ddof=1))) if len(by_text) else 0.0
        counts = texts.size()
        v = texts.var(ddof=1).fillna(pooled).clip(lower=max(pooled, 1e-6) * 0.05) / counts
        systems = text_system_ids(tables)
        x = system_summaries(tables, self.rubric, systems[systems.isin(frame.system.unique())])
        table = pd.DataFrame({"y": frame.groupby("system").y.mean(), "c": frame.groupby("system").m.mean(), "v": v})
        return table.assign(x=x.reindex(table.index))

    def _choose_form(self, usable: pd.DataFrame) -> str:
        """``line`` or ``constant``: the lower leave-one-system-out squared error of the prior mean."""
        if np.ptp(usable.x) == 0 or len(usable) < MIN_SYSTEMS:
            return "constant"
        errors = {}
        for form in ("constant", "line"):
            self.form_ = form
            e = []
            for s in range(len(usable)):
                rest = usable.drop(usable.index[s])
                if np.ptp(rest.x) == 0 and form == "line":
                    e.append(np.inf)
                    continue
                beta, _, _ = reml(rest.y.to_numpy(), rest.v.to_numpy(), self._design(rest.x.to_numpy()))
                e.append(float((self._design(usable.x.to_numpy()[s : s + 1]) @ beta)[0] - usable.y.iloc[s]))
            errors[form] = float(np.mean(np.square(e)))
        return min(errors, key=errors.get)

    def _design(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.stack([np.ones_like(x), x], axis=1) if self.form_ == "line" else np.ones((len(x), 1))

    def prior(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prior mean (within the scale) and variance (regression uncertainty included) of the level
        of systems with summaries ``x``."""
        d = self._design(x)
        mean = np.clip(d @ self.beta_, self.values.min(), self.values.max())  # a mean stays on the scale
        return mean, self.tau2_ + np.einsum("ij,jk,ik->i", d, self.cov_, d)

    def posterior(self, prior_mean, prior_var, label_mean, label_var) -> tuple[np.ndarray, np.ndarray]:
        """Normal–normal update of the level with an estimate ``label_mean`` of variance ``label_var``
        (NaN or inf: no labels)."""
        prior_var = np.maximum(np.asarray(prior_var, float), 1e-12)
        label_var = np.where(np.isfinite(label_var), label_var, np.inf)
        label_mean = np.where(np.isfinite(label_var), label_mean, 0.0)
        precision = 1.0 / prior_var + 1.0 / label_var
        return (prior_mean / prior_var + label_mean / label_var) / precision, 1.0 / precision

    def levels(self, tables: Tables, pairs: pd.DataFrame, expected: np.ndarray) -> pd.DataFrame:
        """Per system of ``pairs``: the level's ``mean`` and ``var``, the ``centre`` its pairs are
        centred on, and whether it is ``known`` (a training system) or gets the prior."""
        systems = text_system_ids(tables, pairs)
        system = pairs.text_id.astype(str).map(systems)
        if system.isna().any():
            raise InputError(
                f"text {pairs.text_id[system.isna()].iloc[0]!r} has no system_id: a model with a system level "
                "scores texts of known systems (give system_id in the texts table)",
                column="system_id",
            )
        names = sorted(system.unique())
        centre = pd.Series(expected).groupby(system.to_numpy()).mean()
        x = system_summaries(tables, self.rubric, system.groupby(pairs.text_id.astype(str).to_numpy()).first())
        mean, var = self.prior(x.reindex(names).to_numpy())
        out = pd.DataFrame({"mean": mean, "var": var, "centre": centre.reindex(names).to_numpy()}, index=names)
        out["known"] = out.index.isin(self.known_.index)
        out.loc[out.known, ["mean", "var", "centre"]] = self.known_.loc[out.index[out.known]].to_numpy()
        out["x"] = x.reindex(names)
        return out

    def apply(self, tables: Tables, pairs: pd.DataFrame, probs: np.ndarray, fixed=None) -> np.ndarray:
        """(pairs, options) main-question distributions with the level: each pair tilted to
        ``m_t − c_s + μ`` and averaged over the Gauss–Hermite nodes of ``μ``'s posterior. ``fixed``:
        :meth:`levels` computed over all the texts of the systems (when ``pairs`` are a chunk of them)."""
        k = len(self.values)
        expected = probs[:, :k] @ self.values
        table = self.levels(tables, pairs, expected) if fixed is None else fixed
        system = pairs.text_id.astype(str).map(text_system_ids(tables, pairs)).to_numpy()
        row = table.reindex(system)
        nodes, weights = np.polynomial.hermite.hermgauss(NODES)
        sd = np.sqrt(np.nan_to_num(row["var"].to_numpy()))
        centre = (expected - row.centre.to_numpy() + row["mean"].to_numpy())[:, None]
        targets = centre + math.sqrt(2.0) * sd[:, None] * nodes[None, :]  # (pairs, nodes)
        new = ~row.known.to_numpy(bool) & np.isfinite(row["mean"].to_numpy())
        if new.any():
            targets[new] = _keep_system_means(targets[new], probs[new, :k] > 0, self.values, system[new])
        tilted = tilt(np.repeat(probs[:, :k], NODES, axis=0), self.values, targets.reshape(-1))
        out = np.einsum("pnk,n->pk", tilted.reshape(len(pairs), NODES, k), weights / math.sqrt(math.pi))
        unknown = ~np.isfinite(row["mean"].to_numpy())  # a system no source answered: the text model alone
        out[unknown] = probs[unknown, :k]
        return out

    def record(self) -> dict:
        """JSON summary: the prior's form and coefficients, τ², the training systems' posterior levels."""
        return {
            "form": self.form_,
            "coefficients": [float(b) for b in self.beta_],
            "tau2": float(self.tau2_),
            "sigma_within": self.sigma_within_,
            "systems": self.systems_,
        }

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        meta = {**self.record(), "known": list(self.known_.index)}
        tensors = {
            "beta": torch.from_numpy(np.asarray(self.beta_, dtype=np.float64)),
            "cov": torch.from_numpy(np.asarray(self.cov_, dtype=np.float64)),
            "known": torch.from_numpy(self.known_[["mean", "var", "centre"]].to_numpy(np.float64).copy()),
        }
        return meta, tensors

    @classmethod
    def from_state(cls, rubric: Rubric, meta: dict, tensors: dict[str, torch.Tensor]) -> SystemLevel:
        self = cls(rubric)
        self.form_, self.tau2_, self.systems_ = meta["form"], float(meta["tau2"]), int(meta["systems"])
        self.sigma_within_ = float(meta["sigma_within"])
        self.beta_, self.cov_ = tensors["beta"].numpy(), tensors["cov"].numpy()
        self.known_ = pd.DataFrame(
            tensors["known"].numpy().reshape(-1, 3), index=list(meta["known"]), columns=["mean", "var", "centre"]
        )
        return self


LEVEL = "-level"  # the name of a candidate with the system level: ``<candidate>-level``
SETTINGS = ("auto", "on", "off")


def level_plan(rubric: Rubric, tables: Tables, setting: str) -> dict:
    """Whether ``model=auto`` compares its candidates with the system level on ``tables``, and why
    (``model.auto.system_level``: ``auto`` where the data allow it, ``on``: only with it, an error
    where the data do not allow it, ``off``)."""
    if setting not in SETTINGS:
        raise InputError(f"{setting!r} is not one of {list(SETTINGS)}", setting="model.auto.system_level")
    record = {"setting": setting, "compared": False}
    if setting == "off":
        return {**record, "reason": "model.auto.system_level=off"}
    pairs, index = question_targets(tables, rubric.main)
    systems = text_system_ids(tables)
    labelled = pairs.text_id[index >= 0].astype(str).map(systems).dropna().unique()
    unlabelled = sorted(set(systems.unique()) - set(labelled))
    reason = None
    if not rubric.main.ordered:
        reason = f"the main question {rubric.main.id} is categorical"
    elif systems.empty:
        reason = "the training texts have no system_id"
    elif len(labelled) < MIN_SYSTEMS:
        reason = (
            f"{len(labelled)} training system(s) with labels of {rubric.main.id}; a system level needs {MIN_SYSTEMS}"
        )
    if reason and setting == "on":
        raise InputError(f"model.auto.system_level=on: {reason}", setting="model.auto.system_level")
    extra = {"systems_without_labels": unlabelled} if unlabelled else {}
    if reason:
        return {**record, "reason": f"{reason}: candidates without the system level", **extra}
    return {**record, "compared": True, "reason": f"{len(labelled)} training systems", **extra}


def levelled_fold(rubric: Rubric, models: list, splits: list[tuple], pairs: list[pd.DataFrame], probs: list):
    """(out-of-fold main-question probabilities with the system level, seconds, error) of one
    candidate: each inner fold's level fitted on its training part from the fold model's in-sample
    predictions, applied to the fold model's held-out ``probs``."""
    import time

    start = time.perf_counter()
    main_index, values = rubric.ids.index(rubric.main.id), np.asarray(rubric.main.values, dtype=float)
    out = []
    try:
        for model, (train, test), held, p in zip(models, splits, pairs, probs):
            inner, _ = question_targets(train, rubric.main)
            expected = model.predict_proba(train, inner)[:, main_index, : len(values)] @ values
            out.append(SystemLevel(rubric).fit(train, expected).apply(test, held, p))
    except (InputError, ValueError, np.linalg.LinAlgError) as e:
        return None, time.perf_counter() - start, " ".join(str(e).split())[:300]
    return np.concatenate(out), time.perf_counter() - start, None


def with_levels(
    levels: dict, rubric: Rubric, base: dict, names: list[str], tables: Tables, pairs, fixed: dict | None = None
) -> dict:
    """name → (pairs, questions, options) probabilities: a member's own, or for ``<member>-level``
    its main question with the system level (``fixed``: member → :meth:`SystemLevel.levels` of all texts)."""
    out = {}
    main_index, k = rubric.ids.index(rubric.main.id), len(rubric.main.options)
    for name in names:
        member = name.removesuffix(LEVEL)
        probs = base[member]
        if name.endswith(LEVEL) and len(pairs):
            probs = probs.copy()
            table = (fixed or {}).get(member)
            probs[:, main_index, :k] = levels[member].apply(tables, pairs, probs[:, main_index, :k], table)
        out[name] = probs
    return out


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
