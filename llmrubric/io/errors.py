"""The one exception type for bad input (it names the file, row and column) and the
one-line error reporting shared by every entry point."""

from __future__ import annotations

import functools
import os
import sys


class InputError(ValueError):
    """Bad input data or configuration, with where it was found (``line``: of a text file read line by line)."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        row: int | None = None,
        column: str | int | None = None,
        setting: str | None = None,
        line: int | None = None,
    ):
        self.file, self.row, self.column, self.setting, self.line = file, row, column, setting, line
        where = ", ".join(
            part
            for part in (
                str(file) if file else "",
                f"line {line}" if line is not None else "",
                f"row {row}" if row is not None else "",
                f"column {column!r}" if column else "",
                f"setting {setting}" if setting else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


class NotApplicableError(InputError):
    """A model (or its system level) that these data cannot fit, declared where the model checks its data:
    ``model=auto`` records the reason and goes on without it; any other error in a candidate stops the run."""


class TrainingDiverged(RuntimeError):
    """A network's training loss became non-finite (e.g. a learning rate that is too high)."""


class JobFailed(RuntimeError):
    """A launched job (an extraction shard) failed or was killed; the message names its log."""


USER_ERRORS = (InputError, TrainingDiverged, JobFailed)


def yaml_error(error: Exception, file: str | None = None) -> InputError:
    """A PyYAML syntax error as one :class:`InputError` naming the file, line and column (1-based) of the problem,
    and where the construct it breaks began (``while parsing a flow mapping at line 2, column 13``)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or " ".join(str(error).split())
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and start is not None:
        problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
    elif context:
        problem += f" ({context})"
    where = file or (getattr(mark, "name", None) if mark is not None else None)
    if mark is None:
        return InputError(f"not valid YAML: {problem}", file=where)
    return InputError(f"not valid YAML: {problem}", file=where, line=mark.line + 1, column=mark.column + 1)


def report(error: BaseException) -> int:
    """Print a user error (``error: <what is wrong>``) or Ctrl-C on one line and return the
    exit code (2 or 130); anything else, or ``HYDRA_FULL_ERROR=1``, is re-raised with its traceback."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or not isinstance(error, (*USER_ERRORS, KeyboardInterrupt)):
        raise error
    if isinstance(error, KeyboardInterrupt):
        print(
            "interrupted (Ctrl-C): finished outputs are kept, nothing partial was written; run again to resume",
            file=sys.stderr,
        )
        return 130
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


def reports_errors(func):
    """Wrap an entry point (``train.py``, ``evaluate.py``): see :func:`report`; exits with its code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (*USER_ERRORS, KeyboardInterrupt) as e:
            sys.exit(report(e))

    return wrapper
