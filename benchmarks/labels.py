"""Few human labels of a new system, and a new judge from a few annotations (issues 26 and 50).

    .venv/bin/python benchmarks/labels.py [--sets simulated_shift llm_rubric_synthetic dialsumm] [--reps 500]
                                          [--llm-rubric ROOT] [--dialsumm DIR] [--cache outputs/labels]
                                          [--coverage 0.9] [--out FILE]
                                          [--judges 6] [--draws 3] [--judge-models default paper ordinal]

Intervals. Sets: ``simulated_shift`` (:func:`llmrubric.data.simulate.simulate_shift`, seed 0: 12 systems
of 60 texts) and ``llm_rubric_synthetic`` (DS1..DS5 of the release at ``--llm-rubric``), the default
``--sets``; ``dialsumm`` (issue 50): the real DialSummEval set at ``--dialsumm`` (default
``../shared/data/dialsumm``, loaded as ``benchmarks/intervals.py`` loads it: main question coherence, the
label the mean of the three raters; 14 systems of 100 texts). Each system
is held out in turn and scored by a calibrator trained on the others: the shipped default
(``conf/model/default.yaml``, ``conf/trainer/default.yaml``) but with ``ensemble=1`` (one network, to
keep the 17 fits within minutes; they are cached in ``--cache``). A text's score f is the mean over
the model's judges of the expected main answer, its uncertainty the square root of their mean
predicted variance, its human label the mean of its human answers; the truth is the system's
mean label over all its texts. For k ∈ {5, 10, 20, 40} labelled texts, ``--reps`` repetitions per
system with at least k + 5 annotated texts (on the release DS4 and DS5 have 41 and 34, so k = 40
is over DS1..DS3): ``classical``, ``ppi``, ``ppi_pp`` with k texts drawn uniformly without replacement, and
``active_ppi_pp`` with k draws by ``llmrubric label suggest``'s probabilities (floor from
``conf/labels/default.yaml``), all as ``llmrubric leaderboard build`` computes them
(:mod:`llmrubric.scoring.labels`, ``small_sample`` from ``conf/scoring/default.yaml``). Coverage of
the truth and mean width over systems and repetitions; k = 0 holds the leave-one-system-out shift
interval (score ± t·RMS of the other systems' errors), the leaderboard's interval without labels.
``--coverage`` sets the nominal coverage of every interval (alpha = 1 − coverage; default
``1 − leaderboard.alpha`` of ``conf/scoring/default.yaml``).
Beside coverage and width each method has ``rms``, the system RMS of its point estimate: the square root of
the mean over held-out systems and repetitions of (estimate − the system's mean label)²; ``per_system``
(coverage, width, ``mean_error`` of the estimate) and ``worst_system`` / ``worst_coverage``, the system of
lowest coverage. At k = 0 ``shift`` and ``level`` have the RMS of their centre (the mean score f; the
prior's mean), ``per_system`` with each system's error, ``missed`` (the systems outside) and ``worst_system``
(the one farthest outside its interval, or nearest its edge).
``level`` (issue 32): the system level (:class:`llmrubric.Levelled`) fitted on
the training systems of each split with the split model's in-sample expected answers; at k = 0 its
prior's interval (mean ± z·sd), at k > 0 that prior updated as ``llmrubric leaderboard build
--levels`` did before ``level_ppi_pp_student`` replaced it (the labels' estimate mean(f) + mean(y − f) of variance sigma_within² / k; here
sigma_within is the SD of label − f about each system's mean over the other systems' held-out
texts, a stand-in for the model's in-sample one); ``level_ppi_pp``: the prior updated by the PPI++
estimate of the same k labels (its variance read from the PPI++ interval's half-width),
``level_ppi_pp_student``: that with the half-width widened by t_{k-1} / z, the rule of
``leaderboard build --levels`` (:func:`llmrubric.scoring.levels.level_posterior`, called here).
``--ks`` and ``--no-match`` run a part (e.g. ``--ks 10 --no-match --no-judges``).
``labels_to_match_classical_at_40``: the fewest labels (k = 2..40) at which a method's mean width
is at most the classical interval's at k = 40, over the systems with at least 45 texts, beside
``imputed_width_floor``: the width 2·z·sd(f)/√N that the term var f / N of the prediction-powered
variance alone gives, whatever the number of labels.

Judge added. On ``simulated_shift``, texts split 2:1 by text into train and test; for each of
``--judges`` judges, a model trained without that judge gets it by ``judges add`` from k ∈ {5, 10,
20, 50} of its annotated training texts (``--draws`` draws), and a full retrain on the same
training annotations plus the same k gets it too; NLL of the judge's main answers on the test
texts for both (``nll_added``, ``nll_retrain``), the add's seconds (the penalty chosen by
cross-validation, ``conf/labels/default.yaml``; ``nll_added_delta_l2`` with the checkpoint's
``trainer.delta_l2`` instead), and for reference the NLL of
the judge unseen (``nll_unseen``) and after a retrain with all its training annotations
(``nll_retrain_all``); the model is ``conf/model/<option>.yaml`` with one network for each of
``--judge-models`` (default: the shipped one), the first in ``judge_add``, all in
``judge_add_by_model``; it runs on ``simulated_shift`` whatever ``--sets`` (skip it with ``--no-judges``).
Writes ``--out``: by default ``benchmarks/results/labels.json``, or ``benchmarks/results/labels_dialsumm.json``
when ``--sets`` is ``dialsumm`` alone.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, exit_code, llm_rubric_default, write_result  # noqa: E402
from intervals import DATA as DIALSUMM  # noqa: E402
from intervals import load as load_dialsumm  # noqa: E402
from label_planning import cje_figures, cje_module, plan_figures, shipped_transport  # noqa: E402

from llmrubric import Levelled, NetworkCalibrator  # noqa: E402
from llmrubric.config import group, load_file  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.simulate import simulate_shift  # noqa: E402
from llmrubric.data.splits import holdout_texts, system_folds  # noqa: E402
from llmrubric.evaluation.metrics import align  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402
from llmrubric.io.files import write_table  # noqa: E402
from llmrubric.io.predictions import probabilities  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, read_table  # noqa: E402
from llmrubric.model.core.encoding import question_targets  # noqa: E402
from llmrubric.model.core.system_level import source_means  # noqa: E402
from llmrubric.model.judges import add_judge  # noqa: E402
from llmrubric.scoring import labels as lab  # noqa: E402
from llmrubric.scoring.leaderboard import shift_half_width  # noqa: E402
from llmrubric.scoring.levels import level_posterior, level_with_labels  # noqa: E402

KS = (0, 5, 10, 20, 40)
JUDGE_KS = (5, 10, 20, 50)
SETS = ("simulated_shift", "llm_rubric_synthetic", "dialsumm")
DEFAULT_SETS = SETS[:2]  # dialsumm runs when asked for, into its own result (--out)
OUT = ROOT / "benchmarks" / "results"
LEVEL_METHODS = ("level", "level_ppi_pp", "level_ppi_pp_student", "level_transport")
MIN_UNLABELLED = 5  # a system enters k's figures when it has at least k + 5 labelled texts


def model_settings(option: str = "default") -> dict:
    """``conf/model/<option>.yaml`` with one network."""
    return {**group("model", option), "ensemble": 1}


def load_set(name: str, args) -> tuple[Rubric, Tables]:
    if name == "dialsumm":  # as benchmarks/intervals.py loads it: main question coherence
        return load_dialsumm(Path(args.dialsumm))
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    if name == "simulated_shift":
        return rubric, simulate_shift(0, rubric=rubric)[0]
    return rubric, llm_rubric.load(args.llm_rubric, "synthetic", rubric)


def held_out_texts(name: str, rubric: Rubric, tables: Tables, cache: Path) -> pd.DataFrame:
    """Per text of every system, scored by a model trained without its system: ``system_id, f, u, label``."""
    path = cache / f"{name}_texts.parquet"
    columns = {"f": float, "u": float, "label": float, "prior_mean": float, "prior_var": float}
    if path.is_file():
        cached = read_table(path, "texts")
        if set(columns) <= set(cached.columns):  # an older cache without the level's prior is refitted
            return cached.astype(columns)
    folds = system_folds(tables)
    systems = sorted(folds.system_id.unique())
    splits = [
        (tables.subset(folds.text_id[folds.system_id != s]), tables.subset(folds.text_id[folds.system_id == s]))
        for s in systems
    ]
    started = time.perf_counter()
    models = NetworkCalibrator.fit_many(
        [NetworkCalibrator(rubric, model_settings(), group("trainer", "default"), 0) for _ in splits],
        [tr for tr, _ in splits],
    )
    print(f"{name}: {len(models)} leave-one-system-out fits in {time.perf_counter() - started:.0f} s", flush=True)
    main = rubric.main
    values = dict(zip(main.keys, main.values))
    parts = []
    for system, model, (train, test) in zip(systems, models, splits):
        prior_mean, prior_var = level_prior(rubric, model, train, test)
        texts = sorted(test.annotations.text_id.unique())
        pairs = pd.MultiIndex.from_product([texts, model.judges_.judges], names=["text_id", "judge_id"]).to_frame(
            index=False
        )
        pred = model.predict(test, pairs=pairs, questions=[main.id])
        by_text = pred.groupby("text_id")
        ann = test.annotations[test.annotations.question_id == main.id]
        label = ann.answer.map(values).astype(float).groupby(ann.text_id).mean()
        parts.append(
            pd.DataFrame(
                {
                    "text_id": texts,
                    "system_id": system,
                    "f": by_text["mean"].mean().reindex(texts).to_numpy(),
                    "u": np.sqrt(by_text["var"].mean().reindex(texts).to_numpy()),
                    "label": label.reindex(texts).to_numpy(),
                    "prior_mean": prior_mean,
                    "prior_var": prior_var,
                }
            )
        )
    out = pd.concat(parts, ignore_index=True).dropna(subset=["label"])
    write_table(out, path)
    return out


def level_prior(rubric: Rubric, model, train: Tables, test: Tables) -> tuple[float, float]:
    """Mean and variance of the held-out system's level before any label of it: the system level
    (:class:`llmrubric.Levelled`) fitted on the training systems with ``model``'s in-sample expected answers, its
    prior at the held-out system's LLM summary."""
    held, _ = question_targets(test, rubric.main)
    row = Levelled(model).fit_level(train).levels(test, held).iloc[0]
    return float(row["mean"]), float(row["var"])


