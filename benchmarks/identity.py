"""Whether a refactor changed what the README's main job predicts: ``make demo`` (``train.py`` then
``evaluate.py``, ``experiment=demo``) run at two commits, its predictions compared byte for byte.

    .venv/bin/python benchmarks/identity.py --before 53951dc [--after HEAD] [--after-override KEY=VALUE ...]

Each commit is checked out in a temporary git worktree and run there with this checkout's Python environment
(``PYTHONPATH`` set to the worktree, so its own package is imported). ``--after-override``: settings given to the
``after`` run only (a setting that did not exist before, set to what the ``before`` code did). Writes
``benchmarks/results/identity.json``: per commit the SHA-256 of ``predictions.csv`` and its rows, whether they are
identical, and where they are not, the largest absolute difference of each numeric column.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "identity.json"
PREDICTIONS = "predictions.csv"


def resolved(commit: str) -> str:
    """The short hash of ``commit`` (an error naming it where git does not know it)."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", commit], capture_output=True, text=True)
    if found.returncode != 0:
        raise InputError(f"git does not know commit {commit!r}", setting="--before/--after")
    return found.stdout.strip()


def demo_run(commit: str, overrides: list[str], work: Path) -> dict:
    """``make demo``'s two commands at ``commit`` in a worktree under ``work``: the predictions and their seconds."""
    tree, run_dir = work / f"tree-{commit}", work / f"run-{commit}"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True, capture_output=True
    )
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        args = ["experiment=demo", f"run_dir={run_dir}", *overrides]
        start = time.perf_counter()
        for script in ("train.py", "evaluate.py"):
            subprocess.run([sys.executable, script, *args], cwd=tree, env=env, check=True, capture_output=True)
        seconds = time.perf_counter() - start
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    data = (run_dir / PREDICTIONS).read_bytes()
    return {
        "commit": commit,
        "overrides": overrides,
        "sha256": hashlib.sha256(data).hexdigest(),
        "seconds": seconds,
        "frame": pd.read_csv(run_dir / PREDICTIONS),
    }


def differences(before: pd.DataFrame, after: pd.DataFrame) -> dict:
    """Column → the largest absolute difference of the numeric columns both have (same rows); the columns only
    one of them has; or the row counts where they differ."""
    if len(before) != len(after):
        return {"rows": [len(before), len(after)]}
    shared = [c for c in before.columns if c in after.columns]
    out = {c: float((before[c] - after[c]).abs().max()) for c in shared if pd.api.types.is_numeric_dtype(before[c])}
    only = sorted(set(before.columns) ^ set(after.columns))
    return {**{c: d for c, d in out.items() if d != 0 or pd.isna(d)}, **({"columns_in_one": only} if only else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--after-override", nargs="*", default=[], help="settings of the after run only")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    version = code_version()
    before, after = resolved(args.before), resolved(args.after)
    with tempfile.TemporaryDirectory(prefix="identity-") as tmp:
        runs = [demo_run(before, [], Path(tmp)), demo_run(after, list(args.after_override), Path(tmp))]
    identical = runs[0]["sha256"] == runs[1]["sha256"]
    report = {
        "meta": {"command": "benchmarks/identity.py " + " ".join(argv if argv is not None else sys.argv[1:])},
        "demo": {
            "before": {k: v for k, v in runs[0].items() if k != "frame"} | {"rows": len(runs[0]["frame"])},
            "after": {k: v for k, v in runs[1].items() if k != "frame"} | {"rows": len(runs[1]["frame"])},
            "identical": identical,
            **({} if identical else {"differences": differences(runs[0]["frame"], runs[1]["frame"])}),
        },
    }
    print(f"make demo predictions, {before} -> {after}: {'byte-identical' if identical else 'DIFFERENT'}")
    if not identical:
        print(f"  {report['demo']['differences']}")
    write_result(report, args.out, version)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
