"""Issue 49's robustness grid: the default (``model=auto`` as ``train.py`` builds it) against ridge + rater
indicators (``ridge_judge``) and the raw line (``raw_linear_system``), leave one system out, across data shapes:
DialSummEval at full size and reduced (``--systems`` of its 14, ``--texts`` per system, ``--draws`` random draws of
both), and the shared generator's sets (``--generated``, with and without ``--references 1``).

    .venv/bin/python benchmarks/robustness.py [--cells dialsumm_s6_t20_d0 ...] [--methods auto ridge_judge ...]
        [--workers 2] [--out benchmarks/results/robustness.json --merge]
    .venv/bin/python benchmarks/robustness.py --combine RUN.json ... [--out benchmarks/results/robustness.json]

Each cell runs ``benchmarks/auto.py`` (``--protocols systems``: its pair and system figures, each rater's pair NLL
and mean predicted and observed answer, the choices and the seconds per fold) and keeps its rows; the record per
cell says whether the default's pair NLL is no worse than the better baseline's (the issue's first target) and by
how much. ``--list`` prints the cells. A reduced DialSumm cell keeps ``S`` systems drawn at random (seed: the draw)
and ``T`` texts of each (the same dialogues for every system, as in the full set), every table cut to those texts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import auto as auto_bench  # noqa: E402

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "robustness.json"
DIALSUMM = ROOT.parent / "shared" / "data" / "dialsumm"
DEFAULT, BASELINES = "auto", ("ridge_judge", "raw_linear_system")
SYSTEMS, TEXTS, DRAWS = (6, 14), (20, 40, 100), 3
GENERATED = (
    "multisystem_default",
    "multisystem_references_s0",
    "multisystem_references_s1",
    "multisystem_references_s2",
)
TABLES = ("annotations", "features", "texts")


def cells() -> list[str]:
    """Every cell of the grid: DialSumm full and reduced (each draw), then the generator's sets."""
    reduced = [
        f"dialsumm_s{s}_t{t}_d{d}"
        for s, t in itertools.product(SYSTEMS, TEXTS)
        if (s, t) != (max(SYSTEMS), max(TEXTS))
        for d in range(DRAWS)
    ]
    return ["dialsumm_full", *reduced, *GENERATED]


def reduced(source: Path, systems: int, texts: int, draw: int, out: Path) -> Path:
    """DialSumm cut to ``systems`` systems and ``texts`` dialogues of each, drawn with seed ``draw``, in ``out``."""
    frames = {name: pd.read_csv(source / f"{name}.csv", dtype={"text_id": str}) for name in TABLES}
    info = frames["texts"]
    rng = np.random.default_rng(draw)
    kept_systems = sorted(rng.choice(sorted(info.system_id.unique()), systems, replace=False))
    queries = sorted(info.query_id.astype(str).unique())
    kept_queries = set(rng.choice(queries, min(texts, len(queries)), replace=False))
    chosen = info[info.system_id.isin(kept_systems) & info.query_id.astype(str).isin(kept_queries)].text_id
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        frame[frame.text_id.isin(set(chosen))].to_csv(out / f"{name}.csv", index=False)
    shutil.copy(source / "rubric.yaml", out / "rubric.yaml")
    return out


def cell_args(cell: str, dialsumm: Path, work: Path) -> list[str]:
    """``benchmarks/auto.py``'s arguments that select the data of ``cell``."""
    if cell in GENERATED:
        return ["--sets", cell]
    if cell == "dialsumm_full":
        folder = dialsumm
    elif cell.startswith("dialsumm_s"):
        s, t, d = (int(part[1:]) for part in cell.removeprefix("dialsumm_").split("_"))
        folder = reduced(dialsumm, s, t, d, work / cell)
    else:
        raise InputError(f"unknown cell {cell!r}; known: {cells()}", setting="--cells")
    return ["--data", str(folder), "--rubric", str(folder / "rubric.yaml")]


