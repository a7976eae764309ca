"""The model names as a table (``llmrubric models list``): each with its class, its settings and its places
(importing :mod:`llmrubric.model` first, as importing this module does, registers every class)."""

from __future__ import annotations

from llmrubric.model.core.registry import classes, entry, names


def model_rows() -> list[dict]:
    """One row per name (:func:`llmrubric.model.core.registry.names`): ``name``, ``class``, ``settings``
    (a preset's model file and parameters), ``auto`` (``default N``, ``candidate`` or empty) and ``report``."""
    rows = []
    for name in names():
        e = entry(name)
        settings = ([f"model={e.model}"] if e.model else []) + [f"{k}={v}" for k, v in e.params.items()]
        place = e.capabilities.default_candidate
        rows.append(
            {
                "name": name,
                "class": e.cls,
                "settings": " ".join(settings) or ("(the class)" if name in classes() else ""),
                "auto": f"default {place}" if place else ("candidate" if e.candidate else ""),
                "report": str(e.capabilities.report_default or ""),
            }
        )
    return rows


def model_table() -> str:
    """:func:`model_rows` as aligned text columns."""
    rows = model_rows()
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(r[k].ljust(widths[k]) for k in keys).rstrip() for r in rows]
    return "\n".join(lines)
