"""Conformal intervals of the default model (issue 50): coverage and width against the published anchor.

    .venv/bin/python benchmarks/intervals.py [--parts dialsumm llmjudge llm_rubric] [--protocols random_halves systems]
                                             [--splits 30] [--coverage 0.9] [--llm-rubric-protocols holdout real_cv]

``random_halves`` is the protocol of Sheng et al. ("Analyzing Uncertainty of LLM-as-a-Judge", EMNLP 2025) on
DialSummEval coherence (``../shared/data/dialsumm``): 30 random 50/50 splits by text, the target the mean of the
three ratings, 90 % nominal. Each split trains ``model=auto`` with the shipped settings on one half through the
Python API users call (``AutoCalibrator(...).fit``, ``score_texts(..., coverage=)``) and scores the other half; the
interval of a text is its judge-free score's ``lo``/``hi`` over the three raters. Beside it: ridge on every source's
expected answers with split-conformal absolute residuals (the issue's reference), and the anchor's published rows.
``systems`` holds out one system at a time (``model=auto`` with inner folds by system) and reports pooled and
per-system coverage, the worst system named, and each held-out system's LLM-vs-human gap.
Writes ``benchmarks/results/intervals.json``.

The other parts (``--parts``; the default is ``dialsumm`` alone, the above) measure the (text, judge) answer
intervals of the main question (``with_intervals``) where groups of texts or judges are new or shifted:

- ``llmjudge``: the LLMJudge test split (``../shared/data/llmjudge-test``), imported and dealt into outer folds
  as ``benchmarks/ir_real.py`` does (``query_groups5``: 5 groups of queries, ``--seed``); each fold's
  ``model=auto`` (inner folds by query, as ir_real.py's ``model.auto.group=system``) is fitted on the other
  queries' passages and gives the held-out passages' intervals of the assessor's label; pooled coverage and
  width, and coverage per query (``by_query``).
- ``llm_rubric``: the LLM-Rubric dialogues (``../shared/data/llm-rubric``), Q0: ``holdout`` is Table 1's
  protocol (fitted on the synthetic dialogues, tested on the 223 real ones; inner folds by text, as train.py
  under ``protocol=holdout``), ``real_cv`` 5-fold CV by dialogue on the real ones (benchmarks/auto.py's
  ``llm_rubric_real_cv``); coverage per judge (``by_judge``) and per dialogue system (``by_system``), and the
  same model's intervals with each judge's own threshold (``coverage_by_judge``: ``coverage_by=judge``).

Per group: pairs, coverage, width, mean error (expected answer minus the observed one) and ``p_under``
(:func:`llmrubric.scoring.intervals.coverage_by_group`); ``share_under`` the share of groups covered below
``under`` (0.8), ``significant_under`` those with ``p_under`` < 0.05, ``worst`` the three least covered.
These parts write ``benchmarks/results/intervals_groups.json`` (with the DialSumm figures too where ``dialsumm``
is among ``--parts``).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from llmrubric.config import model_file  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, load_tables  # noqa: E402
from llmrubric.model.auto import AutoCalibrator  # noqa: E402
from llmrubric.model.core.threads import single_threaded  # noqa: E402
from llmrubric.scoring.intervals import coverage_by_group, pair_coverage, with_intervals  # noqa: E402
from llmrubric.scoring.scores import score_texts  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "dialsumm"
OUT = ROOT / "benchmarks" / "results" / "intervals.json"
OUT_GROUPS = ROOT / "benchmarks" / "results" / "intervals_groups.json"
LLMJUDGE = ROOT.parent / "shared" / "data" / "llmjudge-test"
LLM_RUBRIC = ROOT.parent / "shared" / "data" / "llm-rubric"
PARTS = ("dialsumm", "llmjudge", "llm_rubric")
LLM_RUBRIC_PROTOCOLS = ("holdout", "real_cv")
UNDER, WORST, SIGNIFICANT = 0.8, 3, 0.05  # a group "under" below 0.8; the worst three named; p_under < 0.05
PROB_FLOOR = 1e-12
QUESTION = "coherence"
ANCHOR = {  # Sheng et al. 2025, DialSummEval coherence, 90 %, 30 random 50/50 splits (the figures)
    "R2CCP (DeepSeek-R1-Distill-Qwen-32B)": {"coverage": 0.898, "width": 1.314},
    "LVD": {"coverage": 0.900, "width": 1.407},
    "ridge on all sources' expected answers, split conformal": {"coverage": 0.900, "width": 1.505},
}


def load(data: Path) -> tuple[Rubric, Tables]:
    rubric = Rubric.load(data / "rubric.yaml").with_main(QUESTION)
    return rubric, load_tables(data / "annotations.csv", data / "features.csv", rubric, texts=data / "texts.csv")


def observed_means(tables: Tables) -> pd.Series:  # noqa: F821
    ann = tables.annotations[tables.annotations.question_id == QUESTION]
    return ann.assign(v=ann.answer.astype(float)).groupby("text_id").v.mean()


def default_intervals(train: Tables, test: Tables, rubric: Rubric, coverage: float, seed: int, group: str) -> dict:
    """model=auto fitted on ``train``, the judge-free mean's interval on every text of ``test``."""
    start = time.perf_counter()
    model = AutoCalibrator(rubric, model_file("auto"), seed=seed, group=group).fit(train)
    seconds = time.perf_counter() - start
    scores = score_texts(model, test.features, test.texts, questions=[QUESTION], coverage=coverage).scores
    scores = scores.set_index("text_id").join(observed_means(test).rename("y"))
    inside = (scores.lo <= scores.y) & (scores.y <= scores.hi)
    return {
        "texts": scores.index.astype(str).tolist(),
        "system": scores.system_id.astype(str).tolist(),
        "inside": inside.astype(int).tolist(),
        "width": (scores.hi - scores.lo).tolist(),
        "error": (scores["mean"] - scores.y).tolist(),
        "weights": model.weights_,
        "fit_seconds": seconds,
    }


