"""The overview's wait-time read (``sql.wait_times``) over ``db.Executor``: per queue, the
median and 95th percentile wait from ``run_at`` to claim of recently finished jobs; and its one
pass that reads the throughput chart's counts beside them."""

from __future__ import annotations

from pgqueue.admin_values import WaitTime
from pgqueue.data import admin as admin_data
from pgqueue.db import Executor
from pgqueue.sql import wait_times
from pgqueue.states import JobState

Series = dict[str, dict[JobState, list[int]]]
Waits = dict[str, list[WaitTime | None]]


def recent_wait_times(ex: Executor, window: int, width: int, cap: int) -> Waits:
    """``{queue: [WaitTime or None per bucket]}``, index 0 the newest of ``window // width``
    buckets of ``width`` seconds (None: no job of the queue finished in it); of the ``cap``
    most recently finished jobs of each table ``ex.tables`` reads."""
    buckets = window // width
    rows = ex.rows(
        wait_times.wait_percentiles(ex.tables.partitioned),
        {"window": float(window), "width": float(width), "cap": cap},
    )
    series: Waits = {}
    for queue, ago, jobs, p50, p95 in rows:
        # Jobs finished exactly at the window's start floor to one bucket past it: left out, as
        # percentiles of two groups cannot be merged into one.
        if 0 <= ago < buckets:
            series.setdefault(queue, [None] * buckets)[ago] = WaitTime(int(jobs), p50, p95)
    return series


def recent_activity(
    ex: Executor, cap: int, quiet_jobs: int, quiet_width: int
) -> tuple[int, int, Series, bool, Waits]:
    """``(window, width, series, shortened, waits)``: ``admin_data.recent_throughput``'s
    figures and ``recent_wait_times``' over the same buckets, except that a full hour holding
    at most ``quiet_jobs`` jobs is bucketed by ``quiet_width`` seconds. In place, one statement
    reads at most ``cap`` index entries and their rows once; under the partitioned history,
    whose moved jobs come from their per-minute counts, the two reads are made in turn."""
    if ex.tables.partitioned:
        return _two_reads(ex, cap, quiet_jobs, quiet_width)
    params = {
        "cap": cap,
        "hour": float(admin_data.THROUGHPUT_WINDOW),
        "widths": list(admin_data.BUCKET_WIDTHS),
        "widest": admin_data.BUCKET_WIDTHS[-1],
        "quiet_jobs": quiet_jobs,
        "quiet_width": quiet_width,
    }
    rows = ex.rows(wait_times.recent_activity(), params)
    if not rows:
        # No job finished in the hour: the shape the statement gives an empty quiet hour.
        width = quiet_width if quiet_jobs >= 0 else 60
        return admin_data.THROUGHPUT_WINDOW, width, {}, False, {}
    width, window, shortened = int(rows[0][7]), int(rows[0][8]), bool(rows[0][9])
    buckets = window // width
    series: Series = {}
    waits: Waits = {}
    for queue, state, ago, jobs, waited, p50, p95, *_ in rows:
        # Rows past either edge are left out, as the two reads leave them (see their docs).
        if not 0 <= ago < buckets:
            continue
        if state is not None:
            by_state = series.setdefault(queue, {})
            by_state.setdefault(JobState(state), [0] * buckets)[ago] += int(jobs)
        elif waited:
            waits.setdefault(queue, [None] * buckets)[ago] = WaitTime(int(waited), p50, p95)
    return window, width, series, shortened, waits


def _two_reads(
    ex: Executor, cap: int, quiet_jobs: int, quiet_width: int
) -> tuple[int, int, Series, bool, Waits]:
    """``recent_activity`` as the throughput read, then the wait read over its buckets."""
    window, width, series, shortened = admin_data.recent_throughput(ex, cap)
    total = sum(sum(counts) for by_state in series.values() for counts in by_state.values())
    if not shortened and total <= quiet_jobs:
        series, width = _regrouped(series, quiet_width // width), quiet_width
    return window, width, series, shortened, recent_wait_times(ex, window, width, cap)


def _regrouped(series: Series, factor: int) -> Series:
    """``series`` with each ``factor`` neighbouring buckets added into one."""
    return {
        queue: {
            state: [sum(counts[i : i + factor]) for i in range(0, len(counts), factor)]
            for state, counts in by_state.items()
        }
        for queue, by_state in series.items()
    }
