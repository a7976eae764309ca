"""System leaderboards on the LLM-Rubric release (paper Tables 4–5), calibrated vs raw LLM.

    .venv/bin/python benchmarks/leaderboard.py [--seeds 5] [--bootstrap 1000] [--data ../shared/data/llm-rubric]
    .venv/bin/python benchmarks/leaderboard.py --build-only [--repeats 3] [--dialsumm ../shared/data/dialsumm]

- real: train on all synthetic dialogues, score the real DS1–DS3 dialogues;
- synthetic: 5-fold CV by dialogue (``text_folds``, fold seed 0), each fold's dialogues
  scored by the model trained on the other folds (DS1–DS5).

The calibrated score of a dialogue is the judge-free mean over the trusted judges (all
judges of the checkpoint, conf/scoring/default.yaml); the raw score is the expected LLM
answer (``ExpectedLLM``). Intervals: bootstrap over dialogues and judges with answers drawn
from the predicted distributions. Each is rank-correlated (Spearman, Kendall τ-b) with the
human leaderboard (mean human Q0 per system). Seed 0 gives the tables; the correlations are
also reported for every seed. Finally 1 million (dialogue, judge) pairs are scored in a
fresh process (features replicated from the real ones; predictions of every question
streamed to Parquet) for time and peak RSS. Writes ``benchmarks/results/leaderboard.json``.

``--read-only`` times only reading and validating that replicated features table (1.5M rows;
``read_table`` + ``validate_features``, each repeat in a fresh process) and writes
``benchmarks/results/read_validate.json``.

``--build-only`` times ``llmrubric leaderboard build`` as a user runs it (a fresh process each repeat), with its
density plot and with ``--no-plot``, on the 14 systems of DialSummEval (``--dialsumm``, 1,400 summaries, 3 raters;
the predictions of ``ridge_judge`` fitted on them, every question) at the shipped settings; then, in this process,
the plot alone and its bands' KDEs against the ``scipy.stats.gaussian_kde`` loop they replace (on the first 200
curves: their time and the largest difference). CPU seconds are the figures (wall seconds beside them: on a shared
machine they include the wait for a core). Writes ``benchmarks/results/leaderboard_build.json``.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import code_version, write_result  # noqa: E402

from llmrubric import NetworkCalibrator  # noqa: E402
from llmrubric.config import command_settings  # noqa: E402
from llmrubric.data import llm_rubric  # noqa: E402
from llmrubric.data.splits import text_folds  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables  # noqa: E402
from llmrubric.model.families.baselines import ExpectedLLM  # noqa: E402
from llmrubric.scoring import leaderboard as lb  # noqa: E402
from llmrubric.scoring.scores import score_texts  # noqa: E402

SETTINGS = command_settings("scoring")  # conf/scoring/default.yaml over llmrubric.config.ScoringConfig
PAPER_HUMAN = {  # paper Tables 4–5, mean human Q0 per system
    "synthetic": {"DS1": 2.3, "DS2": 3.1, "DS3": 3.0, "DS4": 3.0, "DS5": 2.9},
    "real": {"DS1": 2.668, "DS2": 2.915, "DS3": 2.697},
}


@lru_cache(maxsize=1)
def data(root: str):
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    synthetic, real = llm_rubric.load(root, "synthetic", rubric), llm_rubric.load(root, "real", rubric)
    synthetic.texts["query_id"] = synthetic.texts.text_id.str.split("_").str[
        1
    ]  # V<system>_<topic>: pair systems by topic
    return rubric, synthetic, real


def calibrated_predictions(root: str, seed: int) -> dict:
    """Q0 predictions of every checkpoint judge: real (train on synthetic) and synthetic (5-fold CV)."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rubric, synthetic, real = data(root)
    q = [rubric.main.id]
    model = NetworkCalibrator(rubric, seed=seed).fit(synthetic)
    out = {"real": score_texts(model, real.features, real.texts, questions=q, keep_predictions=True).predictions}
    folds = text_folds(synthetic.text_ids, 5, seed=0)
    parts = []
    for k in range(5):
        held = folds.text_id[folds.fold == k]
        fold_model = NetworkCalibrator(rubric, seed=seed).fit(synthetic.subset(folds.text_id[folds.fold != k]))
        test = synthetic.subset(held)
        parts.append(score_texts(fold_model, test.features, test.texts, questions=q, keep_predictions=True).predictions)
    out["synthetic"] = pd.concat(parts, ignore_index=True)
    return out


def raw_predictions(tables: Tables, rubric: Rubric) -> pd.DataFrame:
    """The LLM's normalised Q0 distribution per text, as one pseudo-judge ``llm``."""
    pairs = tables.texts[["text_id", "system_id"]].assign(judge_id="llm")[["text_id", "judge_id", "system_id"]]
    return ExpectedLLM(rubric).predict(tables, pairs)