def ridge_split_conformal(train: Tables, test: Tables, coverage: float, seed: int) -> dict:
    """Ridge (penalty by CV) on every (source, question)'s expected answer, half of ``train`` to fit and half to
    calibrate the absolute residuals' conformal quantile."""
    from sklearn.linear_model import RidgeCV

    def design(tables: Tables):
        f = tables.features.assign(v=tables.features.option.astype(float) * tables.features.prob)
        g = f.groupby(["text_id", "source", "question_id"])
        expected = (g.v.sum() / g.prob.sum()).unstack(["source", "question_id"])
        return expected.fillna(expected.mean()), observed_means(tables)

    x_train, y_train = design(train)
    x_test, y_test = design(test)
    x_test = x_test.reindex(columns=x_train.columns).fillna(x_train.mean())
    ids = np.random.default_rng(seed).permutation(len(x_train))
    fit, cal = ids[: len(ids) // 2], ids[len(ids) // 2 :]
    model = RidgeCV(alphas=np.logspace(-3, 3, 13)).fit(x_train.iloc[fit], y_train.loc[x_train.index[fit]])
    residual = np.abs(model.predict(x_train.iloc[cal]) - y_train.loc[x_train.index[cal]].to_numpy())
    k = int(np.ceil(coverage * (len(residual) + 1)))
    q = np.sort(residual)[min(k, len(residual)) - 1]
    prediction = model.predict(x_test)
    y = y_test.loc[x_test.index].to_numpy()
    return {"coverage": float((np.abs(prediction - y) <= q).mean()), "width": float(2 * q)}


def random_half(job: tuple) -> dict:
    split, coverage, data = job
    single_threaded()
    rubric, tables = load(data)
    train, test = half_split(tables, split)
    out = default_intervals(train, test, rubric, coverage, split, "text")
    return {
        "split": split,
        "coverage": float(np.mean(out["inside"])),
        "width": float(np.mean(out["width"])),
        "rmse": float(np.sqrt(np.mean(np.square(out["error"])))),
        "weights": out["weights"],
        "fit_seconds": out["fit_seconds"],
        "ridge_split_conformal": ridge_split_conformal(train, test, coverage, split),
    }


def held_out_system(job: tuple) -> dict:
    system, coverage, data = job
    single_threaded()
    rubric, tables = load(data)
    systems = tables.texts.set_index("text_id").system_id.astype(str)
    train, test = tables.subset(systems.index[systems != system]), tables.subset(systems.index[systems == system])
    out = default_intervals(train, test, rubric, coverage, 0, "system")
    return {
        "system": system,
        "coverage": float(np.mean(out["inside"])),
        "width": float(np.mean(out["width"])),
        "mean_error": float(np.mean(out["error"])),
        "texts": len(out["inside"]),
        "weights": out["weights"],
        "fit_seconds": out["fit_seconds"],
    }


def summarise_halves(rows: list[dict]) -> dict:
    figures = lambda key, r: [x[key] for x in r]
    ridge = [r["ridge_split_conformal"] for r in rows]
    return {
        "splits": len(rows),
        "coverage": float(np.mean(figures("coverage", rows))),
        "coverage_sd": float(np.std(figures("coverage", rows), ddof=1)) if len(rows) > 1 else None,
        "width": float(np.mean(figures("width", rows))),
        "rmse": float(np.mean(figures("rmse", rows))),
        "fit_seconds": float(np.mean(figures("fit_seconds", rows))),
        "ridge_split_conformal": {
            "coverage": float(np.mean(figures("coverage", ridge))),
            "width": float(np.mean(figures("width", ridge))),
        },
        "per_split": rows,
    }


def summarise_systems(rows: list[dict]) -> dict:
    n = np.array([r["texts"] for r in rows])
    worst = min(rows, key=lambda r: r["coverage"])
    return {
        "pooled_coverage": float(np.average([r["coverage"] for r in rows], weights=n)),
        "width": float(np.average([r["width"] for r in rows], weights=n)),
        "worst_system": worst["system"],
        "worst_coverage": worst["coverage"],
        "per_system": {r["system"]: {k: v for k, v in r.items() if k != "system"} for r in rows},
    }


def answer_intervals(train: Tables, test: Tables, rubric: Rubric, coverage: float, seed: int, group: str) -> dict:
    """model=auto fitted on ``train``; each (text, judge) answer of the main question on ``test`` with its interval
    (:func:`pair_coverage`'s rows)."""
    start = time.perf_counter()
    model = AutoCalibrator(rubric, model_file("auto"), seed=seed, group=group).fit(train)
    seconds = time.perf_counter() - start
    main = rubric.main
    predicted = model.predict(test, questions=[main.id])
    by_judge = with_intervals(predicted, model, coverage, "judge")
    return {
        "pairs": pair_coverage(with_intervals(predicted, model, coverage), test.annotations, main),
        "pairs_by_judge": pair_coverage(by_judge, test.annotations, main),
        "weights": model.weights_,
        "inner_group": model.group,
        "calibration_pairs": len(model.conformal_.pairs),
        "fit_seconds": seconds,
    }


def pooled_figures(pairs: pd.DataFrame) -> dict:
    """Coverage, mean width and pair NLL of the answers' intervals in ``pairs``."""
    return {
        "pairs": int(len(pairs)),
        "coverage": float(pairs.inside.mean()),
        "width": float(pairs.width.mean()),
        "pair_nll": float(-np.log(np.clip(pairs.p_answer, PROB_FLOOR, 1)).mean()),
    }


def group_figures(pairs: pd.DataFrame, by: str, nominal: float) -> dict:
    """Coverage per value of column ``by`` (:func:`coverage_by_group`): the number of groups, the share covered
    below :data:`UNDER`, those under-covered beyond chance (``p_under`` < :data:`SIGNIFICANT`), the worst named,
    and every group's figures (ascending coverage)."""
    table = coverage_by_group(pairs, by, nominal)
    return {
        "groups": int(len(table)),
        "under": UNDER,
        "share_under": float((table.coverage < UNDER).mean()),
        "significant_under": int((table.p_under < SIGNIFICANT).sum()),
        "worst": [str(g) for g in table.index[:WORST]],
        "min_coverage": float(table.coverage.min()),
        "max_coverage": float(table.coverage.max()),
        "per_group": {
            str(g): {"pairs": int(r.pairs), **{k: float(r[k]) for k in ("coverage", "width", "mean_error", "p_under")}}
            for g, r in table.iterrows()
        },
    }


def llmjudge_fold(job: tuple) -> dict:
    """One outer fold of the LLMJudge split: ``model=auto`` on the other queries, the held-out passages' intervals."""
    fold, test_ids, coverage, folder, seed = job
    single_threaded()
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "relevance.yaml")
    tables = load_tables(
        folder / "annotations.parquet", folder / "summaries.parquet", rubric, texts=folder / "texts.parquet"
    )
    held = set(test_ids)
    train = tables.subset([t for t in tables.text_ids if t not in held])
    test = tables.subset(sorted(held))
    out = answer_intervals(train, test, rubric, coverage, seed, "system")
    query = test.texts.set_index("text_id").system_id.astype(str)
    out["pairs"] = out["pairs"].assign(query=out["pairs"].text_id.map(query).to_numpy())
    return {"fold": fold, **out}


