"""JSON lines of a (gzip-compressed or plain) file, numbered, each parse error one :class:`InputError`
naming the file and line; checks of their fields (a ValueError, which the caller names by line)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from llmrubric.io.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


def _open(path: Path):
    with path.open("rb") as f:
        compressed = f.read(2) == GZIP_MAGIC
    return gzip.open(path, "rt", encoding="utf-8") if compressed else path.open(encoding="utf-8")


def json_lines(path: str | Path, what: str, progress: bool = False) -> Iterator[tuple[int, object]]:
    """``(line number, parsed value)`` of every non-blank line; a file that is missing, empty, not
    UTF-8 or not gzip where it says so, or a line that is not JSON, is an :class:`InputError`."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found", file=str(path))
    seen = False
    try:
        with _open(path) as f:
            for n, line in enumerate(tqdm(f, desc=path.name, unit=" lines", disable=not progress, leave=False), 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"not valid JSON ({e.msg})", file=str(path), line=n) from None
                seen = True
                yield n, value
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the {what} file ({e})", file=str(path)) from None
    if not seen:
        raise InputError(f"the {what} file has no lines", file=str(path))


def an_id(value, what: str) -> str:
    """``value`` (a string or integer) as a stripped string id; ValueError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ValueError(f"{what} {value!r} is not a non-empty string")
    return str(value).strip()


def a_list(value, what: str) -> list:
    """``value`` as a list (None: empty); ValueError naming ``what`` otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    return value


def an_object(value, what: str) -> dict:
    """``value`` if it is a JSON object; ValueError naming ``what`` otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object")
    return value
