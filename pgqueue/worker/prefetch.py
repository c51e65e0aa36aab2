"""How many attempts a worker claims ahead of its free slots (its prefetch).

A claim that takes only the free slots costs a round trip and a commit for a few jobs, and a
worker whose jobs take a millisecond spends more time claiming than running them. Claiming
ahead amortizes that, but a claimed job waits in this worker while another worker might have
run it, so the claimer keeps ahead only what it would start within ``PREFETCH_WINDOW`` at its
recent pace: as many as its handlers returned (slots came free) in that time (``Pace``),
capped by the ``prefetch`` setting. Quick jobs get a deep prefetch, slow ones none (a burst of
starts is no pace: a job claimed ahead behind slow handlers would wait while another worker's
slot is free), and a worker that has just started or was idle claims for its free slots only.
"""

from __future__ import annotations

import collections
import math

# Seconds of work, at the worker's recent pace, that it claims ahead of its free slots.
PREFETCH_WINDOW = 0.05


class Pace:
    """The handler returns of the last ``window`` seconds, from readings of a counter."""

    def __init__(self, cap: int, window: float = PREFETCH_WINDOW) -> None:
        self.cap = cap
        self.window = window
        self._readings: collections.deque[tuple[float, int]] = collections.deque()

    def ahead(self, now: float, returned: int) -> int:
        """How many attempts to keep waiting: the handler returns in the last ``window``
        seconds before ``now`` (``returned``: the counter now), at most ``cap``."""
        if self.cap <= 0:
            return 0
        readings = self._readings
        readings.append((now, returned))
        # Keep one reading at or before the window's start, the base of the count.
        since = now - self.window
        while len(readings) > 1 and readings[1][0] <= since:
            readings.popleft()
        base_time, base_count = readings[0]
        elapsed = now - base_time
        recent = returned - base_count
        if elapsed > self.window:
            recent = math.ceil(recent * self.window / elapsed)
        return min(self.cap, recent)