def llmjudge_part(data: Path, coverage: float, seed: int, pool) -> dict:
    """``llmjudge``: ir_real.py's import and ``query_groups5`` folds, each fold's intervals, pooled and by query."""
    import tempfile

    from benchmarks import ir_real

    with tempfile.TemporaryDirectory(prefix="intervals-llmjudge-") as tmp:
        folder = Path(tmp)
        ir_real.import_split(data, folder)
        split = ir_real.read_split(folder)
        folds = ir_real.outer_folds(split, "query_groups5", seed)
        jobs = [(int(k), split.text_ids[folds == k].tolist(), coverage, folder, seed) for k in sorted(set(folds))]
        runs = list(pool.map(llmjudge_fold, jobs))
    pairs = pd.concat([r["pairs"] for r in runs], ignore_index=True)
    return {
        "protocol": "query_groups5",
        "seed": seed,
        "folds": len(runs),
        **pooled_figures(pairs),
        "by_query": group_figures(pairs, "query", coverage),
        "per_fold": {
            str(r["fold"]): {
                **pooled_figures(r["pairs"]),
                "queries": sorted(r["pairs"]["query"].unique().tolist()),
                "calibration_pairs": r["calibration_pairs"],
                "weights": r["weights"],
                "fit_seconds": r["fit_seconds"],
            }
            for r in runs
        },
    }


