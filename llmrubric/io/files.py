"""Files written atomically (a failure leaves nothing partial): tables by their suffix, text,
JSON and whole folders."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.errors import InputError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success,
    with the permissions the user's umask gives a new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_folder(out_dir: str | Path, files: dict[str, bytes]) -> Path:
    """Write ``files`` (relative path → bytes) as the folder ``out_dir``, atomically.

    Everything goes to a temporary sibling folder that is renamed onto ``out_dir``; an
    existing folder there is replaced only once the new one is complete.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        for rel, data in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.chmod(tmp, 0o777 & ~_umask())
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
            os.rename(out, old / out.name)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / out.name).exists() and not out.exists():
            os.rename(old / out.name, out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out


TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".jsonl")


def check_table_path(path: str | Path, name: str) -> Path:
    """An output table path with a known format suffix (checked before any work)."""
    path = Path(path)
    if path.suffix not in TABLE_SUFFIXES:
        raise InputError(
            f"unknown table format {path.suffix!r} (use {', '.join(TABLE_SUFFIXES)})", file=str(path), setting=name
        )
    return path


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a table by its suffix, atomically: a failure leaves no partial file."""
    path = Path(path)
    writers = {
        ".parquet": lambda t: df.to_parquet(t, index=False),
        ".csv": lambda t: df.to_csv(t, index=False),
        ".tsv": lambda t: df.to_csv(t, sep="\t", index=False),
        ".jsonl": lambda t: df.to_json(t, orient="records", lines=True),
    }
    if path.suffix not in writers:
        raise InputError(f"unknown table format {path.suffix!r} (use .csv, .tsv, .parquet or .jsonl)", file=str(path))
    with atomic_path(path) as tmp:
        writers[path.suffix](tmp)
    return path


def write_text(text: str, path: str | Path) -> Path:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(data: dict, path: str | Path) -> Path:
    """Write JSON atomically (see :func:`json_text`)."""
    return write_text(json_text(data), path)


def json_text(data: dict) -> str:
    """``data`` as indented JSON text (NumPy scalars converted, non-finite floats as null: never a bare NaN)."""
    return json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n"


def json_safe(value):
    """``value`` with NumPy scalars and arrays as Python values and non-finite floats as None."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (str, int)) or value is None:
        return value
    if value is pd.NA or value is pd.NaT:
        return None
    return _json_default(value)


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value)}")
