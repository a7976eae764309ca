"""Conformal intervals of the default model (issue 50): coverage and width against the published anchor.

    .venv/bin/python benchmarks/intervals.py [--protocols random_halves systems] [--splits 30] [--coverage 0.9]

``random_halves`` is the protocol of Sheng et al. ("Analyzing Uncertainty of LLM-as-a-Judge", EMNLP 2025) on
DialSummEval coherence (``../shared/data/dialsumm``): 30 random 50/50 splits by text, the target the mean of the
three ratings, 90 % nominal. Each split trains ``model=auto`` with the shipped settings on one half through the
Python API users call (``AutoCalibrator(...).fit``, ``score_texts(..., coverage=)``) and scores the other half; the
interval of a text is its judge-free score's ``lo``/``hi`` over the three raters. Beside it: ridge on every source's
expected answers with split-conformal absolute residuals (the issue's reference), and the anchor's published rows.
``systems`` holds out one system at a time (``model=auto`` with inner folds by system) and reports pooled and
per-system coverage, the worst system named, and each held-out system's LLM-vs-human gap.
Writes ``benchmarks/results/intervals.json``.
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
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables, load_tables  # noqa: E402
from llmrubric.model.auto import AutoCalibrator  # noqa: E402
from llmrubric.model.core.threads import single_threaded  # noqa: E402
from llmrubric.scoring.scores import score_texts  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "dialsumm"
OUT = ROOT / "benchmarks" / "results" / "intervals.json"
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
    ids = np.array(sorted(tables.text_ids))
    perm = np.random.default_rng(split).permutation(len(ids))
    train, test = tables.subset(ids[perm[: len(ids) // 2]]), tables.subset(ids[perm[len(ids) // 2 :]])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--protocols", nargs="+", default=["random_halves", "systems"], choices=["random_halves", "systems"]
    )
    parser.add_argument("--splits", type=int, default=30, help="random 50/50 splits (the anchor's 30)")
    parser.add_argument("--coverage", type=float, default=0.9)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    version, started = code_version(), time.perf_counter()
    report: dict = {"meta": {"data": str(args.data), "question": QUESTION, "nominal": args.coverage}, "anchor": ANCHOR}
    with ProcessPoolExecutor(args.workers) as pool:
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
    report["meta"]["seconds"] = time.perf_counter() - started
    write_result(report, args.out, version)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