def llm_rubric_split(data: Path, protocol: str, fold: int | None) -> tuple[Rubric, Tables, Tables]:
    """The rubric, training and test dialogues of ``holdout`` (synthetic → real) or fold ``fold`` of ``real_cv``."""
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    real = llm_rubric.load(str(data), "real", rubric)
    if protocol == "holdout":
        return rubric, llm_rubric.load(str(data), "synthetic", rubric), real
    folds = text_folds(real.text_ids, 5, 0)
    train, test = (real.subset(folds.text_id[(folds.fold == fold) == held]) for held in (False, True))
    return rubric, train, test


def half_split(tables: Tables, split: int) -> tuple[Tables, Tables]:
    """Random 50/50 split ``split`` of ``tables`` by text (seeded by ``split``)."""
    ids = np.array(sorted(tables.text_ids))
    perm = np.random.default_rng(split).permutation(len(ids))
    return tables.subset(ids[perm[: len(ids) // 2]]), tables.subset(ids[perm[len(ids) // 2 :]])


def llm_rubric_fold(job: tuple) -> dict:
    """``holdout`` (fold None: synthetic → real) or one fold of ``real_cv`` of the LLM-Rubric dialogues."""
    protocol, fold, coverage, data = job
    single_threaded()
    rubric, train, test = llm_rubric_split(data, protocol, fold)
    out = answer_intervals(train, test, rubric, coverage, 0, "text")
    system = test.texts.set_index("text_id").system_id.astype(str)
    for key in ("pairs", "pairs_by_judge"):
        out[key] = out[key].assign(system=out[key].text_id.map(system).to_numpy())
    return {"protocol": protocol, "fold": fold, **out}


def llm_rubric_part(data: Path, coverage: float, protocols: list[str], pool) -> dict:
    """``llm_rubric``: each protocol's intervals of Q0, pooled, by judge and by dialogue system."""
    jobs = [(p, None, coverage, data) for p in protocols if p == "holdout"]
    jobs += [(p, k, coverage, data) for p in protocols if p == "real_cv" for k in range(5)]
    runs = list(pool.map(llm_rubric_fold, jobs))
    out = {}
    for protocol in protocols:
        mine = [r for r in runs if r["protocol"] == protocol]
        pairs = pd.concat([r["pairs"] for r in mine], ignore_index=True)
        fits = {
            ("all" if r["fold"] is None else str(r["fold"])): {
                "calibration_pairs": r["calibration_pairs"],
                "weights": r["weights"],
                "fit_seconds": r["fit_seconds"],
            }
            for r in mine
        }
        judged = pd.concat([r["pairs_by_judge"] for r in mine], ignore_index=True)
        out[protocol] = {
            **pooled_figures(pairs),
            "by_judge": group_figures(pairs, "judge_id", coverage),
            "by_system": group_figures(pairs, "system", coverage),
            "coverage_by_judge": {**pooled_figures(judged), "by_judge": group_figures(judged, "judge_id", coverage)},
            "fits": fits,
        }
    return out


def print_groups(name: str, figures: dict, label: str) -> None:
    g = figures[label]
    print(
        f"{name}: pooled coverage {figures['coverage']:.3f} width {figures['width']:.3f} over {figures['pairs']} pairs;"
        f" {label}: {g['groups']} groups, {g['share_under']:.0%} under {g['under']},"
        f" {g['significant_under']} under beyond chance (p < {SIGNIFICANT})"
    )
    for key in g["worst"]:
        row = g["per_group"][key]
        print(
            f"  worst {key}: coverage {row['coverage']:.3f} ({row['pairs']} pairs) width {row['width']:.3f}"
            f" mean error {row['mean_error']:+.3f} p_under {row['p_under']:.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=["dialsumm"], choices=PARTS)
    parser.add_argument(
        "--protocols", nargs="+", default=["random_halves", "systems"], choices=["random_halves", "systems"]
    )
    parser.add_argument("--splits", type=int, default=30, help="random 50/50 splits (the anchor's 30)")
    parser.add_argument("--coverage", type=float, default=0.9)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--llmjudge-data", type=Path, default=LLMJUDGE)
    parser.add_argument("--llm-rubric-data", type=Path, default=LLM_RUBRIC)
    parser.add_argument(
        "--llm-rubric-protocols", nargs="+", default=list(LLM_RUBRIC_PROTOCOLS), choices=LLM_RUBRIC_PROTOCOLS
    )
    parser.add_argument("--seed", type=int, default=0, help="the grouping of the LLMJudge queries, and its models'")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: intervals.json for dialsumm alone, else intervals_groups.json"
    )
    args = parser.parse_args(argv)
    out = args.out or (OUT if args.parts == ["dialsumm"] else OUT_GROUPS)
    version, started = code_version(), time.perf_counter()
    report: dict = {"meta": {"data": str(args.data), "question": QUESTION, "nominal": args.coverage}, "anchor": ANCHOR}
    if args.parts != ["dialsumm"]:
        command = "benchmarks/intervals.py " + " ".join(argv if argv is not None else sys.argv[1:])
        report = {"meta": {"parts": args.parts, "nominal": args.coverage, "command": command}}
        if "dialsumm" in args.parts:
            report["meta"].update(data=str(args.data), question=QUESTION)
            report["anchor"] = ANCHOR
    with ProcessPoolExecutor(args.workers) as pool:
        if "dialsumm" in args.parts:
            dialsumm(args, report, pool)
        if "llmjudge" in args.parts:
            start = time.perf_counter()
            report["llmjudge"] = llmjudge_part(args.llmjudge_data, args.coverage, args.seed, pool)
            report["meta"].update(llmjudge_data=str(args.llmjudge_data), llmjudge_seconds=time.perf_counter() - start)
            print_groups("LLMJudge, 5 query groups", report["llmjudge"], "by_query")
        if "llm_rubric" in args.parts:
            start = time.perf_counter()
            report["llm_rubric"] = llm_rubric_part(args.llm_rubric_data, args.coverage, args.llm_rubric_protocols, pool)
            report["meta"].update(
                llm_rubric_data=str(args.llm_rubric_data), llm_rubric_seconds=time.perf_counter() - start
            )
            for protocol, figures in report["llm_rubric"].items():
                print_groups(f"LLM-Rubric Q0, {protocol}", figures, "by_judge")
                print_groups(f"LLM-Rubric Q0, {protocol}, coverage_by=judge", figures["coverage_by_judge"], "by_judge")
                print_groups(f"LLM-Rubric Q0, {protocol}", figures, "by_system")
    report["meta"]["seconds"] = time.perf_counter() - started
    write_result(report, out, version)
    print(f"written to {out}")
    return 0


def dialsumm(args, report: dict, pool) -> None:
    """The DialSumm protocols (``--protocols``) into ``report``."""
    if "random_halves" in args.protocols:
        jobs = [(s, args.coverage, args.data) for s in range(args.splits)]
        report["random_halves"] = summarise_halves(list(pool.map(random_half, jobs)))
        r = report["random_halves"]
        print(
            f"random halves x{r['splits']}: model=auto coverage {r['coverage']:.3f} width {r['width']:.3f};"
            f" ridge + split conformal {r['ridge_split_conformal']['coverage']:.3f} / {r['ridge_split_conformal']['width']:.3f}"
        )
        for name, row in ANCHOR.items():
            print(f"  anchor {name}: {row['coverage']:.3f} / {row['width']:.3f}")
    if "systems" in args.protocols:
        _, tables = load(args.data)
        systems = sorted(tables.texts.system_id.astype(str).unique())
        report["systems"] = summarise_systems(
            list(pool.map(held_out_system, [(s, args.coverage, args.data) for s in systems]))
        )
        r = report["systems"]
        print(
            f"leave one system out: pooled coverage {r['pooled_coverage']:.3f} width {r['width']:.3f};"
            f" worst {r['worst_system']} {r['worst_coverage']:.3f}"
        )
        for name, row in r["per_system"].items():
            print(
                f"  {name}: coverage {row['coverage']:.3f} width {row['width']:.3f} mean error {row['mean_error']:+.3f}"
            )


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
