"""benchmarks/identity.py: what it reports where two runs' predictions differ."""

import sys

import pandas as pd
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import identity as bench  # noqa: E402


def test_differences_name_the_columns_that_moved_and_those_only_one_run_has():
    before = pd.DataFrame({"text_id": ["a", "b"], "p": [0.25, 0.75], "mean": [1.0, 2.0], "lo": [1.0, 1.0]})
    after = pd.DataFrame({"text_id": ["a", "b"], "p": [0.25, 0.5], "mean": [1.0, 2.0], "hi": [2.0, 3.0]})
    assert bench.differences(before, after) == {"p": 0.25, "columns_in_one": ["hi", "lo"]}
    assert bench.differences(before, before) == {}
    assert bench.differences(before, after.iloc[:1]) == {"rows": [2, 1]}


def test_identity_rows_finds_a_moved_figure_and_skips_timings():
    import identity_rows

    before = {"a": {"nll": 1.0, "seconds": 3.0, "rows": [0.5, float("nan")]}, "meta": {"commit": "x"}}
    after = {"a": {"nll": 1.25, "seconds": 9.0, "rows": [0.5, float("nan")], "new": 2.0}, "meta": {"commit": "y"}}
    record = identity_rows.compare(before, after)
    assert (record["compared"], record["identical"]) == (3, 2)
    assert record["differing"] == [{"path": "a.nll", "before": 1.0, "after": 1.25, "difference": 0.25}]
    assert record["only_after"] == ["a.new"]
    assert identity_rows.compare(before, after, tolerance=0.3)["identical"] == 3
    assert record["max_difference"] == 0.25
    assert identity_rows.compare(before, after, only=r"\.rows\.")["compared"] == 2
