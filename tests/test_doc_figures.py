"""Every figure the docs quote from ``benchmarks/results/*.json`` is that JSON's value.

README.md, docs/*.md and benchmarks/README.md mark each such figure with its source,
``0.266<!-- ir_real.json: query_groups5.llm_rubric.spearman -->`` (syntax: the top of benchmarks/README.md);
the shown number must be the value rounded to the decimals shown, and the file and key must exist.
"""

from __future__ import annotations

import pytest
from support.figures import DOCS, markers, problem
from support.paths import ROOT


def _all_markers():
    return [m for doc in DOCS for m in markers(doc.read_text(encoding="utf-8"), str(doc.relative_to(ROOT)))]


def test_every_marked_figure_is_its_json_value():
    found = _all_markers()
    problems = [p for p in map(problem, found) if p]
    assert not problems, f"{len(problems)} of {len(found)} marked figures differ from their JSON:\n" + "\n".join(
        problems
    )


def test_the_docs_mark_their_figures():
    """The parser finds the markers the docs hold (a broken pattern would check nothing)."""
    found = _all_markers()
    assert len(found) >= 500, f"only {len(found)} markers found"
    for name in ("docs/limitations.md", "docs/models.md", "docs/ir.md", "benchmarks/README.md"):
        assert any(m.where.startswith(f"{name}:") for m in found), f"no marker in {name}"


@pytest.mark.parametrize(
    ("text", "number", "percent", "path"),
    [
        ("| 0.266<!-- x.json: a.b --> |", "0.266", False, "a.b"),
        ('seed 0: −1.215<!--x.json:  a."b.c/d".0  --> and', "\u22121.215", False, 'a."b.c/d".0'),
        ("1,187<!-- x.json: n --> tests", "1,187", False, "n"),
        ("0.014-0.015<!-- x.json: d -->", "0.015", False, "d"),
        ("coverage 92 %<!-- x.json: c -->", "92", True, "c"),
        ("a marker alone <!-- x.json: c -->", None, False, "c"),
    ],
)
def test_markers_parse(text, number, percent, path):
    (m,) = markers(text, "doc.md")
    assert (m.where, m.number, m.percent, m.file, m.path) == ("doc.md:1", number, percent, "x.json", path)


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("0.266<!-- ir_real.json: query_groups5.llm_rubric.spearman -->", None),
        ("−0.366<!-- ir_real.json: query_groups5.label_frequencies.alpha -->", None),
        ("0.267<!-- ir_real.json: query_groups5.llm_rubric.spearman -->", "0.266 to the decimals shown"),
        ("0.266<!-- ir_real.json: query_groups5.llm_rubric.spearmann -->", "no key 'spearmann'"),
        ("0.266<!-- ir_reel.json: query_groups5.llm_rubric.spearman -->", "no file benchmarks/results/ir_reel.json"),
        ("0.27 <!-- ir_real.json: query_groups5.llm_rubric.spearman -->", "no number right before the marker"),
        ("1<!-- ir_real.json: meta.command -->", "is not a number"),
        ("1<!-- ir_real.json: meta.runs..x -->", "cannot parse the key path"),
        ('0.2<!-- auto.json: "targets_issue41" -->', "is not a number"),
    ],
)
def test_a_wrong_marker_is_caught(text, wrong):
    (m,) = markers(text, "doc.md")
    found = problem(m)
    if wrong is None:
        assert found is None
    else:
        assert found and wrong in found and found.startswith("doc.md:1: "), found
