"""Calibrated scores of systems no model saw (issue 14): leave one system out, per pair and per system.

    .venv/bin/python benchmarks/transfer.py [--seeds 1] [--sets simulated_shift llm_rubric_synthetic]
                                            [--data DIR] [--llm-rubric ROOT] [--workers 2]

Sets: ``simulated_shift`` (:func:`llmrubric.data.simulate.simulate_shift`, seed 0: 12 systems, one much
better and one much worse than the rest, three LLM sources), ``llm_rubric_synthetic`` (DS1..DS5 of
the release at ``--llm-rubric``) and, with ``--data DIR``, the canonical tables in DIR
(``annotations``, ``features``, ``texts`` with ``system_id``; .csv/.tsv/.parquet/.jsonl) under
``--rubric``. Each system is predicted by models trained on the others (``protocol=systems``).

Methods: ``default``, ``ordinal``, ``combined`` (the calibrator with ``conf/model/default.yaml``,
``ordinal.yaml``, ``combined.yaml`` and ``conf/trainer/default.yaml``), ``ridge_judge``,
``mean_of_sources`` (``expected_llm``: the mean of the sources' expected answers) and
``best_source`` (``expected_llm/<source>`` of the source whose expected answers correlate best
with the human answers of the training systems). Learned methods run ``--seeds`` seeds and
their figures are averaged.

Per pair of the main question: Pearson and NLL. Per system (mean over its pairs of the expected
answer): absolute error against the human mean (``system_mae``), Kendall and Spearman over
systems, the shift interval (:func:`llmrubric.evaluation.transfer.shift_intervals`) with its coverage of
the human mean and its width, the PPI interval with k = 5, 10, 20 human labels of the held-out
system (``--draws`` random draws each; k = 0 is the shift interval) and, for contrast, the
sampling-only interval (``coverage_sampling``: mean ± 1.96 standard errors). The system Kendall
gets a 95 % interval from resampling each system's texts (``system_kendall_ci``, 1,000 draws) and,
draw by draw, its difference from ``mean_of_sources``' (``system_kendall_minus_mean_of_sources``:
mean, interval, share of draws with the method at least as good). In those shift
intervals each system's interval rests on the other systems' errors from the same
leave-one-out run, whose models saw the evaluated system; ``--nested`` removes that leak: for
each system s a leave-one-out run over the other systems alone gives their errors, and s's
interval uses those (``coverage_nested``, ``width_nested``; K + 1 times the training).

Under leave one system out each system is scored by a different model, whose training systems
are all the others: a held-out bad system leaves better systems to train on, so every model's
level moves against the quality of the system it scores (a constant predictor, the training
mean, ranks systems with equal numbers of pairs exactly backwards). ``--two-out`` measures the
ranking without that: every pair of systems is held out together and scored by one model trained
on the rest (``system_kendall_two_out``, Kendall's tau-a over the pairs; K(K-1)/2 fits). Writes
``benchmarks/results/transfer.json`` (``{set: {method: figures}}`` plus ``meta``, which names the
calibrator head with the lowest pair NLL of each set: the choice among them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, exit_code, llm_rubric_default, write_result  # noqa: E402

from llmrubric import NetworkCalibrator  # noqa: E402
from llmrubric.config import group  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.simulate import simulate_shift  # noqa: E402
from llmrubric.data.splits import system_folds  # noqa: E402
from llmrubric.evaluation.metrics import evaluate  # noqa: E402
from llmrubric.evaluation.transfer import coverage, pair_scores, ppi_intervals, shift_intervals, system_means  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402
from llmrubric.io.files import write_json  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import load_tables  # noqa: E402
from llmrubric.model.families.baselines import ExpectedLLM, RidgeJudge, main_blocks  # noqa: E402
from llmrubric.scoring.leaderboard import rms, shift_half_width  # noqa: E402

METHODS = ("default", "ordinal", "combined", "ridge_judge", "mean_of_sources", "best_source")
HEADS = ("default", "ordinal", "combined")
LEARNED = HEADS  # methods whose figures depend on the seed
KS = (0, 5, 10, 20)
KENDALL_DRAWS = 1000  # text resamples per system for the system Kendall's bootstrap
SUFFIXES = (".csv", ".tsv", ".parquet", ".jsonl")


def config(name: str, option: str) -> dict:
    return group(name, option)


def find_table(directory: Path, stem: str) -> Path:
    found = [directory / f"{stem}{s}" for s in SUFFIXES if (directory / f"{stem}{s}").is_file()]
    if len(found) != 1:
        raise InputError(
            f"--data needs exactly one {stem} table ({'/'.join(stem + s for s in SUFFIXES)}), found {[p.name for p in found]}",
            file=str(directory),
        )
    return found[0]


def load_set(name: str, args) -> tuple:
    """(rubric, tables) of a set by name."""
    if name == "simulated_shift":
        rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
        return rubric, simulate_shift(0, rubric=rubric)[0]
    if name == "llm_rubric_synthetic":
        rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
        return rubric, llm_rubric.load(args.llm_rubric, "synthetic", rubric)
    directory = Path(args.data)
    rubric = Rubric.load(args.rubric)
    return rubric, load_tables(
        find_table(directory, "annotations"), find_table(directory, "features"), rubric, find_table(directory, "texts")
    )


def worker_set(set_name: str, args) -> tuple:
    """(rubric, tables, leave-one-system-out folds) of a set, in a worker process that keeps quiet."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rubric, tables = load_set(set_name, args)
    return rubric, tables, system_folds(tables)


