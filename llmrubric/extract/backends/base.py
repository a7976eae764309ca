"""The backend interface: tasks in, results out, one at a time as they are computed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError


class Backend(ABC):
    """Scores tasks: for each, the probability of each label as the model's answer."""

    @property
    @abstractmethod
    def model_id(self) -> str:
        """Names the model and every setting that changes its numbers (part of the cache key)."""

    @abstractmethod
    def score(self, tasks: Sequence[Task]) -> Iterator[Result]:
        """Yield one :class:`Result` per task, in any order, as soon as each is known."""

    def check(self) -> None:
        """Before a run opens its cache: an InputError if the backend cannot answer at all (a server that is down)."""

    def stop(self) -> None:
        """Ctrl-C: send nothing more (a server backend); the results of requests in flight still come."""
        raise KeyboardInterrupt

    def watch(self, interrupted: Callable[[], bool]) -> None:
        """During a run, ``interrupted()`` is true from the moment Ctrl-C reaches the process, in any thread
        (:func:`llmrubric.extract.runner.stop_on_interrupt`): a server backend sends nothing once it is, before the
        main thread gets to run its handler. A local backend stops in that handler."""

    def close(self) -> None:
        """Release resources."""


def check_labels(question_id: str, labels: Sequence[str], token_ids: Sequence[Sequence[int]]) -> None:
    """Labels must tokenise to distinct sequences, none a prefix of another.

    A label whose tokens begin another's would count the other's mass as its own.
    """
    for i, a in enumerate(token_ids):
        if not a:
            raise InputError(f"question {question_id!r}: label {labels[i]!r} tokenises to nothing")
        for j, b in enumerate(token_ids):
            if i != j and len(a) <= len(b) and tuple(b[: len(a)]) == tuple(a):
                what = "the same tokens as" if len(a) == len(b) else "a token prefix of"
                raise InputError(
                    f"question {question_id!r}: option labels collide after tokenisation: {labels[i]!r} {list(a)} is "
                    f"{what} {labels[j]!r} {list(b)}; use labels that differ in their tokens"
                )