def level_rule(prior_mean: float, prior_var: float, y, f, chosen, sigma_within: float, alpha: float) -> dict:
    """The leaderboard's rule before ``level_ppi_pp_student`` replaced it: the prior updated by
    the labels' estimate ``mean(f) + mean_labelled(y − f)`` of variance ``sigma_within² / k``."""
    k = int(chosen.sum())
    estimate = f.mean() + (y[chosen] - f[chosen]).mean()
    precision = 1 / prior_var + k / sigma_within**2
    mean = (prior_mean / prior_var + estimate * k / sigma_within**2) / precision
    half = stats.norm.ppf(1 - alpha / 2) / math.sqrt(precision)
    return {"estimate": mean, "low": mean - half, "high": mean + half}


def within_sd(systems: dict, held: str) -> float:
    """SD of the texts' ``label − f`` about their system's mean, over every system but ``held`` (a
    stand-in, from held-out predictions of the training systems, for the level's ``sigma_within``)."""
    residual = [g.label - g.f - (g.label - g.f).mean() for s, g in systems.items() if s != held]
    return float(np.concatenate(residual).std(ddof=1))


def draw_intervals(systems: dict, k: int, reps: int, floor: float, alpha: float, small: str, rng) -> dict:
    """``{method: {system, hit, width, error}}``, one list entry per draw, of ``reps`` draws of k labels in each
    of ``systems`` (id → texts); ``error`` is the method's estimate minus the system's mean label."""
    out: dict[str, dict[str, list]] = {
        m: {"system": [], "hit": [], "width": [], "error": []} for m in (*lab.METHODS, *LEVEL_METHODS)
    }
    for name, g in systems.items():
        f, y, truth = g.f.to_numpy(), g.label.to_numpy(), g.label.mean()
        prior = float(g.prior_mean.iloc[0]), float(g.prior_var.iloc[0])
        sigma = within_sd(systems, name)
        q = lab.sampling_probabilities(g.u.to_numpy(), floor)
        check = shipped_transport(alpha)
        for _ in range(reps):
            chosen = np.zeros(len(g), bool)
            chosen[rng.choice(len(g), k, replace=False)] = True
            outs = {m: lab.uniform_interval(m, y[chosen], f[chosen], f[~chosen], alpha, small) for m in lab.UNIFORM}
            i = rng.choice(len(g), k, p=q)
            outs["active_ppi_pp"] = lab.active_ppi_pp(y[i], f[i], q[i], f, alpha, small_sample=small)
            outs["level"] = level_rule(*prior, y, f, chosen, sigma, alpha)
            outs["level_ppi_pp"] = level_posterior(*prior, outs["ppi_pp"], k, alpha, "normal")
            outs["level_ppi_pp_student"] = level_posterior(*prior, outs["ppi_pp"], k, alpha, "student")
            shipped = level_with_labels(
                y[chosen], f[chosen], f[~chosen], prior[0], math.sqrt(prior[1]), alpha, small, check
            )
            outs["level_transport"] = {
                "estimate": shipped["level"],
                "low": shipped["level_low"],
                "high": shipped["level_high"],
            }
            for m, o in outs.items():
                out[m]["system"].append(name)
                out[m]["hit"].append(o["low"] <= truth <= o["high"])
                out[m]["width"].append(o["high"] - o["low"])
                out[m]["error"].append(o["estimate"] - truth)
    return out


