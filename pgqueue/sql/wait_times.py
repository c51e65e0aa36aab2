"""Statements of the overview's wait-time chart: how long the most recently finished jobs
waited to be claimed (``started_at`` minus ``run_at``), per queue and bucket of finish time;
and the overview's one pass that counts the same jobs per state beside those waits."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Float,
    Integer,
    Select,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY

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


@cache
def recent_activity() -> Any:  # a Select
    """``(queue, state, buckets_ago, jobs, waited, p50, p95, width, window, shortened)``: the
    ``cap`` most recently finished jobs of ``pgqueue_jobs``, those of the last ``hour`` seconds
    counted per queue, state and bucket, and their waits (``run_at`` to claim) summarised per
    queue and bucket (rows whose ``state`` is null: ``waited`` jobs with a ``started_at``, their
    median and 95th percentile).

    The buckets come first, from the ``finished_at`` index alone (an index-only walk of ``cap``
    entries): when the hour holds ``cap`` jobs or more the window shrinks to the ``cap`` newest
    (``shortened``), rounded up to whole buckets of the first of ``widths`` that makes at most 60
    of them (else the last); a full hour holding at most ``quiet_jobs`` jobs has buckets of
    ``quiet_width`` seconds; any other hour, of 60. Then one walk of the same index reads the
    rows of exactly as many jobs as the window holds, each once, and they are grouped by a
    bucket width already known (a one-row plan, not a value carried by every row). Every row
    repeats ``width``, ``window`` and ``shortened``; rows of a bucket at or past the window's
    far edge are left to the caller."""
    Job = job_model(False)
    hour_start = func.now() - seconds(bindparam("hour", type_=Float))
    indexed = newest_finished(Job, Job.finished_at)
    edge = (
        select(
            func.count().label("n"),
            func.coalesce(seconds_ago(func.min(indexed.c.finished_at)), 0.0).label("oldest"),
        )
        .where(indexed.c.finished_at >= hour_start)
        .cte("edge")
    )
    offered = func.unnest(bindparam("widths", type_=ARRAY(Integer))).column_valued("w")
    fitting = select(func.min(offered)).where(offered * 60 >= edge.c.oldest).scalar_subquery()
    shortened = edge.c.n >= bindparam("cap", type_=Integer)
    width = case(
        (shortened, func.coalesce(fitting, bindparam("widest", type_=Integer))),
        (
            edge.c.n <= bindparam("quiet_jobs", type_=Integer),
            bindparam("quiet_width", type_=Integer),
        ),
        else_=60,
    )
    shape = select(edge.c.n, edge.c.oldest, width.label("width"), shortened.label("shortened")).cte(
        "shape"
    )
    window = case(
        (
            shape.c.shortened,
            cast(func.greatest(1, func.ceil(shape.c.oldest / cast(shape.c.width, Float))), Integer)
            * shape.c.width,
        ),
        else_=cast(bindparam("hour", type_=Float), Integer),
    )
    frame = select(shape.c.n, shape.c.width, window.label("window"), shape.c.shortened).cte("frame")

    def framed(column: Any) -> Any:
        return select(column).scalar_subquery()

    # A claim never precedes run_at; the floor keeps a row edited by hand from reading negative.
    waited = case(
        (
            Job.started_at.is_not(None),
            func.greatest(
                0.0,
                func.date_part(literal_column("'epoch'"), Job.started_at - Job.run_at, type_=Float),
            ),
        ),
    )
    # No range on finished_at: a LIMIT the planner cannot see keeps the ordered walk (see
    # newest_finished), where a range would have it guess the window's size from statistics.
    hour = (
        select(
            Job.queue,
            Job.state,
            seconds_ago(Job.finished_at).label("ago"),
            waited.label("waited"),
        )
        .where(Job.finished_at.is_not(None))
        .order_by(Job.finished_at.desc())
        .limit(framed(frame.c.n))
        .subquery("hour")
    )
    buckets_ago = cast(func.floor(hour.c.ago / cast(framed(frame.c.width), Float)), Integer).label(
        "buckets_ago"
    )
    return select(
        hour.c.queue,
        hour.c.state,
        buckets_ago,
        func.count(),
        func.count(hour.c.waited),
        func.percentile_cont(0.5).within_group(hour.c.waited),
        func.percentile_cont(0.95).within_group(hour.c.waited),
        framed(frame.c.width),
        framed(frame.c.window),
        framed(frame.c.shortened),
    ).group_by(
        func.grouping_sets(
            tuple_(hour.c.queue, hour.c.state, buckets_ago),
            tuple_(hour.c.queue, buckets_ago),
        )
    )
