"""Conformal intervals of every question, not only the main one (issue 50, item 1): held-out coverage and width.

    .venv/bin/python benchmarks/intervals_questions.py [--parts llm_rubric dialsumm] [--halves 5] [--coverage 0.9]

``model=auto`` with the shipped settings (``model.auto.intervals=all``) through the Python API users call
(``AutoCalibrator(...).fit``, ``with_intervals``, ``score_texts(..., coverage=)``):

- ``llm_rubric``: the LLM-Rubric dialogues (``../shared/data/llm-rubric``), Table 1's protocol (``holdout``: fitted
  on the synthetic dialogues, tested on the 223 real ones) and 5-fold CV by dialogue on the real ones (``real_cv``);
  each (dialogue, judge) answer of each of the nine questions with its interval.
- ``dialsumm``: DialSummEval (``../shared/data/dialsumm``, main question coherence), ``--halves`` random 50/50
  splits by text; each (summary, rater) answer of each of the four questions, and each summary's mean over its
  three raters (the judge-free score's interval), against the observed mean.

Per question: pairs, coverage and mean width (pooled over folds or splits), and for DialSumm the texts' coverage
and width. ``fit_seconds``: each fit; ``main_only_seconds``: the first fold fitted again with
``model.auto.intervals=main`` (what calibrating the other questions costs). Writes
``benchmarks/results/intervals_questions.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from benchmarks.intervals import half_split, llm_rubric_split  # noqa: E402
from benchmarks.intervals import load as load_dialsumm  # noqa: E402
from llmrubric.config import model_file  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import Tables  # noqa: E402
from llmrubric.model.auto import AutoCalibrator  # noqa: E402
from llmrubric.model.core.threads import single_threaded  # noqa: E402
from llmrubric.scoring.intervals import pair_coverage, with_intervals  # noqa: E402
from llmrubric.scoring.scores import score_texts  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "intervals_questions.json"
LLM_RUBRIC = ROOT.parent / "shared" / "data" / "llm-rubric"
DIALSUMM = ROOT.parent / "shared" / "data" / "dialsumm"  # main question: intervals.QUESTION (coherence)
PARTS = ("llm_rubric", "dialsumm")


def fitted(rubric: Rubric, train: Tables, seed: int, intervals: str = "all") -> tuple[AutoCalibrator, float]:
    """``model=auto`` with the shipped settings (``model.auto.intervals`` set) fitted on ``train``, and its seconds."""
    settings = model_file("auto")
    settings = {**settings, "auto": {**settings.get("auto", {}), "intervals": intervals}}
    start = time.perf_counter()
    model = AutoCalibrator(rubric, settings, seed=seed).fit(train)
    return model, time.perf_counter() - start


def answer_rows(model: AutoCalibrator, test: Tables, coverage: float) -> pd.DataFrame:
    """Every held-out (text, judge) answer of every question with its interval: :func:`pair_coverage`'s rows and
    ``question_id``."""
    predictions = with_intervals(model.predict(test), model, coverage)
    parts = [
        pair_coverage(predictions, test.annotations, model.rubric[q]).assign(question_id=q)
        for q in model.rubric.ids
        if q in set(test.annotations.question_id)
    ]
    return pd.concat(parts, ignore_index=True)


def text_rows(model: AutoCalibrator, test: Tables, coverage: float) -> pd.DataFrame:
    """Each held-out text's judge-free score interval of every ordered question against its raters' observed mean."""
    questions = [q for q in model.rubric.questions if q.ordered]
    scores = score_texts(model, test.features, test.texts, questions=[q.id for q in questions], coverage=coverage)
    ann = test.annotations
    values = {q.id: dict(zip(q.keys, q.values)) for q in questions}
    ann = ann[ann.question_id.isin(values)]
    y = ann.assign(y=[values[q][str(a)] for q, a in zip(ann.question_id, ann.answer)])
    means = y.groupby(["question_id", "text_id"]).y.mean().rename("y")
    rows = scores.scores.set_index(["question_id", "text_id"]).join(means, how="inner").reset_index()
    return rows.assign(inside=(rows.lo <= rows.y + 1e-9) & (rows.y <= rows.hi + 1e-9), width=rows.hi - rows.lo)


def llm_rubric_job(job: tuple) -> dict:
    """``holdout`` (fold None) or fold ``k`` of ``real_cv`` on the LLM-Rubric dialogues."""
    protocol, fold, coverage, data, main_only = job
    single_threaded()
    rubric, train, test = llm_rubric_split(data, protocol, fold)
    model, seconds = fitted(rubric, train, 0)
    out = {"protocol": protocol, "fold": fold, "pairs": answer_rows(model, test, coverage), "fit_seconds": seconds}
    out["calibrated"] = list(model.conformals_)
    if main_only:
        out["main_only_seconds"] = fitted(rubric, train, 0, "main")[1]
    return out


def dialsumm_job(job: tuple) -> dict:
    """Random half ``split`` of DialSumm: fitted on one half, every question's intervals on the other."""
    split, coverage, data, main_only = job
    single_threaded()
    rubric, tables = load_dialsumm(data)
    train, test = half_split(tables, split)
    model, seconds = fitted(rubric, train, split)
    out = {
        "split": split,
        "pairs": answer_rows(model, test, coverage),
        "texts": text_rows(model, test, coverage),
        "fit_seconds": seconds,
    }
    out["calibrated"] = list(model.conformals_)
    if main_only:
        out["main_only_seconds"] = fitted(rubric, train, split, "main")[1]
    return out


