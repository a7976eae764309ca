"""benchmarks/intervals.py: the per-group figures of the LLMJudge and LLM-Rubric parts."""

import sys

import pandas as pd
import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import intervals as bench  # noqa: E402


def test_group_figures_name_the_worst_groups_and_count_those_under():
    # q1: 5 of 10 inside (under 0.8, and beyond chance at 0.9); q2: 7 of 10 (under, not beyond chance: p 0.07);
    # q3: 10 of 10; q4: 2 of 2
    inside = [1] * 5 + [0] * 5 + [1] * 7 + [0] * 3 + [1] * 10 + [1] * 2
    query = ["q1"] * 10 + ["q2"] * 10 + ["q3"] * 10 + ["q4"] * 2
    pairs = pd.DataFrame(
        {"inside": [bool(i) for i in inside], "width": 1.0, "error": 0.5, "p_answer": 0.5, "query": query}
    )
    got = bench.group_figures(pairs, "query", 0.9)
    assert (got["groups"], got["share_under"], got["significant_under"]) == (4, 0.5, 1)
    assert got["worst"] == ["q1", "q2", "q3"] and list(got["per_group"]) == ["q1", "q2", "q3", "q4"]
    assert got["per_group"]["q2"]["coverage"] == pytest.approx(0.7) and got["per_group"]["q2"]["pairs"] == 10
    assert 0.05 < got["per_group"]["q2"]["p_under"] < 0.08 and got["per_group"]["q1"]["p_under"] < 0.01
    assert (got["min_coverage"], got["max_coverage"]) == (0.5, 1.0)
    pooled = bench.pooled_figures(pairs)
    assert pooled["coverage"] == pytest.approx(24 / 32) and pooled["pair_nll"] == pytest.approx(0.6931, abs=1e-4)
