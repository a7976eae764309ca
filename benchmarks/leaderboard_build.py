"""``benchmarks/leaderboard.py --build-only``: the time of ``llmrubric leaderboard build`` with and without its
density plot, on DialSummEval's 14 systems (module doc of ``leaderboard.py``)."""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import code_version, write_result

from llmrubric import Rubric, load_tables, make_model
from llmrubric.config import command_settings
from llmrubric.io.files import write_table
from llmrubric.scoring import leaderboard as lb
from llmrubric.scoring.leaderboard.plots import kde_curves

SCIPY_CURVES = 200  # the bands' curves also drawn by scipy.stats.gaussian_kde one by one (the first system's)


def build_speed(dialsumm: str, repeats: int, out: str) -> None:
    """Time the command (fresh processes) and the plot's parts (here); write ``out``."""
    version, data = code_version(), Path(dialsumm)
    rubric = Rubric.load(data / "rubric.yaml")
    tables = load_tables(data / "annotations.csv", data / "features.csv", rubric, texts=data / "texts.csv")
    predictions = make_model("ridge_judge", rubric).fit(tables).predict(tables)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_table(predictions, Path(tmp) / "predictions.parquet")
        argv = ["leaderboard", "build", str(path), "--texts", str(data / "texts.csv"), "--rubric"]
        argv += [str(data / "rubric.yaml")]
        runs = {
            name: [command_seconds([*argv, "--out-dir", str(Path(tmp) / f"{name}{i}"), *flags]) for i in range(repeats)]
            for name, flags in (("plot", []), ("no_plot", ["--no-plot"]))
        }
        plot = plot_parts(predictions, rubric, tables, Path(tmp) / "density.png")
    report = {
        "data": {
            "set": "DialSummEval (../shared/data/dialsumm)",
            "systems": int(tables.texts.system_id.nunique()),
            "texts": len(tables.texts),
            "judges": int(predictions.judge_id.nunique()),
            "predictions": "ridge_judge fitted on every text, every question",
        },
        "settings": command_settings("scoring")["leaderboard"],
        "command": {name: summary(r) for name, r in runs.items()},
        "plot": plot,
        "meta": {
            "repeats": repeats,
            "timed": "CPU (user + system) and wall seconds of `python -m llmrubric.cli leaderboard build`; on a "
            "shared machine the CPU seconds are the figure, the wall seconds include waiting for the cores",
        },
    }
    c = report["command"]
    c["plot_cpu_seconds"] = c["plot"]["median_cpu"] - c["no_plot"]["median_cpu"]
    c["plot_wall_seconds"] = c["plot"]["median_wall"] - c["no_plot"]["median_wall"]
    write_result(report, out, version)
    d = report["data"]
    print(
        f"leaderboard build, {d['systems']} systems x {d['texts'] // d['systems']} texts, {d['judges']} judges, median of {repeats} fresh processes:"
    )
    print(
        f"  with the plot {c['plot']['median_cpu']:.2f} s CPU ({c['plot']['median_wall']:.2f} s wall), --no-plot "
        f"{c['no_plot']['median_cpu']:.2f} s CPU ({c['no_plot']['median_wall']:.2f} s wall): the plot "
        f"{c['plot_cpu_seconds']:.2f} s CPU ({c['plot_wall_seconds']:.2f} s wall)"
    )
    print(
        f"  in this process: the plot {plot['cpu_seconds']:.2f} s CPU ({plot['wall_seconds']:.2f} s wall; matplotlib's "
        f"import before it {plot['matplotlib_import_cpu_seconds']:.2f} s CPU), its {plot['curves']} KDEs "
        f"{plot['kde_cpu_seconds']:.3f} s CPU; scipy.stats.gaussian_kde on {plot['scipy_curves']} of them "
        f"{plot['scipy_cpu_seconds']:.2f} s CPU (x{plot['curves'] / plot['scipy_curves']:.0f} for all: "
        f"{plot['scipy_cpu_seconds'] * plot['curves'] / plot['scipy_curves']:.1f} s), largest difference {plot['largest_difference']:.1e}"
    )
    print(f"written to {out}")


def command_seconds(argv: list[str]) -> dict:
    """Wall and CPU seconds of the command in a fresh process; an error stops the benchmark."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "llmrubric.cli", *argv], capture_output=True, text=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"leaderboard build failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def summary(runs: list[dict]) -> dict:
    return {
        "median_wall": statistics.median(r["wall"] for r in runs),
        "median_cpu": statistics.median(r["cpu"] for r in runs),
        "runs": runs,
    }


def plot_parts(predictions, rubric: Rubric, tables, path: Path) -> dict:
    """The plot of the shipped leaderboard in this process: matplotlib's import, the whole plot, and the bands'
    KDEs against the per-replicate ``scipy.stats.gaussian_kde`` loop (same grid)."""
    from scipy import stats

    settings = command_settings("scoring")["leaderboard"]
    result = lb.build(
        predictions,
        rubric.main,
        tables.texts,
        n_boot=settings["bootstrap"],
        seed=settings["seed"],
        band_replicates=settings["band_replicates"],
    )
    start = time.process_time()
    import matplotlib.pyplot  # noqa: F401

    imported = time.process_time() - start
    wall, cpu = time.perf_counter(), time.process_time()
    lb.density_plot(result.systems, result.boot, path)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    values = result.systems[0].values
    grid = np.linspace(np.nanmin(values) - 0.5, np.nanmax(values) + 0.5, 200)
    samples = [r for reps in result.boot["text_scores"].values() for r in reps]
    start = time.process_time()
    ours = kde_curves(samples, grid)
    kde = time.process_time() - start
    some = samples[:SCIPY_CURVES]
    start = time.process_time()
    theirs = [stats.gaussian_kde(x)(grid) if len(x) >= 2 and np.ptp(x) > 0 else None for x in some]
    scipy_seconds = time.process_time() - start
    assert [c is None for c in ours[: len(some)]] == [c is None for c in theirs]
    largest = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs) if a is not None)
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "matplotlib_import_cpu_seconds": imported,
        "curves": len(samples),
        "kde_cpu_seconds": kde,
        "scipy_curves": len(some),
        "scipy_cpu_seconds": scipy_seconds,
        "largest_difference": largest,
    }
