"""How the worker waits out a database that keeps it waiting: the pauses between tries of
something that keeps failing, and writes tried in parts when a row another transaction holds
keeps one waiting.

``Pauses`` is the one capped exponential backoff of the worker's own tries (reconnecting, an
outage, a failing claim, outcomes kept aside); each user gives its own first and longest pause.
It is not the retry schedule of a failed job attempt, which ``pgqueue.backoff`` decides.

``lock_timeout`` and ``write_apart`` serve the writes that wait a bounded time for row locks
(outcome batches, rescue passes): a part that needs a held row is kept back, the others are
written at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TypeVar

from pgqueue.sqlstates import is_timeout

P = TypeVar("P")


class Pauses:
    """The pauses between tries: ``first``, then each twice the one before, ``longest`` at
    most; ``reset`` once a try worked, so the next failure starts again at ``first``."""

    __slots__ = ("_next", "first", "longest")

    def __init__(self, first: float, longest: float) -> None:
        self.first = first
        self.longest = longest
        self._next = first

    def next(self) -> float:
        """The pause before the next try (the one after it is twice as long, up to
        ``longest``)."""
        pause = self._next
        self._next = min(pause * 2, self.longest)
        return pause

    def reset(self) -> None:
        self._next = self.first


def lock_timeout(write: Callable[[], object]) -> BaseException | None:
    """Run ``write``, which waits a bounded time for row locks: the lock or statement timeout
    that ended it (nothing written), else None. Any other error is raised."""
    try:
        write()
    except Exception as exc:
        if not is_timeout(exc):
            raise
        return exc
    return None


def write_apart(
    parts: Iterable[P], write: Callable[[P], object]
) -> tuple[list[P], BaseException | None]:
    """Write each of ``parts`` on its own (``lock_timeout``), so that a held row keeps back only
    the parts that need it: those kept back, in order, and the last timeout they met (None
    when every part was written)."""
    held: list[P] = []
    error: BaseException | None = None
    for part in parts:
        timeout = lock_timeout(functools.partial(write, part))
        if timeout is not None:
            held.append(part)
            error = timeout
    return held, error
