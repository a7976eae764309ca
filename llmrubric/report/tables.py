"""The report's parts: sections of tables (cells with significance marks), figures, notes and numbers;
the number formats of its cells."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Sup:
    """A table cell with Table 1-style significance marks."""

    text: str
    sup: str = ""


@dataclass
class Table:
    """A table as shown (``header`` and ``rows``; no header: only linked) and every number of it (``data``, written to ``csv``)."""

    caption: str
    header: list[str]
    rows: list[list]
    csv: str
    data: pd.DataFrame


@dataclass
class Section:
    """A report section: text, tables, figures ``(caption, file name, PNG bytes)``, notes and the numbers of report.json."""

    key: str
    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}f}"


def fmt_ci(value, low, high) -> str:
    return f"{fmt(value)} [{fmt(low)}, {fmt(high)}]" if math.isfinite(low) and math.isfinite(high) else fmt(value)


def fmt_p(p) -> str:
    return "—" if p is None or not math.isfinite(p) else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}")
