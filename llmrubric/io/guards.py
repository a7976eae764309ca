"""Checks run before any work: settings in range, outputs that can be written and that
overwrite neither each other nor an input."""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path

from llmrubric.io.errors import InputError


def check_range(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    integer: bool = False,
):
    """``value`` as a number (int with ``integer``) within [low, high] (ends open as asked), else an error naming the setting."""
    try:
        number = float(value)
        if integer and (not number.is_integer() or isinstance(value, bool)):
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(f"{value!r} is not {'an integer' if integer else 'a number'}", setting=name) from None
    too_low = low is not None and (number <= low if open_low else number < low)
    too_high = high is not None and (number >= high if open_high else number > high)
    if not math.isfinite(number) or too_low or too_high:
        left = "(" if open_low else "["
        right = ")" if open_high else "]"
        span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        raise InputError(f"{value!r} is outside {span}", setting=name)
    return int(number) if integer else number


def check_choice(name: str, value, choices) -> str:
    """``value`` if it is one of ``choices``, else an error naming the setting, the choice meant and the choices."""
    if value not in choices:
        raise InputError(f"{value!r} is not one of {list(choices)}{did_you_mean(value, choices)}", setting=name)
    return value


def closest(name, names, n: int = 1) -> list[str]:
    """The names of ``names`` closest to ``name`` (:func:`difflib.get_close_matches`), best first; [] when none is close."""
    return difflib.get_close_matches(str(name), [str(x) for x in names], n=n, cutoff=0.6)


def did_you_mean(name, names, n: int = 1) -> str:
    """``"; did you mean 'main'?"`` (the names closest to ``name``), or "" when none is close."""
    near = closest(name, names, n)
    return f"; did you mean {' or '.join(repr(x) for x in near)}?" if near else ""


def check_writable_dir(path: str | Path, name: str = "output folder") -> Path:
    """A folder that exists (or can be created) and is writable; a file in its place is an error."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise InputError(f"the {name} {str(path)!r} is (inside) a file, not a folder", file=str(probe))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"the {name} is not writable", file=str(probe))
    return path


def check_outputs(outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None] | None = None) -> None:
    """Outputs must differ from each other and from every input, and their folders be writable."""
    seen: dict[Path, str] = {}
    for name, path in (inputs or {}).items():
        if path is not None:
            seen.setdefault(Path(path).resolve(), f"input {name}")
    for name, path in outputs.items():
        if path is None:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise InputError(
                f"output {name} would overwrite {seen[resolved]} (the same file)", file=str(path), column=name
            )
        if resolved.is_dir():
            raise InputError(f"output {name} is a folder", file=str(path), column=name)
        check_writable_dir(resolved.parent)
        seen[resolved] = f"output {name}"
