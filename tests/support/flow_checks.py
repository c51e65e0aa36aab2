"""Checks the flow-control tests share: starts in a sliding window, and the key of each job
that waits with a ticket."""

from __future__ import annotations

from sqlalchemy import Engine, text


def most_in_window(starts: list[float], window: float) -> int:
    """The most of ``starts`` (seconds) in any half-open window of ``window`` seconds."""
    ordered = sorted(starts)
    most = low = 0
    for high, at in enumerate(ordered):
        while ordered[low] <= at - window:
            low += 1
        most = max(most, high - low + 1)
    return most


def waiting_keys(engine: Engine) -> dict[int, str | None]:
    """Job id -> concurrency key, for every job with a ticket."""
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT t.job_id, j.concurrency_key FROM pgqueue_message_queue t "
                "JOIN pgqueue_jobs j ON j.id = t.job_id"
            )
        )
        return {job_id: key for job_id, key in rows}
