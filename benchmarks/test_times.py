"""How long the test targets take: ``make test-fast`` (60 s at most on 2 cores, issue 33) and, with ``--full``,
``make test`` (CI's command); with ``--fresh``, the README's two commands as a new user runs them: a fresh clone of
HEAD beside this checkout (so that ``../shared`` is found), ``make setup`` (a new ``.venv``: the package registry,
the model) and then ``make test``, timed apart (issue 67: setup within 120 s and pytest within 480 s on 2 idle
cores, 10 minutes in all).

    .venv/bin/python benchmarks/test_times.py [--full | --fresh] [--dry-run] [--out benchmarks/results/test_times.json]

Runs each target once, with the machine's load average before and after (the figures mean little on a loaded
machine), and writes wall seconds, CPU seconds of the children, pytest's own wall seconds (from its summary line:
``make test`` also runs ruff and checks the setup), pass/skip/fail counts and the :data:`SLOWEST` slowest test phases
(``slowest``, pytest's ``--durations``: seconds of one worker) to the JSON file; with ``--fresh``
also ``setup_seconds``, ``pytest_seconds`` and whether each is within issue 67's budget. ``--dry-run`` prints the
commands and the folder they would run in, and runs nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import code_version, write_result

ROOT = Path(__file__).resolve().parents[1]
BUDGET = {"setup_seconds": 120, "pytest_seconds": 480}  # issue 67, on a fresh clone with 2 idle cores
SLOWEST = 25  # pytest's --durations: the slowest phases (set-up, call, tear-down) of tests, kept in the JSON


def pytest_seconds(summary: str) -> float | None:
    """The wall seconds of pytest's summary line (``=== 1600 passed, 4 skipped in 354.52s (0:05:54) ===``)."""
    found = re.search(r" in ([0-9.]+)s\b", summary)
    return float(found.group(1)) if found else None


def run_target(target: str, cwd: Path = ROOT) -> dict:
    load_before = os.getloadavg()
    before = os.times()
    start = time.perf_counter()
    env = {**os.environ, "PYTEST_ADDOPTS": f"{os.environ.get('PYTEST_ADDOPTS', '')} --durations={SLOWEST}".strip()}
    result = subprocess.run(["make", target], cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = os.times()
    lines = result.stdout.strip().splitlines() or [""]
    # pytest's summary line (make test prints its own setup/tests split after it)
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), lines[-1])
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|skipped|failed|errors?)", summary)}
    return {
        "target": f"make {target}",
        "exit_code": result.returncode,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(
            (after.children_user - before.children_user) + (after.children_system - before.children_system), 1
        ),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "pytest": counts,
        "failed_tests": [line.split()[1] for line in result.stdout.splitlines() if line.startswith("FAILED ")],
        "summary": summary,
        "pytest_seconds": pytest_seconds(summary),
        "output_lines": len(result.stdout.splitlines()) + len(result.stderr.splitlines()),
        "slowest": slowest(result.stdout),
    }


def slowest(output: str) -> list[dict]:
    """pytest's ``--durations`` lines (``12.34s call     tests/test_x.py::test_y``): seconds, phase and test."""
    found = re.findall(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+)$", output, flags=re.MULTILINE)
    return [{"seconds": float(s), "phase": phase, "test": test} for s, phase, test in found]


def fresh_clone() -> Path:
    """A clone of HEAD beside the checkout (``../shared`` resolves from it), without a ``.venv``."""
    target = ROOT.parent / f"{ROOT.name}-fresh-clone"
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="also time make test (about 8 min on 2 idle cores)")
    parser.add_argument("--fresh", action="store_true", help="time make setup and make test on a fresh clone")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "test_times.json")
    args = parser.parse_args()
    targets = ["setup", "test"] if args.fresh else ["test-fast", "test"] if args.full else ["test-fast"]
    if args.dry_run:
        where = f"a fresh clone of HEAD at {ROOT.parent / f'{ROOT.name}-fresh-clone'}" if args.fresh else ROOT
        print(f"would run {', then '.join(f'make {t}' for t in targets)} in {where}; results to {args.out}")
        return 0
    version = code_version()
    where = fresh_clone() if args.fresh else ROOT
    results = []
    for target in targets:
        results.append(run_target(target, where))
        r = results[-1]
        print(
            f"make {target}: {r['wall_seconds']} s wall, {r['cpu_seconds']} CPU-s, {r['summary']} (exit {r['exit_code']})"
        )
    if args.fresh:
        shutil.rmtree(where, ignore_errors=True)
    total = round(sum(r["wall_seconds"] for r in results), 1)
    payload = {"meta": {"cpus": os.cpu_count(), "fresh_clone": args.fresh}, "targets": results, "wall_seconds": total}
    if args.fresh:
        split = {"setup_seconds": results[0]["wall_seconds"], "pytest_seconds": results[1]["pytest_seconds"]}
        within = {k: v is not None and v <= BUDGET[k] for k, v in split.items()}
        payload.update(split, budget={**BUDGET, "within": within})
        print(
            f"setup {split['setup_seconds']} s, pytest {split['pytest_seconds']} s; issue 67's budget {BUDGET}: {within}"
        )
    write_result(payload, args.out, version)
    print(f"written to {args.out}")
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