def per_question(rows: pd.DataFrame) -> dict:
    """Question → pairs (or texts), coverage and mean width of ``rows`` (``inside``, ``width``)."""
    return {
        str(q): {"n": int(len(g)), "coverage": float(g.inside.mean()), "width": float(g.width.mean())}
        for q, g in rows.groupby("question_id", sort=False)
    }


def timing(runs: list[dict]) -> dict:
    first = runs[0]
    return {
        "fit_seconds": [r["fit_seconds"] for r in runs],
        **({"main_only_seconds": first["main_only_seconds"]} if "main_only_seconds" in first else {}),
        "first_fit_seconds": first["fit_seconds"],
    }


def llm_rubric_part(data: Path, coverage: float, pool) -> dict:
    jobs = [("holdout", None, coverage, data, True)] + [("real_cv", k, coverage, data, k == 0) for k in range(5)]
    runs = list(pool.map(llm_rubric_job, jobs))
    out = {}
    for protocol in ("holdout", "real_cv"):
        mine = [r for r in runs if r["protocol"] == protocol]
        pairs = pd.concat([r["pairs"] for r in mine], ignore_index=True)
        out[protocol] = {"questions": per_question(pairs), "calibrated": mine[0]["calibrated"], **timing(mine)}
    return out


def dialsumm_part(data: Path, coverage: float, halves: int, pool) -> dict:
    runs = list(pool.map(dialsumm_job, [(s, coverage, data, s == 0) for s in range(halves)]))
    pairs = pd.concat([r["pairs"] for r in runs], ignore_index=True)
    texts = pd.concat([r["texts"] for r in runs], ignore_index=True)
    per_split = [per_question(r["pairs"]) for r in runs]
    return {
        "halves": halves,
        "questions": per_question(pairs),
        "text_means": per_question(texts),
        "per_split_pair_coverage": {q: [s[q]["coverage"] for s in per_split] for q in per_split[0]},
        "calibrated": runs[0]["calibrated"],
        **timing(runs),
    }


def print_part(name: str, figures: dict) -> None:
    for key in ("questions", "text_means"):
        for q, f in figures.get(key, {}).items():
            print(f"  {name} {key} {q}: n {f['n']}, coverage {f['coverage']:.3f}, width {f['width']:.3f}")
    if "main_only_seconds" in figures:
        print(
            f"  {name}: first fit {figures['first_fit_seconds']:.0f} s, main question only {figures['main_only_seconds']:.0f} s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--halves", type=int, default=5, help="DialSumm's random 50/50 splits")
    parser.add_argument("--coverage", type=float, default=0.9)
    parser.add_argument("--llm-rubric-data", type=Path, default=LLM_RUBRIC)
    parser.add_argument("--dialsumm-data", type=Path, default=DIALSUMM)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    version, started = code_version(), time.perf_counter()
    command = "benchmarks/intervals_questions.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report: dict = {"meta": {"parts": args.parts, "nominal": args.coverage, "command": command}}
    with ProcessPoolExecutor(args.workers) as pool:
        if "llm_rubric" in args.parts:
            report["llm_rubric"] = llm_rubric_part(args.llm_rubric_data, args.coverage, pool)
            for protocol, figures in report["llm_rubric"].items():
                print_part(f"LLM-Rubric {protocol}", figures)
        if "dialsumm" in args.parts:
            report["dialsumm"] = dialsumm_part(args.dialsumm_data, args.coverage, args.halves, pool)
            print_part("DialSumm", report["dialsumm"])
    report["meta"]["seconds"] = time.perf_counter() - started
    write_result(report, args.out, version)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
