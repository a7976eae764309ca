"""Issue 61's parts of ``benchmarks/labels.py``: the label planner's hit rate, the shipped interval with its transport
check, and CJE (``cje-eval``, the optional group ``bench``) side by side on the same draws.

- ``plan``: for each held-out system and target width, the k of :func:`llmrubric.scoring.label_plan.labels_for_width`
  (residual variances: one per training system, of label − f about its mean over its held-out texts, i.e.
  out-of-fold predictions of the training systems; ``hit_pooled``: the one pooled SD ``within_sd`` of
  ``benchmarks/labels.py`` instead, as ``label plan`` reads one from a checkpoint; the prior's variance and Var f
  from the system's own scores; PPI++ alone from the transport check's floor on), then draws of k labels through
  the leaderboard's interval (:func:`llmrubric.scoring.levels.level_with_labels`, transport check on): ``hit`` is
  the share of draws whose interval is at most the target wide, ``worst_hit`` the lowest system's.
- ``cje``: per held-out system, CJE's ``calibrated_mean_ci`` on the system's own texts (judge score: the mean over
  the LLM sources of the expected main answer; labels rescaled to [0, 1] by the scale's ends and the results back)
  with the k labels of each draw, beside ``level_transport`` (the shipped interval) on the same draws; k = 0: the
  calibrator CJE fits on the other systems' labelled texts, its mean over the held-out texts (a point estimate: CJE
  gives no interval for one new system there). ``transport``: our verdicts and CJE's ``transport_audit`` (that
  k = 0 calibrator, the same margin rescaled, CJE's default floor of effective clusters) on the same labels.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from llmrubric.scoring.label_plan import SystemPlanInput, labels_for_width, scaled_variances
from llmrubric.scoring.levels import level_with_labels
from llmrubric.scoring.transport import TransportSettings

PLAN_WIDTHS = (0.3, 0.4, 0.5)


def shipped_transport(alpha: float) -> TransportSettings:
    """The transport check as ``leaderboard build`` runs it (``leaderboard`` of conf/scoring/default.yaml), at ``alpha``."""
    from llmrubric.config import command_settings

    board = command_settings("scoring", None, {})["leaderboard"]
    return TransportSettings(board["transport_margin"], alpha, board["transport_min_labels"])


def draw(rng, n: int, k: int) -> np.ndarray:
    chosen = np.zeros(n, bool)
    chosen[rng.choice(n, k, replace=False)] = True
    return chosen


def prior(g: pd.DataFrame) -> tuple[float, float]:
    return float(g.prior_mean.iloc[0]), math.sqrt(float(g.prior_var.iloc[0]))


def system_variances(systems: dict, held: str) -> np.ndarray:
    """One residual variance (ddof 1) of label − f per system but ``held``, scaled to ``held`` by the systems' mean
    predicted variances (:func:`llmrubric.scoring.label_plan.scaled_variances`: the held-out system's own, from its
    scores alone)."""
    others = [g for s, g in systems.items() if s != held]
    variances = [float((g.label - g.f).var(ddof=1)) for g in others]
    predicted = [float(np.mean(g.u**2)) for g in others]
    return scaled_variances(variances, predicted, float(np.mean(systems[held].u ** 2)))


def plan_figures(systems: dict, sigmas: dict, alpha: float, small: str, assurance: float, reps: int, seed: int) -> dict:
    """``{width: {hit, hit_pooled, worst_hit, k_mean, per_system}}`` (module doc); ``sigmas``: the pooled SDs."""
    rng, transport, out = np.random.default_rng(seed), shipped_transport(alpha), {}
    for width in PLAN_WIDTHS:
        per = {}
        for name, g in systems.items():
            f, y = g.f.to_numpy(), g.label.to_numpy()
            mean, sd = prior(g)
            plan_input = SystemPlanInput(name, len(g), float(f.var()), sd**2)
            how = (alpha, small, assurance, transport.min_labels)
            ks = {
                "hit": labels_for_width(width, plan_input, system_variances(systems, name), *how),
                "hit_pooled": labels_for_width(width, plan_input, sigmas[name] ** 2, *how),
            }
            per[name] = {"k": ks["hit"], "k_pooled": ks["hit_pooled"]}
            for key, k in ks.items():
                if k is None:
                    per[name][key] = None
                    continue
                hits = []
                for _ in range(reps if k else 0):
                    chosen = draw(rng, len(g), k)
                    got = level_with_labels(y[chosen], f[chosen], f[~chosen], mean, sd, alpha, small, transport)
                    hits.append(got["level_high"] - got["level_low"] <= width)
                per[name][key] = float(np.mean(hits)) if hits else 1.0  # k = 0: the prior's interval is fixed
        out[f"{width:g}"] = {
            **{key: pooled_hit(per, key) for key in ("hit", "hit_pooled")},
            "worst_hit": min((v["hit"] for v in per.values() if v["hit"] is not None), default=None),
            "worst_hit_pooled": min(
                (v["hit_pooled"] for v in per.values() if v["hit_pooled"] is not None), default=None
            ),
            "k_mean": float(np.mean([v["k"] for v in per.values() if v["k"] is not None] or [np.nan])),
            "unreachable": sorted(s for s, v in per.items() if v["k"] is None),
            "per_system": per,
        }
    return {"assurance": assurance, "reps": reps, "by_width": out}


def pooled_hit(per: dict, key: str) -> float | None:
    """The share of all draws (equal per system) that reached the width, over the systems with a plan."""
    values = [v[key] for v in per.values() if v[key] is not None]
    return float(np.mean(values)) if values else None


def cje_module():
    """``cje`` (cje-eval), or None when it is not installed (``pip install -e '.[bench]'``)."""
    try:
        import cje
    except ImportError:
        return None
    return cje


def cje_figures(
    systems: dict, ks: tuple, reps: int, alpha: float, small: str, scale: tuple[float, float], seed: int
) -> dict:
    """CJE beside the shipped interval on the same draws, and the two transport verdicts (module doc)."""
    import warnings

    import cje

    lo, span = scale[0], scale[1] - scale[0]
    rng, transport = np.random.default_rng(seed), shipped_transport(alpha)
    rows, verdicts = [], Counter()
    for name, g in systems.items():
        judge, y, f = g.judge.to_numpy(float), g.label.to_numpy(), g.f.to_numpy()
        truth, (mean, sd) = y.mean(), prior(g)
        others = pd.concat([h for s, h in systems.items() if s != name])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pooled = np.concatenate([others.judge.to_numpy(float), judge])
            labels = np.concatenate([(others.label.to_numpy() - lo) / span, np.full(len(g), np.nan)])
            transfer = cje.calibrated_mean_ci(pooled, labels, alpha=alpha).calibrator
            rows.append((0, "cje", name, None, None, float(np.mean(transfer.predict(judge))) * span + lo - truth))
            for k in ks:
                if len(g) < k + 5:
                    continue
                for _ in range(reps):
                    chosen = draw(rng, len(g), k)
                    part = np.where(chosen, (y - lo) / span, np.nan)
                    res = cje.calibrated_mean_ci(judge, part, alpha=alpha)
                    low, high = (c * span + lo for c in res.ci)
                    rows.append((k, "cje", name, low <= truth <= high, high - low, res.estimate * span + lo - truth))
                    ours = level_with_labels(y[chosen], f[chosen], f[~chosen], mean, sd, alpha, small, transport)
                    hit = ours["level_low"] <= truth <= ours["level_high"]
                    width = ours["level_high"] - ours["level_low"]
                    rows.append((k, "level_transport", name, hit, width, ours["level"] - truth))
                    audit = cje.transport_audit(
                        judge[chosen],
                        (y[chosen] - lo) / span,
                        transfer,
                        alpha=alpha,
                        delta_max=transport.margin_of(sd) / span,
                    )
                    verdicts[(k, ours["transport"], str(getattr(audit.status, "value", audit.status)))] += 1
    return {
        "by_k": cje_summary(pd.DataFrame(rows, columns=["k", "method", "system", "hit", "width", "error"])),
        "transport_verdicts": verdict_table(verdicts),
        "reps": reps,
    }


def cje_summary(df: pd.DataFrame) -> dict:
    """``{k: {method: {coverage, width, rms, worst_system, worst_coverage}}}``."""
    out: dict = {}
    for (k, method), part in df.groupby(["k", "method"]):
        rms = float(np.sqrt(np.mean(np.square(part.error.to_numpy(float)))))
        if k == 0:
            out.setdefault(str(k), {})[method] = {"coverage": None, "width": None, "rms": rms}
            continue
        per = part.groupby("system").hit.mean()
        out.setdefault(str(k), {})[method] = {
            "coverage": float(part.hit.mean()),
            "width": float(part.width.mean()),
            "rms": rms,
            "worst_system": str(per.idxmin()),
            "worst_coverage": float(per.min()),
        }
    return out


def verdict_table(counts: Counter) -> dict:
    """``{k: {"ours / cje": draws}}``."""
    out: dict = {}
    for (k, ours, theirs), n in sorted(counts.items()):
        out.setdefault(str(k), {})[f"{ours} / {theirs}"] = n
    return out
