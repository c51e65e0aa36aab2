"""Waiting in tests for something a worker or another process does: poll a condition until it
holds, or fail naming what was awaited. A test waits for the event it needs (a row, a log line,
a worker registered), never a fixed time, unless the time itself is what it tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; fail with ``what``
    once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