def human_board(tables: Tables, rubric: Rubric, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean human Q0 per system with a bootstrap interval over dialogues (all their annotations)."""
    ann = tables.annotations[tables.annotations.question_id == rubric.main.id]
    values = ann.answer.map(dict(zip(rubric.main.keys, rubric.main.values))).astype(float)
    per_text = values.groupby(ann.text_id).agg(["sum", "count"]).join(tables.texts.set_index("text_id").system_id)
    rng = np.random.default_rng(seed)
    rows = []
    for system, part in per_text.groupby("system_id"):
        s, c = part["sum"].to_numpy(), part["count"].to_numpy()
        idx = rng.integers(0, len(part), (n_boot, len(part)))
        low, high = np.quantile(s[idx].sum(1) / c[idx].sum(1), [0.025, 0.975])
        rows.append(
            {
                "system": system,
                "score": s.sum() / c.sum(),
                "low": low,
                "high": high,
                "texts": len(part),
                "annotations": int(c.sum()),
            }
        )
    return pd.DataFrame(rows)


def system_means(predictions: pd.DataFrame, rubric: Rubric, tables: Tables) -> pd.Series:
    systems, _ = lb.system_data(predictions, rubric.main, tables.texts)
    return pd.Series({d.system: float(np.nanmean(d.text_scores())) for d in systems})


def board_records(board: pd.DataFrame) -> list[dict]:
    return [{k: r[k] for k in ("system", "score", "low", "high", "texts")} for r in board.to_dict("records")]


def score_million(checkpoint: str, features: str, out: str, judges: int) -> dict:
    """In a fresh process: read + validate the features, score every (text, judge) pair."""
    from llmrubric.io.tables import read_table, validate_features

    logging.disable(logging.WARNING)
    start = time.perf_counter()
    model = NetworkCalibrator.load(checkpoint)
    feats = validate_features(read_table(features, "features"), model.rubric)
    read_seconds = time.perf_counter() - start
    result = score_texts(model, feats, chunk_texts=SETTINGS["chunk_texts"], predictions_out=out)
    return {
        "pairs": result.summary["pairs"],
        "judges": judges,
        "questions": len(result.summary["questions"]),
        "seconds": result.summary["seconds"],
        "read_validate_seconds": read_seconds,
        "fast_path": result.summary["fast_path"],
        "predictions_rows": result.summary["pairs"] * len(result.summary["questions"]),
        "predictions_mb": os.path.getsize(out) / 2**20,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--bootstrap", type=int, default=SETTINGS["leaderboard"]["bootstrap"])
    parser.add_argument("--pairs", type=int, default=1_000_000, help="(text, judge) pairs for the scoring speed test")
    parser.add_argument(
        "--data", default=os.environ.get("LLM_RUBRIC_DATA", str(ROOT.parent / "shared" / "data" / "llm-rubric"))
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--out", default=None, help="results JSON (default: benchmarks/results/leaderboard.json, or read_validate.json)"
    )
    parser.add_argument(
        "--read-only", action="store_true", help="only time reading + validating the scoring benchmark's features table"
    )
    parser.add_argument("--repeats", type=int, default=3, help="--read-only, --build-only: fresh processes timed")
    parser.add_argument(
        "--build-only", action="store_true", help="only time `leaderboard build` with and without its plot (DialSumm)"
    )
    parser.add_argument("--dialsumm", default=str(ROOT.parent / "shared" / "data" / "dialsumm"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args.build_only:
        from leaderboard_build import build_speed

        build_speed(
            args.dialsumm, args.repeats, args.out or str(ROOT / "benchmarks" / "results" / "leaderboard_build.json")
        )
        return
    if args.read_only:
        read_validate_speed(
            args.data, args.pairs, args.repeats, args.out or str(ROOT / "benchmarks" / "results" / "read_validate.json")
        )
        return
    args.out = args.out or str(ROOT / "benchmarks" / "results" / "leaderboard.json")
    start, version = time.perf_counter(), code_version()
    rubric, synthetic, real = data(args.data)
    with ProcessPoolExecutor(args.workers) as pool:
        runs = dict(
            zip(range(args.seeds), pool.map(calibrated_predictions, [args.data] * args.seeds, range(args.seeds)))
        )
    boot = {
        "n_boot": args.bootstrap,
        "seed": SETTINGS["leaderboard"]["seed"],
        "sample_answers": SETTINGS["leaderboard"]["sample_answers"],
    }
    report: dict = {}
    for split, tables in (("synthetic", synthetic), ("real", real)):
        human = human_board(tables, rubric, args.bootstrap, boot["seed"])
        human_scores = human.set_index("system").score
        entry = {"human": board_records(human), "paper_human": PAPER_HUMAN[split]}
        raw = lb.build(raw_predictions(tables, rubric), rubric.main, tables.texts, **boot)
        cal = lb.build(runs[0][split], rubric.main, tables.texts, **boot)
        for name, res in (("calibrated", cal), ("raw_llm", raw)):
            scores = res.board.set_index("system").score
            entry[name] = {
                "leaderboard": board_records(res.board),
                "vs_human": lb.rank_correlation(scores, human_scores, name_a=name, name_b="human"),
                "comparisons": res.comparisons.to_dict("records"),
            }
        per_seed = [
            lb.rank_correlation(system_means(runs[s][split], rubric, tables), human_scores) for s in range(args.seeds)
        ]
        entry["calibrated"]["vs_human_per_seed"] = {m: [r[m] for r in per_seed] for m in ("spearman", "kendall")}
        entry["calibrated"]["vs_human_mean_over_seeds"] = {
            m: float(np.nanmean([r[m] for r in per_seed])) for m in ("spearman", "kendall")
        }
        entry["kendall"] = {
            "calibrated": entry["calibrated"]["vs_human"]["kendall"],
            "raw_llm": entry["raw_llm"]["vs_human"]["kendall"],
        }
        entry["spearman"] = {
            "calibrated": entry["calibrated"]["vs_human"]["spearman"],
            "raw_llm": entry["raw_llm"]["vs_human"]["spearman"],
        }
        report[split] = entry
        lb.write(cal, ROOT / "outputs" / "leaderboard" / split, plot=True)
    report["scoring"] = scoring_speed(rubric, synthetic, real, args.pairs)
    report["meta"] = {
        "seconds": time.perf_counter() - start,
        "seeds": args.seeds,
        "bootstrap": args.bootstrap,
        "trusted_judges": "all checkpoint judges",
        "question": rubric.main.id,
    }
    write_result(report, args.out, version)
    print_report(report)
    print(f"\nwritten to {args.out} in {report['meta']['seconds']:.0f}s (plots in outputs/leaderboard/)")


def replicated_features(real: Tables, judges: int, n_pairs: int) -> pd.DataFrame:
    """The real features with texts replicated until texts × ``judges`` >= ``n_pairs``."""
    reps = -(-n_pairs // (judges * real.features.text_id.nunique()))
    f = real.features
    return pd.concat([f.assign(text_id=f.text_id + f"#{i}") for i in range(reps)], ignore_index=True)


def read_validate(features: str) -> dict:
    """In a fresh process: seconds to read and to validate the features table."""
    from llmrubric.io.tables import read_table, validate_features

    logging.disable(logging.WARNING)
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    start = time.perf_counter()
    table = read_table(features, "features")
    read = time.perf_counter() - start
    validate_features(table, rubric)
    return {"rows": len(table), "read_seconds": read, "validate_seconds": time.perf_counter() - start - read}


def read_validate_speed(root: str, n_pairs: int, repeats: int, out: str) -> None:
    """``--read-only``: time read + validate of the scoring benchmark's features table."""
    version = code_version()
    rubric, synthetic, real = data(root)
    big = replicated_features(real, synthetic.annotations.judge_id.nunique(), n_pairs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "features.parquet"
        big.to_parquet(path, index=False)
        runs = []
        for _ in range(repeats):
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                runs.append(pool.submit(read_validate, str(path)).result())
    totals = [r["read_seconds"] + r["validate_seconds"] for r in runs]
    result = {
        "rows": runs[0]["rows"],
        "runs": runs,
        "best_seconds": min(totals),
        "median_seconds": float(np.median(totals)),
    }
    write_result(result, out, version)
    print(
        f"read + validate {result['rows']} feature rows: best {result['best_seconds']:.2f}s, median {result['median_seconds']:.2f}s "
        f"over {repeats} fresh processes (read {min(r['read_seconds'] for r in runs):.2f}s, validate {min(r['validate_seconds'] for r in runs):.2f}s) → {out}"
    )


def scoring_speed(rubric: Rubric, synthetic: Tables, real: Tables, n_pairs: int) -> dict:
    """Score ``n_pairs`` (text, judge) pairs of replicated real features in a fresh process."""
    model = NetworkCalibrator(rubric, seed=0).fit(synthetic)
    judges = len(model.judges_.judges)
    big = replicated_features(real, judges, n_pairs)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, features = model.save(Path(tmp) / "model.safetensors"), Path(tmp) / "features.parquet"
        big.to_parquet(features, index=False)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(
                score_million, str(checkpoint), str(features), str(Path(tmp) / "predictions.parquet"), judges
            ).result()


def print_report(report: dict) -> None:
    for split in ("real", "synthetic"):
        e = report[split]
        human = {r["system"]: r for r in e["human"]}
        cal = {r["system"]: r for r in e["calibrated"]["leaderboard"]}
        raw = {r["system"]: r for r in e["raw_llm"]["leaderboard"]}
        print(f"\n{split}: Q0 per system (95% bootstrap intervals)")
        print("| system | human | paper human | calibrated | raw expected LLM |\n|---|---|---|---|---|")
        for s in sorted(human):
            fmt = lambda r: f"{r['score']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
            print(f"| {s} | {fmt(human[s])} | {e['paper_human'][s]} | {fmt(cal[s])} | {fmt(raw[s])} |")
        for name in ("calibrated", "raw_llm"):
            c = e[name]["vs_human"]
            print(f"{name} vs human: Spearman {c['spearman']:.3f}, Kendall {c['kendall']:.3f}")
        print(f"calibrated over seeds: Kendall {e['calibrated']['vs_human_per_seed']['kendall']}")
    s = report["scoring"]
    print(
        f"\nscoring: {s['pairs']} pairs × {s['questions']} questions in {s['seconds']:.1f}s "
        f"(+{s['read_validate_seconds']:.1f}s read/validate), peak RSS {s['peak_rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
