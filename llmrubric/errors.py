"""The one exception type for bad input (it names the file, row and column) and the
one-line error reporting shared by every entry point."""

from __future__ import annotations

import functools
import os
import sys


class InputError(ValueError):
    """Bad input data or configuration, with where it was found."""

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None, column: str | None = None, setting: str | None = None):
        self.file, self.row, self.column, self.setting = file, row, column, setting
        where = ", ".join(
            part
            for part in (
                str(file) if file else "",
                f"row {row}" if row is not None else "",
                f"column {column!r}" if column else "",
                f"setting {setting}" if setting else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


class TrainingDiverged(RuntimeError):
    """A network's training loss became non-finite (e.g. a learning rate that is too high)."""


USER_ERRORS = (InputError, TrainingDiverged)


def reports_errors(func):
    """Wrap an entry point: a user error prints ``error: <what is wrong>`` on one line and
    exits 2; Ctrl-C prints one line and exits 130. ``HYDRA_FULL_ERROR=1`` re-raises, with
    the traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except KeyboardInterrupt:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print("interrupted (Ctrl-C); finished outputs are kept, nothing partial was written", file=sys.stderr)
            sys.exit(130)
        except USER_ERRORS as e:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            sys.exit(2)

    return wrapper
