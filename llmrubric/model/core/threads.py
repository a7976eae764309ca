"""Thread settings for the small-matrix work of training and scoring, in one place.

The calibration networks are tiny: more threads than one only add contention. Callers wrap
the work in :func:`one_thread` (restored afterwards); worker processes call
:func:`single_threaded` once at start.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits


@contextmanager
def one_thread(blas: bool = False, flush_denormal: bool = False):
    """Torch on one thread while inside; with ``blas``, the BLAS/OpenMP pools of numpy and
    scikit-learn too; with ``flush_denormal``, denormal floats flushed to zero (Adam's decaying
    moments turn denormal, which is many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    flushed = flush_denormal and torch.set_flush_denormal(True)
    try:
        if blas:
            with threadpool_limits(1):
                yield
        else:
            yield
    finally:
        if flushed:
            torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def single_threaded() -> None:
    """One thread for torch and the BLAS/OpenMP pools for the rest of this (worker) process."""
    torch.set_num_threads(1)
    threadpool_limits(1)
