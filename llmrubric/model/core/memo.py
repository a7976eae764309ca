"""One fit's tables encoded once: within :func:`one_encoding` (``model=auto``'s fit), each :func:`memoised` function
of the tables (their pairs, targets, feature matrices, answer model) is computed the first time a candidate, level
or interval calibration asks for it and read by every later one. Outside it they compute as they always do.

The arguments are the key: a hashable one by value (a :class:`~llmrubric.model.core.encoding.FeatureLayout`, a
question id), any other (tables, data frames, a question) by identity, kept alive while the scope lasts so that
its identity is not reused. Arrays handed out from the memo are read-only: a caller that would change them fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps

import numpy as np

_MEMO: ContextVar[dict | None] = ContextVar("llmrubric_encodings", default=None)


@contextmanager
def one_encoding() -> Iterator[None]:
    """Within it, every :func:`memoised` call is computed once per distinct arguments (a nested scope shares the
    outer one's)."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def memoised(function: Callable) -> Callable:
    """``function`` computed once per distinct arguments within :func:`one_encoding` (module doc)."""

    @wraps(function)
    def wrapper(*args, **kwargs):
        memo = _MEMO.get()
        if memo is None:
            return function(*args, **kwargs)
        kept = [*args, *kwargs.values()]
        key = (function.__qualname__, tuple(_key(a) for a in args), tuple((k, _key(v)) for k, v in kwargs.items()))
        if key not in memo:
            memo[key] = (kept, _read_only(function(*args, **kwargs)))
        return memo[key][1]

    return wrapper


def _read_only(value):
    """``value`` with its arrays (itself, or the items of a tuple) made read-only."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, tuple):
        for item in value:
            _read_only(item)
    return value


def _key(value):
    """A hashable value itself, a list its items' keys, anything else its identity."""
    if isinstance(value, (list, tuple)):
        return tuple(_key(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value if isinstance(value, (str, int, float, bool, type(None))) or _frozen(value) else ("id", id(value))


def _frozen(value) -> bool:
    """A frozen dataclass (hashed by value)."""
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params and params.frozen)