def summary(rows: dict, methods: list[str], before: dict | None = None, commit: str | None = None) -> dict:
    """The rows of a cell's methods (over those of ``before``, an earlier run's record of the cell; each row says
    the ``commit`` it ran at) and whether the default's pair NLL is no worse than the better baseline's."""
    keep = ("pair_nll", "pair_pearson", "system_rms", "system_kendall", "per_judge", "seconds", "fold_seconds")
    new = {m: {**{k: rows[m].get(k) for k in keep}, "commit": commit} for m in methods if m in rows}
    choices = {m: {f: c[m]["weights"] for f, c in rows.get("choices", {}).items() if m in c} for m in methods}
    return combined({**new, "choices": {m: c for m, c in choices.items() if c}}, before)


def combined(record: dict, before: dict | None = None) -> dict:
    """A cell's ``record`` over ``before`` (its rows and choices replace theirs by method) with the targets: for the
    default (``target``) and for every variant of it (``targets``), whether its pair NLL is no worse than the better
    baseline's and by how much."""
    rows = {m: r for m, r in (before or {}).items() if m not in ("target", "targets", "choices")}
    rows |= {m: r for m, r in record.items() if m not in ("target", "targets", "choices")}
    out = {**rows, "choices": {**(before or {}).get("choices", {}), **record.get("choices", {})}}
    baselines = [rows[b]["pair_nll"] for b in BASELINES if b in rows]
    if baselines:
        margins = {m: min(baselines) - r["pair_nll"] for m, r in rows.items() if m.startswith(DEFAULT)}
        out["targets"] = {m: {"no_worse_than_baselines": bool(v >= 0), "margin": float(v)} for m, v in margins.items()}
        if DEFAULT in margins:
            margin = margins[DEFAULT]
            out["target"] = {"default_no_worse_than_baselines": bool(margin >= 0), "margin": float(margin)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=None, help="default: every cell (--list)")
    parser.add_argument("--methods", nargs="+", default=[DEFAULT, *BASELINES])
    parser.add_argument("--dialsumm", type=Path, default=DIALSUMM)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="print the cells and stop")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--merge", action="store_true", help="keep the other cells already in --out")
    parser.add_argument("--combine", nargs="+", type=Path, help="merge these runs' records into --out and stop")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(cells()))
        return 0
    if args.combine:
        return combine_runs(args.combine, args.out)
    chosen = args.cells or cells()
    unknown = [c for c in chosen if c not in cells()]
    if unknown:
        raise InputError(f"unknown cell(s) {unknown}; known: {cells()}", setting="--cells")
    version = code_version()
    report = json.loads(args.out.read_text()) if args.merge and args.out.is_file() else {}
    report.pop("meta", None)
    with tempfile.TemporaryDirectory(prefix="llmrubric-robustness-") as work:
        for cell in chosen:
            out = Path(work) / f"{cell}.json"
            common = ["--protocols", "systems", "--methods", *args.methods, "--grouping-seeds", "1"]
            code = auto_bench.main([*cell_args(cell, args.dialsumm, Path(work)), *common,
                                    "--workers", str(args.workers), "--out", str(out)])  # fmt: skip
            if code:
                return code
            result = json.loads(out.read_text())
            rows = next(v["systems"] for k, v in result.items() if k != "meta" and "systems" in v)
            report[cell] = summary(rows, args.methods, report.get(cell), version["commit"])
            print(cell, {m: round(report[cell][m]["pair_nll"], 4) for m in args.methods if m in report[cell]})
    write_result(report, args.out, version)
    return 0


def combine_runs(runs: list[Path], out: Path) -> int:
    """Merge other runs' records (each written by this script with another ``--out``) into ``out``, cell by cell
    and method by method: every row keeps the commit it ran at; ``meta.combined`` lists each run's commit."""
    report = run_record(out)
    meta = report.pop("meta")
    for run in runs:
        record = run_record(run)
        ran = record.pop("meta")
        for cell, rows in record.items():
            report[cell] = combined(rows, report.get(cell))
        meta.setdefault("combined", []).append({"commit": ran["commit"], "dirty": ran["dirty"], "cells": list(record)})
    out.write_text(json.dumps({**report, "meta": meta}, indent=2) + "\n")
    return 0


def run_record(path: Path) -> dict:
    """A record this script wrote (its cells and ``meta``), or one error naming the file."""
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read a robustness record: {e}", file=str(path)) from None
    if not isinstance(record, dict) or not isinstance(record.get("meta"), dict) or "commit" not in record["meta"]:
        raise InputError("not a robustness record (no meta.commit)", file=str(path))
    return record


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
