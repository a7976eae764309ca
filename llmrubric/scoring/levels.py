"""Leaderboards by the system level of a model that has one (:mod:`llmrubric.model.core.system_level`).

``llmrubric score texts`` with such a model writes ``<scores>.levels.csv``: per system the posterior
mean ``level`` of its human mean, its ``level_sd`` and ``level_df`` (the level is a Student t: the
prior from the system's summary for a new system, wider the further it lies from the training
systems; close to its own labels' mean for a training one) and the within-system residual spread
``sigma_within``. ``leaderboard build --levels`` ranks the systems by their level and adds its
central interval from that t (``level ± z·sd`` for a table without ``level_df``). With human labels of k ≥ 2 texts of a new system (``--annotations``) the
posterior narrows (:func:`level_posterior`): the PPI++ estimate of the system's mean from the labels
and the scores of all its texts (:func:`llmrubric.scoring.labels.uniform_interval`), its variance read
from its interval, combined with the prior by the normal–normal update; with ``small_sample:
student`` the posterior's half-width is widened by t_{k−1}/z. ``benchmarks/labels.py`` chose this
rule (``level_ppi_pp_student``) on the simulated and synthetic sets: coverage ≥ 0.93 on both at
k = 10, narrower than PPI++ alone, where the update by ``mean(y − f)`` of variance
``sigma_within²/k`` covered 0.92 on the synthetic set. A training system's level already holds its
training labels and is kept.

The transport check (issue 61, :mod:`llmrubric.scoring.transport`, on by default with ``--levels --annotations``)
tests each new system's labels against its level: PASS (or fewer than ``transport_min_labels`` labels) keeps the
posterior; FAIL or INCONCLUSIVE replaces it by the PPI++ interval of the labels alone, the prior left out.
``benchmarks/labels.py`` chose its defaults (the margin: each system's own prior half-width; 10 labels at least)
on the simulated and synthetic sets (``benchmarks/results/labels_transport_training.json``: at k = 10 coverage
0.897 and 0.956 against the posterior's 0.915 and 0.963, RMS 0.104 and 0.115 against 0.094 and 0.110); on
DialSumm they lift the worst system's coverage at k = 10 from 0.746 (B) to 0.878 (``level_transport``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError
from llmrubric.io.system_values import read_system_values
from llmrubric.io.tables import read_nonempty
from llmrubric.scoring.labels import uniform_interval
from llmrubric.scoring.ranks import by_score
from llmrubric.scoring.transport import FALLS_BACK, TOO_FEW, TransportSettings, transport_check


def read_levels(path: str | Path) -> pd.DataFrame:
    """A levels table of ``score texts`` (``system_id, level, level_sd, known, sigma_within``; optional ``level_df``,
    ``beyond``), indexed by system."""
    table = read_system_values(path, "levels table", lambda columns: ["level", "level_sd", "sigma_within"])
    if (table.level_sd < 0).any() or (table.sigma_within < 0).any():
        raise InputError("level_sd and sigma_within must be >= 0", file=str(path), column="level_sd")
    raw = read_nonempty(Path(path), "levels table")
    known = raw["known"] if "known" in raw.columns else pd.Series(False, index=raw.index)
    table["known"] = known.astype(str).str.strip().str.lower().isin(["true", "1"]).to_numpy()
    beyond = raw["beyond"] if "beyond" in raw.columns else pd.Series(False, index=raw.index)
    table["beyond"] = beyond.astype(str).str.strip().str.lower().isin(["true", "1"]).to_numpy()
    df = pd.to_numeric(raw["level_df"], errors="coerce") if "level_df" in raw.columns else None
    if df is not None and not (df > 2).all():
        row = int(np.flatnonzero(~(df > 2).to_numpy())[0])
        raise InputError("level_df must be a number > 2", file=str(path), row=row, column="level_df")
    table["level_df"] = df.to_numpy() if df is not None else math.inf
    return table


def level_posterior(
    prior_mean: float, prior_var: float, labelled: dict, k: int, alpha: float = 0.05, small_sample: str = "student"
) -> dict:
    """``estimate, low, high`` of a new system's level from its prior and the interval ``labelled`` of
    its k labels (PPI++, module doc). A zero-width ``labelled`` interval (labels and scores that
    leave no spread) is returned as it is: the posterior would be that point."""
    z = stats.norm.ppf(1 - alpha / 2)
    label_var = ((labelled["high"] - labelled["low"]) / (2 * z)) ** 2
    if not label_var > 0:
        return dict(labelled)
    precision = 1 / max(prior_var, 1e-12) + 1 / label_var
    mean = (prior_mean / max(prior_var, 1e-12) + labelled["estimate"] / label_var) / precision
    widen = stats.t.ppf(1 - alpha / 2, k - 1) / z if small_sample == "student" and k > 1 else 1.0
    half = z / math.sqrt(precision) * widen
    return {"estimate": float(mean), "low": float(mean - half), "high": float(mean + half)}


def with_level_intervals(
    board: pd.DataFrame,
    levels: pd.DataFrame,
    systems: list,
    labels: pd.Series | None,
    alpha: float = 0.05,
    small_sample: str = "student",
    transport: TransportSettings | None = None,
) -> pd.DataFrame:
    """``board`` with ``level, level_low, level_high``, ``level_labels`` (the labels the level used:
    0 for a training system or fewer than 2) and ``beyond`` (a new system outside the training systems' range),
    ranked by level (module doc). With ``transport``, each new system with labels is checked
    (:mod:`llmrubric.scoring.transport`: ``transport``, ``transport_residual``, ``_low``, ``_high``, ``_margin``) and a
    FAIL or INCONCLUSIVE replaces its interval by the PPI++ interval of its labels alone; ``level_interval`` says
    which interval each system has."""
    missing = sorted(set(board.system) - set(levels.index))
    if missing:
        raise InputError(f"systems {missing} are not in the levels table", column="system_id")
    z = stats.norm.ppf(1 - alpha / 2)
    rows = []
    for data in systems:
        row = levels.loc[data.system]
        mean, sd = float(row.level), float(row.level_sd)
        df = float(row.get("level_df", math.inf))
        half = z * sd if not math.isfinite(df) else stats.t.ppf(1 - alpha / 2, df) * sd * math.sqrt((df - 2) / df)
        out = {"level": mean, "level_low": mean - half, "level_high": mean + half, "level_labels": 0}
        out["level_interval"] = "training system: its level" if row.known else "the level's prior (no labels)"
        if labels is not None and not row.known:
            out.update(labelled_level(data, labels, mean, sd, alpha, small_sample, transport))
        rows.append({"system": data.system, **out, "beyond": bool(row.get("beyond", False)) and not row.known})
    return by_score(board.drop(columns="rank").merge(pd.DataFrame(rows), on="system", how="left"), "level")


def labelled_level(data, labels: pd.Series, mean: float, sd: float, alpha, small_sample, transport) -> dict:
    """A new system's level updated by its labels (2 or more), checked by ``transport`` (None: not checked)."""
    scores = pd.Series(data.text_scores(), index=data.text_ids)
    labelled = labels.reindex(data.text_ids).dropna()
    if len(labelled) < 2:
        return {}
    queries = None
    if data.query_ids is not None:
        queries = pd.Series(data.query_ids, index=data.text_ids).reindex(labelled.index).to_numpy()
    rest = scores.drop(labelled.index).to_numpy()
    y, f = labelled.to_numpy(float), scores.reindex(labelled.index).to_numpy()
    return level_with_labels(y, f, rest, mean, sd, alpha, small_sample, transport, queries)


def level_with_labels(
    y: np.ndarray,
    f: np.ndarray,
    rest: np.ndarray,
    mean: float,
    sd: float,
    alpha: float = 0.05,
    small_sample: str = "student",
    transport: TransportSettings | None = None,
    queries: np.ndarray | None = None,
) -> dict:
    """The leaderboard's level interval of a new system from k labels ``y`` of texts scored ``f`` (``rest``: the
    scores of its other texts) and its prior ``mean``, ``sd``: the prior updated by PPI++ (:func:`level_posterior`),
    checked by ``transport`` against the labels (module doc of :mod:`llmrubric.scoring.transport`)."""
    k = len(y)
    ppi = uniform_interval("ppi_pp", y, f, rest, alpha, small_sample)
    posterior = level_posterior(mean, sd**2, ppi, k, alpha, small_sample)
    out = {"level": posterior["estimate"], "level_low": posterior["low"], "level_high": posterior["high"]}
    out.update(level_labels=k, level_interval="the level updated by PPI++ of its labels")
    if transport is None:
        return out
    calibrated = f - np.nanmean(np.concatenate([f, rest])) + mean
    check = transport_check(y, calibrated, transport.margin_of(sd), transport.alpha, transport.min_labels, queries)
    out.update({f"transport_{c}": check[c] for c in ("residual", "low", "high", "margin")}, transport=check["verdict"])
    if check["verdict"] in FALLS_BACK:
        out.update(level=ppi["estimate"], level_low=ppi["low"], level_high=ppi["high"])
        out["level_interval"] = f"PPI++ of its labels alone (transport {check['verdict']}: the level's prior left out)"
    elif check["verdict"] == TOO_FEW:
        out["level_interval"] += " (transport unchecked: too few labels)"
    return out
