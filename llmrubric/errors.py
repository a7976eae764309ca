"""The one exception type for bad input: it names the file, row and column."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input data or configuration, with where it was found."""

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None, column: str | None = None):
        self.file, self.row, self.column = file, row, column
        where = ", ".join(
            part
            for part in (
                str(file) if file else "",
                f"row {row}" if row is not None else "",
                f"column {column!r}" if column else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


class TrainingDiverged(RuntimeError):
    """A network's training loss became non-finite (e.g. a learning rate that is too high)."""
