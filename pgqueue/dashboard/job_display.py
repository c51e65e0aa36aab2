"""How the dashboard shows a job's error and timing: a one-line error summary for the job list,
a readable duration, and an error history with repeated failures folded together.

The summary is ``pgqueue.errors.error_summary``'s, the line the worker logs and the CLI prints,
so that the three name a failure alike (the job list's cell ends it with an ellipsis where its
width runs out). Two errors count as the same failure when they differ
only in memory addresses (``<object at 0x7f3a...>``), which change from run to run; line numbers
and messages still tell failures apart.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Final

from pgqueue.errors import error_summary as error_summary

# The tooltip holds the full text, up to this much (a traceback of a deep stack is long).
TOOLTIP_LENGTH: Final = 4000
ADDRESS: Final = re.compile(r"0x[0-9a-fA-F]+")


@dataclass(frozen=True, slots=True)
class ErrorRun:
    """Consecutive attempts that failed the same way: the first one's text and timestamps."""

    error: str
    count: int
    first_attempt: Any
    last_attempt: Any
    first_at: Any
    last_at: Any

    @property
    def headline(self) -> str:
        return error_summary(self.error)

    @property
    def when(self) -> str:
        """When the run's last attempt failed, as the dashboard writes timestamps."""
        if isinstance(self.last_at, str):
            try:
                moment = dt.datetime.fromisoformat(self.last_at)
            except ValueError:
                return self.last_at
            if moment.tzinfo is not None:
                return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return str(self.last_at or "")

    @property
    def attempts(self) -> str:
        if self.count == 1:
            return f"attempt {self.first_attempt}"
        return f"attempts {self.first_attempt}-{self.last_attempt}"


def error_tooltip(error: str | None) -> str:
    """``error`` for a title attribute, cut to ``TOOLTIP_LENGTH`` characters."""
    if not error:
        return ""
    return error if len(error) <= TOOLTIP_LENGTH else error[: TOOLTIP_LENGTH - 1] + "…"


def duration(started_at: dt.datetime | None, finished_at: dt.datetime | None, running: bool) -> str:
    """``350 ms``, ``4.2 s``, ``3m 12s``; ``running for 12 s`` for a running job; empty when
    the job never started."""
    if started_at is None:
        return ""
    if running:
        return "running for " + _length((dt.datetime.now(dt.UTC) - started_at).total_seconds())
    if finished_at is None:
        return ""
    return _length((finished_at - started_at).total_seconds())


def _length(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    left = int(seconds)
    for big, small, size_big, size_small in (("d", "h", 86_400, 3_600), ("h", "m", 3_600, 60)):
        if left >= size_big:
            return f"{left // size_big}{big} {left % size_big // size_small}{small}"
    return f"{left // 60}m {left % 60}s"


def folded_errors(errors: list[dict[str, Any]]) -> list[ErrorRun]:
    """``errors`` (oldest first) with each run of consecutive same failures as one entry."""
    runs: list[ErrorRun] = []
    previous_key: str | None = None
    for entry in errors:
        text = str(entry.get("error") or "")
        key = ADDRESS.sub("0x?", text)
        if runs and key == previous_key:
            last = runs[-1]
            runs[-1] = ErrorRun(
                last.error,
                last.count + 1,
                last.first_attempt,
                entry.get("attempt"),
                last.first_at,
                entry.get("at"),
            )
        else:
            attempt, at = entry.get("attempt"), entry.get("at")
            runs.append(ErrorRun(text, 1, attempt, attempt, at, at))
        previous_key = key
    return runs
