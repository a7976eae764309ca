"""The report's files: Markdown and HTML (Jinja2 templates in ``llmrubric/report/templates``), the
numbers as JSON, one CSV per table and the figures."""

from __future__ import annotations

import base64
import json
import math
from functools import cache
from pathlib import PurePosixPath

import jinja2
import pandas as pd

from llmrubric.io.files import json_safe
from llmrubric.report.tables import Section, Sup


def report_files(title: str, meta: dict, sections: list[Section]) -> dict[str, bytes]:
    """Every file of the report folder: relative path → bytes."""
    files: dict[str, bytes] = {}
    for section in sections:
        for table in section.tables:
            files[table.csv] = table.data.to_csv(index=False).encode()
        for _, name, data in section.figures:
            files[f"figures/{name}"] = data
    files["report.md"] = render_markdown(title, meta, sections).encode()
    files["report.html"] = render_html(title, meta, sections).encode()
    numbers = json.dumps(json_safe(numbers_json(sections, meta)), indent=2, allow_nan=False)
    files["report.json"] = (numbers + "\n").encode()
    return files


def render_markdown(title: str, meta: dict, sections: list[Section]) -> str:
    """``report.md``: tables as Markdown, figures linked from ``figures/``."""
    text = _environment().get_template("report.md.j2").render(title=title, meta=meta, sections=sections)
    return text.rstrip("\n") + "\n"


def render_html(title: str, meta: dict, sections: list[Section]) -> str:
    """``report.html``: one self-contained page, figures embedded as data URIs."""
    return _environment().get_template("report.html.j2").render(title=title, meta=meta, sections=sections)


def numbers_json(sections: list[Section], meta: dict) -> dict:
    """``report.json``: the meta data and every section's numbers (tables as records, NaN as None)."""
    out: dict = {"meta": meta}
    for section in sections:
        out[section.key] = {k: (_records(v) if isinstance(v, pd.DataFrame) else v) for k, v in section.numbers.items()}
    return out


def _records(df: pd.DataFrame) -> list[dict]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        for row in df.to_dict(orient="records")
    ]


def _cell(cell) -> Sup:
    return cell if isinstance(cell, Sup) else Sup(str(cell))


def _md_cell(cell) -> str:
    if isinstance(cell, Sup):
        return cell.text + (f"<sup>{cell.sup}</sup>" if cell.sup else "")
    return str(cell).replace("|", "\\|")


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("llmrubric.report", "templates"),
        autoescape=jinja2.select_autoescape(["html.j2"], default=False),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        cell=_cell,
        md_cell=_md_cell,
        stem=lambda name: PurePosixPath(name).stem,
        b64=lambda data: base64.b64encode(data).decode("ascii"),
    )
    return env
