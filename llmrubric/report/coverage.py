"""The report's coverage section: observed against nominal coverage of the conformal intervals of the
experiment's own checkpoints on their held-out texts (``evaluate.py`` computes the curve; nothing is
trained here)."""

from __future__ import annotations

import pandas as pd

from llmrubric.report.plots import png_bytes
from llmrubric.report.tables import Section, Table, fmt
from llmrubric.scoring.intervals import coverage_figure


def coverage_section(curve: list[dict], question_id: str, nominal: float) -> Section:
    """Coverage and mean width at each nominal level of ``curve`` (:func:`~llmrubric.scoring.intervals.coverage_curve`)."""
    data = pd.DataFrame(curve)[["nominal", "coverage", "width"]]
    rows = [[f"{100 * c['nominal']:g} %", fmt(c["coverage"]), fmt(c["width"])] for c in curve]
    title = f"{question_id}: conformal intervals on held-out pairs"
    text = (
        f"Each held-out (text, judge) answer of {question_id} against its conformal interval from the split's checkpoint "
        f"(calibrated on that checkpoint's out-of-fold training predictions); observed share inside against the "
        f"nominal coverage, with the mean width beside each point. The guarantee is marginal over texts exchangeable "
        f"with the training texts (docs/scoring.md); predictions carry lo and hi at {100 * nominal:g} %."
    )
    return Section(
        "coverage",
        "Coverage of the intervals",
        text,
        [Table("Coverage", ["nominal", "observed", "mean width"], rows, "coverage.csv", data)],
        [(title, "coverage.png", png_bytes(coverage_figure(curve, title)))],
        numbers={"nominal": nominal, "curve": data},
    )
