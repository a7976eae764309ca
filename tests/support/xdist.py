"""Whether the suite runs over several pytest-xdist workers (``pytest -n N``, N > 1): they share the cores."""

from __future__ import annotations

import os


def several_workers() -> bool:
    """True under ``pytest -n N`` with N > 1 (xdist sets ``PYTEST_XDIST_WORKER_COUNT`` in each worker)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
