"""The overview's wait-time read (``sql.wait_times``) over ``db.Executor``: per queue, the
median and 95th percentile wait from ``run_at`` to claim of recently finished jobs."""

from __future__ import annotations

from pgqueue.admin_values import WaitTime
from pgqueue.db import Executor
from pgqueue.sql import wait_times


def recent_wait_times(
    ex: Executor, window: int, width: int, cap: int
) -> dict[str, list[WaitTime | None]]:
    """``{queue: [WaitTime or None per bucket]}``, index 0 the newest of ``window // width``
    buckets of ``width`` seconds (None: no job of the queue finished in it); of the ``cap``
    most recently finished jobs of each table ``ex.tables`` reads."""
    buckets = window // width
    rows = ex.rows(
        wait_times.wait_percentiles(ex.tables.partitioned),
        {"window": float(window), "width": float(width), "cap": cap},
    )
    series: dict[str, list[WaitTime | None]] = {}
    for queue, ago, jobs, p50, p95 in rows:
        # Jobs finished exactly at the window's start floor to one bucket past it: left out, as
        # percentiles of two groups cannot be merged into one.
        if 0 <= ago < buckets:
            series.setdefault(queue, [None] * buckets)[ago] = WaitTime(int(jobs), p50, p95)
    return series
