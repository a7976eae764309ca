"""benchmarks/labels.py: the system RMS of each method's point estimate, per system and without labels."""

import math
import sys

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import labels as bench  # noqa: E402


def test_the_system_rms_is_over_systems_and_draws_not_of_the_mean_errors():
    # system A is right on average (mean error 0) but off by 1 in every draw: the RMS must see it
    draws = {
        "system": ["A", "A", "B", "B"],
        "hit": [True, False, True, True],
        "width": [0.4, 0.2, 0.3, 0.5],
        "error": [1.0, -1.0, 0.5, 0.5],
    }
    got = bench.method_figures(draws)
    assert got["rms"] == pytest.approx(math.sqrt((1 + 1 + 0.25 + 0.25) / 4))
    assert got["coverage"] == pytest.approx(0.75) and got["width"] == pytest.approx(0.35)
    assert (got["worst_system"], got["worst_coverage"], got["systems"]) == ("A", 0.5, 2)
    assert got["per_system"]["A"]["mean_error"] == pytest.approx(0.0)
    assert got["per_system"]["B"] == pytest.approx({"coverage": 1.0, "width": 0.4, "mean_error": 0.5})


def test_interval_figures_report_the_rms_of_the_estimates_with_and_without_labels():
    # three systems whose labels are constant (2, 3, 4): the mean score misses them by +0.3, -0.4, 0 and the
    # level's prior by +0.2 each; with k labels the classical estimate is the system's mean label exactly
    rng = np.random.default_rng(0)
    rows = []
    for system, label, offset in (("A", 2.0, 0.3), ("B", 3.0, -0.4), ("C", 4.0, 0.0)):
        noise = rng.normal(0, 0.3, 12)
        rows.append(
            pd.DataFrame(
                {
                    "system_id": system,
                    "f": label + offset + noise - noise.mean(),
                    "u": 0.5,
                    "label": label,
                    "prior_mean": label + 0.2,
                    "prior_var": 0.04,
                }
            )
        )
    figures, match = bench.interval_figures(pd.concat(rows), 3, 0.2, 0.1, "student", 0, (5,), with_match=False)
    shift, level = figures["0"]["shift"], figures["0"]["level"]
    assert shift["rms"] == pytest.approx(math.sqrt((0.09 + 0.16) / 3))
    assert {s: v["mean_error"] for s, v in shift["per_system"].items()} == pytest.approx({"A": 0.3, "B": -0.4, "C": 0})
    assert level["rms"] == pytest.approx(0.2) and level["worst_system"] in "ABC"
    # half-widths t_{0.95, 2} · RMS of the other two errors: A 0.83, B 0.62, C 1.03; B comes nearest its edge
    assert shift["worst_system"] == "B" and shift["missed"] == []
    assert figures["5"]["classical"]["rms"] == pytest.approx(0.0, abs=1e-12)
    assert figures["5"]["classical"]["coverage"] == 1.0
    assert figures["5"]["ppi"]["rms"] > 0.01  # PPI's estimate carries the unlabelled texts' mean score
    assert match is None