def job_call(job: tuple) -> tuple:
    """(function, its arguments but ``args``) of a job: (set, method, seed), (set, method, seed,
    "nested", system) or (set, method, seed, "two_out")."""
    if len(job) == 3:
        return (run_one, *job)
    return (nested_errors, *job[:3], job[4]) if job[3] == "nested" else (two_out_means, *job[:3])


def held_out_predictions(method: str, rubric: Rubric, tables, folds: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Main-question predictions of every system by a model that did not see it."""
    splits = [
        (tables.subset(folds.text_id[folds.fold != k]), tables.subset(folds.text_id[folds.fold == k]))
        for k in sorted(folds.fold.unique())
    ]
    return pd.concat(split_predictions(method, rubric, splits, seed), ignore_index=True)


def split_predictions(method: str, rubric: Rubric, splits: list[tuple], seed: int) -> list[pd.DataFrame]:
    """Per (train, test) split: the main-question predictions of test by a model fitted on train
    (the calibrator heads of all splits are fitted together)."""
    if method in HEADS:
        models = NetworkCalibrator.fit_many(
            [NetworkCalibrator(rubric, config("model", method), config("trainer", "default"), seed) for _ in splits],
            [tr for tr, _ in splits],
        )
        return [m.predict(te, questions=[rubric.main.id]) for m, (_, te) in zip(models, splits)]
    parts = []
    for train, test in splits:
        if method == "ridge_judge":
            model = RidgeJudge(rubric, seed).fit(train)
        elif method == "mean_of_sources":
            model = ExpectedLLM(rubric, seed)
        else:
            model = max(
                (ExpectedLLM(rubric, seed, b.source) for b in main_blocks(train.features, rubric)),
                key=lambda m: _pearson(m, train, rubric),
            )
        parts.append(model.predict(test))
    return parts


def two_out_means(set_name: str, method: str, seed: int, args) -> dict:
    """Every pair of systems held out together: both system means predicted by one model trained
    on all the other systems, so the pair's order does not depend on which systems trained it."""
    rubric, tables, folds = worker_set(set_name, args)
    pairs = list(itertools.combinations(sorted(folds.system_id.unique()), 2))
    held = [folds.system_id.isin(pair) for pair in pairs]
    splits = [(tables.subset(folds.text_id[~h]), tables.subset(folds.text_id[h])) for h in held]
    start = time.perf_counter()
    preds = split_predictions(method, rubric, splits, seed)
    systems = folds.set_index("text_id").system_id
    out = []
    for (s, t), (_, test), pred in zip(pairs, splits, preds):
        means = system_means(pair_scores(pred, test.annotations, rubric.main, systems)).predicted
        out.append([s, t, float(means[s]), float(means[t])])
    return {"pairs": out, "seconds": time.perf_counter() - start}


def with_two_out(result: dict, two_out: dict) -> dict:
    """``result`` with ``system_kendall_two_out``: Kendall's tau-a over the pairs of systems between
    the human means and the means predicted with both systems held out (:func:`two_out_means`)."""
    human = {s: r["human"] for s, r in result["systems"].items()}
    signs = [np.sign(human[s] - human[t]) * np.sign(ps - pt) for s, t, ps, pt in two_out["pairs"]]
    return {**result, "system_kendall_two_out": float(np.mean(signs)), "seconds_two_out": two_out["seconds"]}


def _pearson(model, tables, rubric) -> float:
    value = evaluate(model.predict(tables), tables.annotations, rubric.main, per_judge=False)["pearson"]
    return -math.inf if math.isnan(value) else value


def kendall_draws(pairs: pd.DataFrame, draws: int, seed: int = 0) -> list[float]:
    """System Kendall (human vs predicted system means) over ``draws`` resamples of the texts within
    each system, a text's pairs kept together. Texts are taken in sorted order, so every method
    scored on the same texts sees the same resamples for a seed: the draws of two methods pair up."""
    per_text = (
        pairs.groupby(["system_id", "text_id"])
        .agg(y=("y", "sum"), yhat=("yhat", "sum"), n=("y", "size"))
        .reset_index()
        .sort_values(["system_id", "text_id"])
    )
    y, yhat, n = (per_text[c].to_numpy(float) for c in ("y", "yhat", "n"))
    rows = [np.flatnonzero(per_text.system_id.to_numpy() == s) for s in per_text.system_id.unique()]
    rng, out = np.random.default_rng(seed), []
    for _ in range(draws):
        picks = [rng.choice(r, len(r)) for r in rows]
        human = [y[p].sum() / n[p].sum() for p in picks]
        predicted = [yhat[p].sum() / n[p].sum() for p in picks]
        out.append(float(stats.kendalltau(human, predicted)[0]))
    return out


def kendall_comparison(report: dict, reference: str = "mean_of_sources") -> None:
    """Per method of each set in ``report``: the 95 % bootstrap interval of its system Kendall and,
    paired draw by draw, of its difference from ``reference``'s, with the share of draws where it is
    at least ``reference``'s; the draws themselves are dropped."""
    for methods in report.values():
        base = methods.get(reference, {}).get("kendall_draws")
        for figures in methods.values():
            draws = figures.pop("kendall_draws", None)
            if draws is None:  # a result cached by an older version of this script
                continue
            draws = np.asarray(draws)
            figures["system_kendall_ci"] = np.nanquantile(draws, [0.025, 0.975]).tolist()
            if base is not None:
                diff = draws - np.asarray(base)
                figures[f"system_kendall_minus_{reference}"] = {
                    "mean": float(np.nanmean(diff)),
                    "ci": np.nanquantile(diff, [0.025, 0.975]).tolist(),
                    "share_at_least": float(np.mean(diff >= 0)),
                }


def figures(pred: pd.DataFrame, rubric: Rubric, tables, folds: pd.DataFrame, draws: int, seed: int) -> dict:
    pair = evaluate(pred, tables.annotations, rubric.main, per_judge=False)
    pairs = pair_scores(pred, tables.annotations, rubric.main, folds.set_index("text_id").system_id)
    means = shift_intervals(system_means(pairs))
    cov, width = coverage(means)
    se = pairs.groupby("system_id").yhat.agg(lambda v: v.std(ddof=1) / math.sqrt(len(v))).reindex(means.index)
    sampling = means.assign(low=means.predicted - 1.96 * se, high=means.predicted + 1.96 * se)
    ppi = {str(k): (cov, width) if k == 0 else coverage(ppi_intervals(pairs, k, draws, seed)) for k in KS}
    return {
        "pair_pearson": pair["pearson"],
        "pair_nll": pair["nll"],
        "system_kendall": float(stats.kendalltau(means.human, means.predicted)[0]),
        "system_spearman": float(stats.spearmanr(means.human, means.predicted)[0]),
        "system_mae": float((means.predicted - means.human).abs().mean()),
        "coverage": cov,
        "width": width,
        "coverage_ppi": {k: v[0] for k, v in ppi.items()},
        "width_ppi": {k: v[1] for k, v in ppi.items()},
        "coverage_sampling": coverage(sampling)[0],
        "kendall_draws": kendall_draws(pairs, KENDALL_DRAWS),
        "systems": {
            s: {"human": r.human, "predicted": r.predicted, "low": r.low, "high": r.high, "pairs": int(r.pairs)}
            for s, r in means.iterrows()
        },
    }


def nested_errors(set_name: str, method: str, seed: int, system: str, args) -> dict:
    """The shift errors (predicted − human system mean) of every system but ``system``, each from a
    model trained on neither it nor ``system``: what a user without ``system`` would measure."""
    rubric, tables, folds = worker_set(set_name, args)
    inner = tables.subset(folds.text_id[folds.system_id != system])
    inner_folds = system_folds(inner)
    start = time.perf_counter()
    pred = held_out_predictions(method, rubric, inner, inner_folds, seed)
    means = system_means(pair_scores(pred, inner.annotations, rubric.main, inner_folds.set_index("text_id").system_id))
    return {"errors": (means.predicted - means.human).to_dict(), "seconds": time.perf_counter() - start}


def with_nested(result: dict, nested: dict[str, dict]) -> dict:
    """``result`` (of :func:`run_one`) with the nested shift intervals: each system's prediction ±
    the half-width of the errors that ``nested[system]`` measured without it."""
    systems = dict(result["systems"])
    for name, r in systems.items():
        half = shift_half_width(list(nested[name]["errors"].values()))
        systems[name] = {**r, "low_nested": r["predicted"] - half, "high_nested": r["predicted"] + half}
    covered = [r["low_nested"] <= r["human"] <= r["high_nested"] for r in systems.values()]
    widths = [r["high_nested"] - r["low_nested"] for r in systems.values()]
    return {
        **result,
        "coverage_nested": float(np.mean(covered)),
        "width_nested": float(np.mean(widths)),
        "systems": systems,
        "seconds_nested": float(sum(v["seconds"] for v in nested.values())),
    }


def describe(job: tuple, result: dict) -> str:
    """One progress line of a finished job: (set, method, seed), (set, method, seed, "nested", system)
    or (set, method, seed, "two_out")."""
    if len(job) == 3:
        return "{} {} seed {}: pair NLL {pair_nll:.3f}, system Kendall {system_kendall:.3f}, coverage {coverage:.2f} ({seconds:.0f}s)".format(
            *job, **result
        )
    if job[3] == "two_out":
        return f"{job[0]} {job[1]} seed {job[2]}: {len(result['pairs'])} pairs of systems held out together ({result['seconds']:.0f}s)"
    spread = rms(list(result["errors"].values()))
    return f"{job[0]} {job[1]} seed {job[2]} without {job[4]}: RMS error of the others {spread:.3f} ({result['seconds']:.0f}s)"


def finite(value):
    """``value`` with every non-finite float replaced by None (valid JSON: null)."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_one(set_name: str, method: str, seed: int, args) -> dict:
    rubric, tables, folds = worker_set(set_name, args)
    start = time.perf_counter()
    pred = held_out_predictions(method, rubric, tables, folds, seed)
    out = figures(pred, rubric, tables, folds, args.draws, seed)
    out["seconds"] = time.perf_counter() - start
    return out


def average(runs: list[dict]) -> dict:
    """Figures averaged over seeds (per-system values of the first seed)."""
    out = {}
    for key, value in runs[0].items():
        if key == "kendall_draws":  # dropped if a run cached by an older version of this script lacks them
            if all(key in r for r in runs):
                out[key] = np.mean([r[key] for r in runs], axis=0).tolist()
        elif isinstance(value, dict) and key != "systems":
            out[key] = {k: float(np.mean([r[key][k] for r in runs])) for k in value}
        elif key == "systems":
            out[key] = value
        else:
            out[key] = float(np.mean([r[key] for r in runs]))
    out["seeds"] = len(runs)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; bad input is one line on stderr and exit code 2."""
    return exit_code(run, argv)


def run(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sets",
        nargs="*",
        default=["simulated_shift", "llm_rubric_synthetic"],
        choices=["simulated_shift", "llm_rubric_synthetic"],
    )
    parser.add_argument("--data", default=None, help="a directory of canonical tables (set name: the directory's name)")
    parser.add_argument(
        "--rubric", default=str(ROOT / "conf" / "rubric" / "llm_rubric.yaml"), help="the rubric of --data"
    )
    parser.add_argument("--llm-rubric", default=llm_rubric_default())
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--draws", type=int, default=50, help="random draws of the k labelled pairs per system")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "transfer.json"))
    parser.add_argument(
        "--nested",
        nargs="*",
        choices=list(METHODS),
        help="also the nested shift intervals of these methods (all with no name): no system's interval uses a model "
        "that saw it; K + 1 times the training",
    )
    parser.add_argument(
        "--two-out",
        nargs="*",
        choices=list(METHODS),
        help="also the system Kendall with every pair of systems held out together and scored by one model "
        "(these methods, all with no name): K(K-1)/2 more fits",
    )
    parser.add_argument(
        "--cache",
        default=str(ROOT / "outputs" / "transfer"),
        help="each finished (set, method, seed) is kept here and not rerun (resume); delete it after changing code",
    )
    args = parser.parse_args(argv)
    nested = [] if args.nested is None else [m for m in args.methods if m in args.nested or not args.nested]
    two_out = [] if args.two_out is None else [m for m in args.methods if m in args.two_out or not args.two_out]
    if args.seeds < 1 or args.draws < 1:
        raise InputError(f"--seeds and --draws must be >= 1 (got {args.seeds}, {args.draws})", column="--seeds/--draws")
    sets = list(args.sets)
    if "llm_rubric_synthetic" in sets and not Path(args.llm_rubric).is_dir():
        print(f"skipping llm_rubric_synthetic: no release at {args.llm_rubric}", flush=True)
        sets.remove("llm_rubric_synthetic")
    if args.data:
        sets.append("data")
    systems_of = {}
    for name in sets:  # bad input fails here, before any training
        rubric, tables = load_set(name, args)
        folds = system_folds(tables)
        systems_of[name] = sorted(folds.system_id.unique())
        pairs = (
            tables.annotations[tables.annotations.question_id == rubric.main.id][["text_id"]]
            .merge(folds, on="text_id")
            .groupby("system_id")
            .size()
        )
        if pairs.min() < max(KS):
            raise InputError(
                f"k={max(KS)} human labels requested but system {pairs.idxmin()!r} has only {int(pairs.min())} annotated pairs of {rubric.main.id}",
                column="k",
            )
        if (nested or two_out) and len(systems_of[name]) < 3:
            raise InputError(
                f"--nested and --two-out need at least 3 systems (training on the others), {name} has {len(systems_of[name])}",
                column="system_id",
            )
    version = code_version()  # the code that runs: HEAD when the run starts
    start = time.perf_counter()
    jobs = [(s, m, seed) for s in sets for m in args.methods for seed in (range(args.seeds) if m in LEARNED else [0])]
    extra_jobs = [(*job, "nested", system) for job in jobs if job[1] in nested for system in systems_of[job[0]]]
    extra_jobs += [(*job, "two_out") for job in jobs if job[1] in two_out]
    label = lambda s: Path(args.data).name if s == "data" else s
    cache = lambda job: Path(args.cache) / ("-".join([label(job[0]), *map(str, job[1:])]) + ".json")
    with ProcessPoolExecutor(args.workers) as pool:
        submit = lambda job: pool.submit(*job_call(job), args)
        futures = {job: None if cache(job).is_file() else submit(job) for job in jobs + extra_jobs}
        results = {}
        for i, (job, future) in enumerate(futures.items(), 1):
            if future is None:
                results[job] = r = json.loads(cache(job).read_text())
            else:
                results[job] = r = future.result()
                write_json(r, cache(job))
            print(f"[{i}/{len(futures)}] {describe(job, r)}{' (cached)' if future is None else ''}", flush=True)
    for job in jobs:
        if job[1] in nested:
            results[job] = with_nested(
                results[job], {n[4]: results[n] for n in extra_jobs if n[:3] == job and n[3] == "nested"}
            )
        if job[1] in two_out:
            results[job] = with_two_out(results[job], results[(*job, "two_out")])
    report = {}
    for s in sets:
        report[label(s)] = {m: average([results[j] for j in jobs if j[:2] == (s, m)]) for m in args.methods}
    kendall_comparison(report)
    heads = [m for m in HEADS if m in args.methods]
    report["meta"] = {
        "seconds": time.perf_counter() - start,
        "seeds": args.seeds,
        "draws": args.draws,
        "ks": list(KS),
        "nested": nested,
        "two_out": two_out,
        "lowest_nll_head": {k: min(heads, key=lambda m: v[m]["pair_nll"]) for k, v in report.items() if heads},
    }
    write_result(finite(report), args.out, version)
    cols = ("pair_pearson", "pair_nll", "system_kendall", "system_spearman", "system_mae", "coverage", "width")
    cols += ("coverage_nested", "width_nested") if nested else ()
    cols += ("system_kendall_two_out",) if two_out else ()
    for key in report:
        if key == "meta":
            continue
        print(
            f"\n{key} (leave one system out)\n| method | "
            + " | ".join(cols)
            + " | PPI coverage k=5/10/20 |\n"
            + "|---" * (len(cols) + 2)
            + "|"
        )
        for m, e in report[key].items():
            ppi = "/".join(f"{e['coverage_ppi'][str(k)]:.2f}" for k in KS[1:])
            print(f"| {m} | " + " | ".join(f"{e[c]:.3f}" if c in e else "—" for c in cols) + f" | {ppi} |")
    print(f"\nwritten to {args.out} in {report['meta']['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