def system_rms(errors) -> float:
    """The system RMS of a point estimate: the square root of the mean squared error (estimate − the system's
    mean label) over the held-out systems and repetitions."""
    return float(np.sqrt(np.mean(np.square(np.asarray(errors, float)))))


def method_figures(draws: dict) -> dict:
    """Coverage, mean width, system RMS and per-system figures of one method's draws (:func:`draw_intervals`);
    ``worst_system`` is the system of lowest coverage (the first in order on a tie)."""
    df = pd.DataFrame(draws)
    per = df.groupby("system").agg(coverage=("hit", "mean"), width=("width", "mean"), mean_error=("error", "mean"))
    worst = per.coverage.idxmin()
    return {
        "coverage": float(df.hit.mean()),
        "width": float(df.width.mean()),
        "systems": len(per),
        "rms": system_rms(df.error),
        "worst_system": str(worst),
        "worst_coverage": float(per.coverage[worst]),
        "per_system": {str(s): {c: float(v) for c, v in row.items()} for s, row in per.iterrows()},
    }


def unlabelled_figures(rows: dict) -> dict:
    """Coverage, mean width and system RMS of an interval without labels, ``rows``: system → (centre − the
    system's mean label, half-width); ``worst_system`` is the one farthest outside (largest |error| − half)."""
    error = pd.Series({s: e for s, (e, _) in rows.items()})
    half = pd.Series({s: h for s, (_, h) in rows.items()})
    covered = error.abs() <= half
    worst = (error.abs() - half).idxmax()
    return {
        "coverage": float(covered.mean()),
        "width": float((2 * half).mean()),
        "systems": len(rows),
        "rms": system_rms(error),
        "worst_system": str(worst),
        "missed": [str(s) for s in error.index[~covered]],
        "per_system": {
            str(s): {"covered": bool(covered[s]), "width": float(2 * half[s]), "mean_error": float(error[s])}
            for s in error.index
        },
    }


