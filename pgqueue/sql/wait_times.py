"""Statements of the overview's wait-time chart: how long the most recently finished jobs
waited to be claimed (``started_at`` minus ``run_at``), per queue and bucket of finish time."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    Select,
    bindparam,
    cast,
    func,
    literal_column,
    select,
    union_all,
)

from pgqueue.sql.admin import newest_finished, seconds_ago
from pgqueue.sql.common import seconds
from pgqueue.sql.job_lists import job_model


def _recent_waits(history: bool) -> Any:  # a Select
    """Queue, finish time and wait (seconds) of the jobs among the ``cap`` most recently
    finished of one table (``newest_finished``: a walk of the ``finished_at`` index that stops
    after ``cap``) that finished in the last ``window`` seconds."""
    Job = job_model(history)
    recent = newest_finished(Job, Job.queue, Job.finished_at, Job.started_at, Job.run_at)
    # A claim never precedes run_at; the floor keeps a row edited by hand from reading negative.
    waited = func.greatest(
        0.0,
        func.date_part(
            literal_column("'epoch'"), recent.c.started_at - recent.c.run_at, type_=Float
        ),
    )
    return select(recent.c.queue, recent.c.finished_at, waited.label("waited")).where(
        recent.c.started_at.is_not(None),
        recent.c.finished_at >= func.now() - seconds(bindparam("window", type_=Float)),
    )


@cache
def wait_percentiles(partitioned: bool = False) -> Select[str, int, int, float, float]:
    """``(queue, buckets_ago, jobs, p50, p95)``: the median and 95th percentile of the seconds
    the jobs that finished in the last ``window`` seconds waited from ``run_at`` to their claim,
    bucketed by ``width`` seconds of finish time before ``now()`` (0 = newest); of the ``cap``
    most recently finished jobs of each table read (``partitioned``: ``pgqueue_job_history``
    too, so the percentiles span both)."""
    live: Any = _recent_waits(False)
    both: Any = union_all(live, _recent_waits(True)) if partitioned else live
    rows = both.subquery("waits")
    buckets_ago = cast(
        func.floor(seconds_ago(rows.c.finished_at) / bindparam("width", type_=Float)), Integer
    ).label("buckets_ago")
    return select(
        rows.c.queue,
        buckets_ago,
        func.count(),
        func.percentile_cont(0.5).within_group(rows.c.waited),
        func.percentile_cont(0.95).within_group(rows.c.waited),
    ).group_by(rows.c.queue, buckets_ago)
