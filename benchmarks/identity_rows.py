"""Whether a benchmark's re-run reproduces its committed figures: every number of ``--after`` (a re-run's JSON)
compared with the same key of ``--before`` (the committed JSON), timings and metadata left out.

    .venv/bin/python benchmarks/identity_rows.py --before benchmarks/results/table1.json \
        --after /tmp/table1.json --name table1 [--only REGEX] [--tolerance T] [--out FILE --merge]

Writes, under ``--name``: how many figures were compared and identical (to ``--tolerance``, 0 by default: equal
as written), the largest difference, the 50 largest differing figures' paths with both values, and the figures only
the re-run has.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from llmrubric.io.errors import InputError  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "identity_rows.json"
TOP = 50  # the differing figures kept in the record, largest first
SKIPPED = ("meta", "seconds", "wall", "cpu", "time", "timing", "cost")  # keys whose figures depend on the machine


def leaves(data, path: tuple = ()) -> dict[tuple, float]:
    """Path → number of every numeric leaf of ``data`` (lists by index), skipping :data:`SKIPPED` keys."""
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            if not any(word in str(key).lower() for word in SKIPPED):
                out.update(leaves(value, (*path, str(key))))
        return out
    if isinstance(data, list):
        return {p: v for i, item in enumerate(data) for p, v in leaves(item, (*path, str(i))).items()}
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        return {}
    return {path: float(data)}


def compare(before: dict, after: dict, tolerance: float = 0.0, only: str | None = None) -> dict:
    """The record of :func:`leaves` of ``after`` against ``before`` (module doc); ``only``: a regular expression
    a figure's dotted path must contain (the rows of the methods a partial re-run measured)."""
    old, new = leaves(before), leaves(after)
    if only:
        pattern = re.compile(only)
        new = {p: v for p, v in new.items() if pattern.search(".".join(p))}
    shared = [p for p in new if p in old]
    differing = []
    for path in shared:
        a, b = old[path], new[path]
        same = (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance
        if not same:
            differing.append({"path": ".".join(path), "before": a, "after": b, "difference": b - a})
    differing.sort(key=lambda d: -abs(d["difference"]) if math.isfinite(d["difference"]) else -math.inf)
    finite = [abs(d["difference"]) for d in differing if math.isfinite(d["difference"])]
    return {
        "compared": len(shared),
        "identical": len(shared) - len(differing),
        "max_difference": max(finite, default=0.0),
        "differing": differing[:TOP],
        "only_after": sorted(".".join(p) for p in new if p not in old)[:50],
        "tolerance": tolerance,
        "only": only,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the committed result JSON")
    parser.add_argument("--after", type=Path, required=True, help="the re-run's result JSON")
    parser.add_argument("--name", required=True, help="the record's key (the benchmark)")
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--only", default=None, help="a regular expression the compared figures' paths contain")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--merge", action="store_true", help="keep the other records already in --out")
    args = parser.parse_args(argv)
    version = code_version()
    files = {}
    for role in ("before", "after"):
        path = getattr(args, role)
        try:
            files[role] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"cannot read a result JSON: {e}", file=str(path)) from None
    record = compare(files["before"], files["after"], args.tolerance, args.only)
    record.update(before=str(args.before), after=str(args.after), after_code=files["after"].get("meta", {}))
    print(f"{args.name}: {record['identical']} of {record['compared']} figures identical, largest difference "
          f"{record['max_difference']:.3g}")  # fmt: skip
    for d in record["differing"][:10]:
        print(f"  {d['path']}: {d['before']:.6g} -> {d['after']:.6g}")
    report = json.loads(args.out.read_text()) if args.merge and args.out.is_file() else {}
    report[args.name] = record
    report.pop("meta", None)
    write_result(report, args.out, version)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