def interval_figures(
    texts: pd.DataFrame,
    reps: int,
    floor: float,
    alpha: float,
    small: str,
    seed: int,
    ks: tuple[int, ...] = KS[1:],
    with_match: bool = True,
) -> tuple:
    """``{k: {method: {coverage, width, rms, worst_system, ...}}}`` over the systems with at least k +
    MIN_UNLABELLED texts and the repetitions (k = 0: the shift interval, centred at the mean score, and the
    level's prior), and the fewest labels at which PPI++ / active PPI++ are as narrow as classical at k = 40
    (over the systems that have k = 40 + MIN_UNLABELLED texts, ``reps // 4`` repetitions per k)."""
    rng = np.random.default_rng(seed)
    systems = {s: g for s, g in texts.groupby("system_id")}
    errors = {s: g.f.mean() - g.label.mean() for s, g in systems.items()}
    shift = {s: (e, shift_half_width([x for t, x in errors.items() if t != s], alpha)) for s, e in errors.items()}
    figures: dict = {"0": {m: {"coverage": None, "width": None} for m in lab.METHODS}}
    figures["0"]["shift"] = unlabelled_figures(shift)
    z = stats.norm.ppf(1 - alpha / 2)
    prior = {s: (g.prior_mean.iloc[0] - g.label.mean(), z * math.sqrt(g.prior_var.iloc[0])) for s, g in systems.items()}
    figures["0"]["level"] = unlabelled_figures(prior)
    for k in ks:
        eligible = {s: g for s, g in systems.items() if len(g) >= k + MIN_UNLABELLED}
        res = draw_intervals(eligible, k, reps, floor, alpha, small, rng)
        figures[str(k)] = {m: method_figures(draws) for m, draws in res.items()}
    if not with_match:
        return figures, None
    largest = max(KS)
    eligible = {s: g for s, g in systems.items() if len(g) >= largest + MIN_UNLABELLED}
    target = float(np.mean(draw_intervals(eligible, largest, reps, floor, alpha, small, rng)["classical"]["width"]))
    z = stats.norm.ppf(1 - alpha / 2)
    floor_width = float(np.mean([2 * z * g.f.std(ddof=0) / math.sqrt(len(g)) for g in eligible.values()]))
    match: dict = {"classical_width_at_40": target, "systems": sorted(eligible), "imputed_width_floor": floor_width}
    for m in ("ppi_pp", "active_ppi_pp"):
        match[m] = None
        for k in range(2, largest + 1):
            draws = draw_intervals(eligible, k, max(reps // 4, 50), floor, alpha, small, rng)
            if np.mean(draws[m]["width"]) <= target:
                match[m] = k
                break
    return figures, match


def planning_figures(rubric: Rubric, tables: Tables, texts: pd.DataFrame, args, alpha: float, small: str) -> tuple:
    """Issue 61 (``benchmarks/label_planning.py``): the planner's hit rate, and CJE beside the shipped interval
    (``{"missing": ...}`` when cje-eval is not installed)."""
    systems = {s: g for s, g in texts.groupby("system_id")}
    sigmas = {s: within_sd(systems, s) for s in systems}
    plan = None if args.no_plan else plan_figures(systems, sigmas, alpha, small, args.assurance, args.plan_reps, 1)
    if args.no_cje:
        return plan, None
    if cje_module() is None:
        print("CJE is missing: pip install -e '.[bench]' (cje-eval) to run it beside the shipped interval", flush=True)
        return plan, {"missing": "cje-eval is not installed (pip install -e '.[bench]')"}
    judge = pd.Series(source_means(tables, rubric, list(texts.text_id)), index=texts.index)
    with_judge = {s: g.assign(judge=judge[g.index]) for s, g in texts.groupby("system_id")}
    values = np.asarray(rubric.main.values, float)
    ks = tuple(k for k in args.ks if k > 0)
    return plan, cje_figures(with_judge, ks, args.cje_reps, alpha, small, (values.min(), values.max()), 2)


def nll(model, tables: Tables, rubric: Rubric) -> float:
    """Mean NLL of the annotated main answers of ``tables``."""
    pred = model.predict(tables, questions=[rubric.main.id])
    merged = align(pred, tables.annotations, rubric.main)
    p = probabilities(merged, rubric.main)
    y = pd.Index(rubric.main.keys).get_indexer(merged.answer)
    return float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())


def judge_add_figures(
    rubric: Rubric, tables: Tables, n_judges: int, draws: int, settings: dict, model: str = "default"
) -> dict:
    """``{k: {nll_added, nll_retrain, seconds, ...}}`` averaged over judges and draws (module doc)."""
    train_ids, test_ids = holdout_texts(pd.Series(tables.text_ids), 1 / 3, 0)
    train, test = tables.subset(train_ids), tables.subset(test_ids)
    ann = train.annotations
    judges = sorted(ann.judge_id.unique())[:n_judges]
    rows = []
    trainer = group("trainer", "default")
    for j in judges:
        own = ann[ann.judge_id == j]
        without = Tables(ann[ann.judge_id != j], train.features, train.texts)
        target = Tables(test.annotations[test.annotations.judge_id == j], test.features, test.texts)
        rng = np.random.default_rng(len(rows))
        picks = [
            (k, d, rng.choice(sorted(own.text_id.unique()), k, replace=False)) for k in JUDGE_KS for d in range(draws)
        ]
        retrain_tables = [
            Tables(pd.concat([without.annotations, own[own.text_id.isin(p)]]), train.features, train.texts)
            for _, _, p in picks
        ]
        started = time.perf_counter()
        models = NetworkCalibrator.fit_many(
            [NetworkCalibrator(rubric, model_settings(model), trainer, 0) for _ in range(len(picks) + 2)],
            [without, train, *retrain_tables],
        )
        print(f"judge {j}: {len(models)} fits in {time.perf_counter() - started:.0f} s", flush=True)
        base, full, retrained = models[0], models[1], models[2:]
        unseen, every = nll(base, target, rubric), nll(full, target, rubric)
        for (k, d, p), again in zip(picks, retrained):
            annotated = Tables(own[own.text_id.isin(p)], train.features)
            args = (settings.get("min_annotations", 5),)
            more = (tuple(settings.get("l2_grid", (0.001, 0.01, 0.1, 1.0, 10.0))), settings.get("cv_folds", 5))
            t0 = time.perf_counter()
            added = add_judge(base, annotated, j, *args, settings.get("l2", "cv"), settings.get("max_iter", 200), *more)
            seconds = time.perf_counter() - t0
            fixed = add_judge(base, annotated, j, *args, None, settings.get("max_iter", 200), *more)
            rows.append(
                {
                    "judge": j,
                    "k": k,
                    "draw": d,
                    "nll_added": nll(added, target, rubric),
                    "nll_retrain": nll(again, target, rubric),
                    "seconds": seconds,
                    "l2": added.summaries_[0]["added_judges"][-1]["l2"],
                    "nll_added_delta_l2": nll(fixed, target, rubric),
                    "nll_unseen": unseen,
                    "nll_retrain_all": every,
                }
            )
    df = pd.DataFrame(rows)
    out = {}
    for k, g in df.groupby("k"):
        out[str(k)] = {
            c: float(g[c].mean())
            for c in ("nll_added", "nll_retrain", "seconds", "nll_added_delta_l2", "nll_unseen", "nll_retrain_all")
        }
        out[str(k)]["l2_median"] = float(g.l2.median())
        out[str(k)]["seconds_max"] = float(g.seconds.max())
        out[str(k)]["added_minus_retrain"] = float((g.nll_added - g.nll_retrain).mean())
        out[str(k)]["fits"] = len(g)
    return out


def print_planning(name: str, plan: dict | None, cje: dict | None, seconds: float) -> None:
    """The planner's hit rates and CJE beside the shipped interval, as tables."""
    print(f"{name}: plan and CJE in {seconds:.0f} s", flush=True)
    for width, row in (plan or {}).get("by_width", {}).items():
        print(
            f"  plan width {width}: hit {row['hit']} (worst system {row['worst_hit']}), with one pooled SD "
            f"{row['hit_pooled']} (worst {row['worst_hit_pooled']}), mean k {row['k_mean']}, unreachable {row['unreachable']}",
            flush=True,
        )
    for k, methods in (cje or {}).get("by_k", {}).items():
        for method, v in methods.items():
            print(f"  k={k} {method}: " + ", ".join(f"{c} {x}" for c, x in v.items()), flush=True)
    for k, table in (cje or {}).get("transport_verdicts", {}).items():
        print(f"  k={k} transport (ours / CJE): {table}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; bad input is one line on stderr and exit code 2."""
    return exit_code(run, argv)


def run(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="*", default=list(DEFAULT_SETS), choices=list(SETS))
    parser.add_argument("--llm-rubric", default=llm_rubric_default())
    parser.add_argument("--dialsumm", default=str(DIALSUMM), help="the DialSummEval folder of the set dialsumm")
    parser.add_argument(
        "--coverage",
        type=float,
        default=None,
        help="nominal coverage of the intervals (default: 1 - leaderboard.alpha of conf/scoring/default.yaml)",
    )
    parser.add_argument("--reps", type=int, default=500, help="repetitions per system and k (>= 200)")
    parser.add_argument("--judges", type=int, default=6, help="judges left out of training in turn")
    parser.add_argument("--draws", type=int, default=3, help="draws of the k annotated texts per judge")
    parser.add_argument("--no-judges", action="store_true", help="skip the judge-add part")
    parser.add_argument("--ks", nargs="+", type=int, default=list(KS[1:]), help="labelled texts per system")
    parser.add_argument("--no-match", action="store_true", help="skip labels_to_match_classical_at_40")
    parser.add_argument("--no-plan", action="store_true", help="skip the label planner's hit rate (issue 61)")
    parser.add_argument("--no-cje", action="store_true", help="skip CJE side by side (issue 61)")
    parser.add_argument("--plan-reps", type=int, default=200, help="draws per system and target width of the plan")
    parser.add_argument("--cje-reps", type=int, default=100, help="draws per system and k of CJE side by side")
    parser.add_argument("--assurance", type=float, default=0.9, help="the plan's assurance (conf/labels plan)")
    parser.add_argument(
        "--judge-models",
        nargs="+",
        default=["default"],
        choices=["default", "paper", "ordinal", "combined"],
        help="conf/model/ options of the judge-add part (the first fills judge_add, all judge_add_by_model)",
    )
    parser.add_argument("--cache", default=str(ROOT / "outputs" / "labels"))
    parser.add_argument(
        "--out",
        default=None,
        help="result file (default: results/labels_dialsumm.json when --sets is dialsumm alone, else results/labels.json)",
    )
    args = parser.parse_args(argv)
    if args.reps < 1 or args.judges < 1 or args.draws < 1:
        raise InputError("--reps, --judges and --draws must be >= 1", column="--reps")
    if args.coverage is not None and not 0 < args.coverage < 1:
        raise InputError(f"--coverage must be in (0, 1), not {args.coverage}", column="--coverage")
    if args.out is None:
        args.out = str(OUT / ("labels_dialsumm.json" if args.sets == ["dialsumm"] else "labels.json"))
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    labels_conf = load_file(ROOT / "conf" / "labels" / "default.yaml")
    board_conf = load_file(ROOT / "conf" / "scoring" / "default.yaml")["leaderboard"]
    floor, alpha, small = (
        labels_conf["suggest"]["floor"],
        board_conf["alpha"] if args.coverage is None else 1 - args.coverage,
        board_conf.get("small_sample", "student"),
    )
    folders = {"llm_rubric_synthetic": args.llm_rubric, "dialsumm": args.dialsumm}
    sets = [s for s in args.sets if s not in folders or Path(folders[s]).is_dir()]
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    report: dict = {"intervals": {}, "labels_to_match_classical_at_40": {}, "judge_add": {}, "plan": {}, "cje": {}}
    started, version = time.perf_counter(), code_version()
    for name in sets:
        rubric, tables = load_set(name, args)
        texts = held_out_texts(name, rubric, tables, cache)
        t0 = time.perf_counter()
        figures, match = interval_figures(texts, args.reps, floor, alpha, small, 0, tuple(args.ks), not args.no_match)
        report["intervals"][name] = figures
        report["labels_to_match_classical_at_40"][name] = match
        print(f"{name}: intervals in {time.perf_counter() - t0:.0f} s", flush=True)
        shown = (*lab.METHODS, *LEVEL_METHODS)
        print(f"| {name} k | " + " | ".join(f"{m} cov / width / rms" for m in shown) + " |", flush=True)
        for k in args.ks:
            cells = [" / ".join(f"{figures[str(k)][m][c]:.3f}" for c in ("coverage", "width", "rms")) for m in shown]
            print(f"| {k} | " + " | ".join(cells) + " |")
            worst = ", ".join(f"{m} {figures[str(k)][m]['worst_system']}" for m in shown)
            print(f"  k={k} worst covered: {worst}", flush=True)
        for m in ("shift", "level"):
            row = figures["0"][m]
            print(
                f"k=0 {m}: coverage {row['coverage']:.3f} width {row['width']:.3f} rms {row['rms']:.3f},"
                f" missed {row['missed']}, errors "
                + ", ".join(f"{s} {v['mean_error']:+.2f}" for s, v in row["per_system"].items()),
                flush=True,
            )
        print(f"labels to match classical at 40: {match}", flush=True)
        t0 = time.perf_counter()
        report["plan"][name], report["cje"][name] = planning_figures(rubric, tables, texts, args, alpha, small)
        print_planning(name, report["plan"][name], report["cje"][name], time.perf_counter() - t0)
    if not args.no_judges:
        rubric, tables = load_set("simulated_shift", args)
        report["judge_add_by_model"] = {}
        for option in args.judge_models:
            figures = judge_add_figures(rubric, tables, args.judges, args.draws, labels_conf["judges"], option)
            report["judge_add_by_model"][option] = figures
            for k, v in figures.items():
                print(f"[{option}] judge add k={k}: " + ", ".join(f"{c} {x:.4f}" for c, x in v.items()), flush=True)
        report["judge_add"] = report["judge_add_by_model"][args.judge_models[0]]
    report["meta"] = {
        "model": {**model_settings(), "trainer": "conf/trainer/default.yaml"},
        "reps": args.reps,
        "floor": floor,
        "alpha": alpha,
        "coverage": 1 - alpha,
        "small_sample": small,
        "judges": args.judges,
        "draws": args.draws,
        "plan_reps": args.plan_reps,
        "cje_reps": args.cje_reps,
        "assurance": args.assurance,
        "cje_version": getattr(cje_module(), "__version__", None),
        "sets": sets,
        "seconds": time.perf_counter() - started,
        "cpus": os.cpu_count(),
    }
    if "dialsumm" in sets:
        report["meta"]["dialsumm"] = args.dialsumm
    write_result(report, args.out, version)
    print(f"written: {args.out} ({report['meta']['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
