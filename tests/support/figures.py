"""Figures quoted in the docs from ``benchmarks/results/*.json``, each with its source marker.

A marker is an HTML comment right after the number it sources (``0.266<!-- ir_real.json:
query_groups5.llm_rubric.spearman -->``; syntax in ``benchmarks/README.md``). ``markers`` finds them in a
Markdown text, ``problem`` says what is wrong with one (its file or key missing, its value not a number, or a
number that is not the value rounded to the decimals shown) or returns None.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache

from support.paths import ROOT

RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
MINUS = "\u2212"
# a sign only after a space, (, [, | or / (else 0.18-0.58 would read −0.58); no digit, letter, dot or comma before
NUMBER = (
    rf"(?P<number>(?:(?<![^\s(\[|/])[+{MINUS}-])?(?<![\w.,])(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?)(?P<percent>\s?%)?"
)
MARKER = r"<!--\s*(?P<file>[\w.-]+\.json):\s*(?P<path>.*?)\s*-->"
SOURCED = re.compile(NUMBER + MARKER)
ANY_MARKER = re.compile(MARKER)
SEGMENT = re.compile(r'"(?P<quoted>[^"]*)"|(?P<plain>[\w-]+)')


@dataclass(frozen=True)
class Marker:
    where: str  # doc:line
    number: str | None  # the figure as shown (None: no number right before the marker)
    percent: bool  # shown with a % sign: the JSON holds the fraction
    file: str  # under benchmarks/results
    path: str  # dotted keys and list indices, a key with other characters than [A-Za-z0-9_-] in double quotes

    def __str__(self) -> str:
        return f"{self.where}: {self.number}<!-- {self.file}: {self.path} -->"


def markers(text: str, doc: str) -> list[Marker]:
    """Every marker of a Markdown text, in order; ``doc`` names the text in ``Marker.where``."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        sourced = {m.start("file"): m for m in SOURCED.finditer(line)}
        for m in ANY_MARKER.finditer(line):
            s = sourced.get(m.start("file"))
            number, percent = (s["number"], bool(s["percent"])) if s else (None, False)
            found.append(Marker(f"{doc}:{n}", number, percent, m["file"], m["path"]))
    return found


def keys(path: str) -> list[str]:
    """The keys of a marker's path (``a."b.c".0`` → ``["a", "b.c", "0"]``); ValueError if it does not parse."""
    out, rest = [], path
    while True:
        m = SEGMENT.match(rest)
        if not m:
            raise ValueError(f"cannot parse the key path {path!r} at {rest!r}")
        out.append(m["plain"] if m["plain"] is not None else m["quoted"])
        rest = rest[m.end() :]
        if not rest:
            return out
        if not rest.startswith("."):
            raise ValueError(f"cannot parse the key path {path!r} at {rest!r}")
        rest = rest[1:]


@cache
def result(file: str):
    return json.loads((RESULTS / file).read_text(encoding="utf-8"))


def value(file: str, path: str):
    """The value at ``path`` in ``benchmarks/results/<file>``; KeyError naming the first missing key."""
    node = result(file)
    for i, key in enumerate(keys(path)):
        if isinstance(node, list) and re.fullmatch(r"\d+", key) and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise KeyError(f"no key {key!r} after {'.'.join(keys(path)[:i]) or 'the top level'}")
    return node


def problem(marker: Marker) -> str | None:
    """What is wrong with a marker, or None when its number is its JSON value rounded to the decimals shown."""
    if marker.number is None:
        return f"{marker}: no number right before the marker"
    if not (RESULTS / marker.file).is_file():
        return f"{marker}: no file benchmarks/results/{marker.file}"
    try:
        v = value(marker.file, marker.path)
    except (KeyError, ValueError) as e:
        return f"{marker}: {e.args[0]}"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return f"{marker}: the JSON value {v!r} is not a number"
    shown = marker.number.replace(MINUS, "-").replace(",", "")
    decimals = len(shown.partition(".")[2])
    v = v * 100 if marker.percent else v
    if abs(float(shown) - v) > 0.5 * 10**-decimals + 1e-9:
        return f"{marker}: the JSON has {v!r}, {v:.{decimals}f} to the decimals shown"
    return None
