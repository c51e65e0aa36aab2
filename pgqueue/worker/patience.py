"""How the worker waits out a database that keeps it waiting: the pauses between tries of
something that keeps failing.

``Pauses`` is the one capped exponential backoff of the worker's own tries (reconnecting, an
outage, a failing claim, outcomes kept aside); each user gives its own first and longest pause.
It is not the retry schedule of a failed job attempt, which ``pgqueue.backoff`` decides.
"""

from __future__ import annotations


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
