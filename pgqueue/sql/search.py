"""Statements of the job search (``pgq.admin.list_jobs`` with a window, error text, a JSON match
or a job id; ``pgqueue.job_search``): the first job id created at a moment, one job by id under
the filters, and the bounded walk of a window. For ``pgqueue_jobs`` or, with ``history``, the
moved jobs of the partitioned history (``JobHistory``, the same columns).

The walk reads at most ``scan`` rows of its window in the order of an index: the primary key
for a window on ``created_at`` (as an id range), the ``finished_at`` index for one on
``finished_at``. The filters are computed on those rows only, above the ``LIMIT``, so no plan
can read more of the table than the bound, however rare a match.

Binds: ``since``, ``until`` (the window, as the shape says); ``low_id``, ``high_id`` (the id
range of a ``created_at`` window, from ``first_id_created``); ``cursor_id`` and, for a
``finished_at`` window, ``cursor_at`` (where the walk resumes); ``scan``; ``limit``;
``match_queue``, ``match_state``, ``match_task``, ``error_pattern`` (an ``ILIKE`` pattern whose
escape character is ``\\``), ``json_path`` (text array) and ``json_value`` (JSON text), each
when the shape says its filter is given.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import JSONB

from pgqueue.sql.common import array_param
from pgqueue.sql.job_lists import job_model


class Shape(NamedTuple):
    """Which filters a search gives (their values are binds) and how it walks: ``time_column``
    of the window, ``since``/``until`` given, ``cursor`` (``"before"``, ``"after"`` or None),
    ``json_column`` (``args``, ``kwargs``, ``result`` or None) with ``json_keys`` (a path below
    the column is given) and ``json_contains`` (``@>`` rather than ``=``)."""

    history: bool
    time_column: str
    since: bool
    until: bool
    cursor: str | None
    by_queue: bool
    by_state: bool
    by_task: bool
    by_error: bool
    json_column: str | None
    json_keys: bool
    json_contains: bool


def _jsonb(column: Any) -> ColumnElement[Any]:
    """``column`` (stored as ``json``) as ``jsonb``, or null for a value holding ``\\u0000``:
    ``json`` keeps that escape and ``jsonb`` refuses it, so the cast would fail the whole
    search on one job written by another client. Such a job never matches a JSON search."""
    return case(
        (func.strpos(cast(column, Text), literal("\\u0000", Text)) == 0, cast(column, JSONB))
    )


def _filters(shape: Shape, Job: Any) -> list[ColumnElement[bool]]:
    """The conditions on one job's row besides its window."""
    conditions: list[ColumnElement[bool]] = []
    if shape.by_queue:
        conditions.append(Job.queue == bindparam("match_queue", type_=Text))
    if shape.by_state:
        conditions.append(Job.state == bindparam("match_state", type_=Text))
    if shape.by_task:
        conditions.append(Job.task_name == bindparam("match_task", type_=Text))
    if shape.by_error:
        pattern = bindparam("error_pattern", type_=Text)
        conditions.append(Job.last_error.ilike(pattern, escape="\\"))
    if shape.json_column is not None:
        found = _jsonb(getattr(Job, shape.json_column))
        if shape.json_keys:
            found = found.op("#>", return_type=JSONB)(array_param("json_path", Text))
        value = cast(bindparam("json_value", type_=Text), JSONB)
        if shape.json_contains:
            conditions.append(found.op("@>", is_comparison=True)(value))
        else:
            conditions.append(found == value)
    return conditions


def _window(shape: Shape, Job: Any) -> list[ColumnElement[bool]]:
    at = getattr(Job, shape.time_column)
    conditions: list[ColumnElement[bool]] = []
    if shape.since:
        conditions.append(at >= bindparam("since", type_=DateTime(timezone=True)))
    if shape.until:
        conditions.append(at < bindparam("until", type_=DateTime(timezone=True)))
    return conditions


@cache
def first_id_created(history: bool = False) -> Select[int]:
    """The smallest id of the jobs created at or after ``moment`` (a bind), or one past the
    largest id when none was: ids are handed out in creation order, so a window on
    ``created_at`` is the ids from this id at ``since`` up to this id at ``until``.

    A bisection over the primary key: each step probes the first job at or above the middle of
    the range, at most 64 steps of one index probe each, however many jobs there are. Creation
    order and id order differ only for jobs whose enqueuing transactions overlapped (a job's
    ``created_at`` is its transaction's start, its id is drawn at its insert), so the id found
    is exact up to the jobs enqueued by a transaction open across ``moment``.
    """
    Job = job_model(history)
    moment = bindparam("moment", type_=DateTime(timezone=True))
    top = select(Job.id).order_by(Job.id.desc()).limit(1).scalar_subquery()
    # Invariant: the jobs below ``lo`` were created before ``moment``; none at or above ``hi``
    # was.
    start = select(
        literal(0, BigInteger).label("lo"),
        (func.coalesce(top, literal(0, BigInteger)) + 1).label("hi"),
    ).cte("bisect", recursive=True)
    middle = (start.c.lo + start.c.hi) // 2
    probe = (
        select(Job.id.label("id"), (Job.created_at < moment).label("earlier"))
        .where(Job.id >= middle)
        .order_by(Job.id)
        .limit(1)
        .lateral("probe")
    )
    step = (
        select(
            case(
                (probe.c.earlier, func.least(probe.c.id + 1, start.c.hi)),
                else_=start.c.lo,
            ),
            case((probe.c.earlier, start.c.hi), else_=middle),
        )
        .select_from(start)
        .join(probe, true(), isouter=True)
        .where(start.c.lo < start.c.hi)
    )
    bisect = start.union_all(step)
    return select(func.max(bisect.c.lo))


@cache
def finished_at_of(history: bool = False) -> Select[Any]:
    """When job ``job_id`` finished (null while it has not); no row when it is not there."""
    Job = job_model(history)
    return select(Job.finished_at).where(Job.id == bindparam("job_id", type_=BigInteger))


@cache
def job_by_id(shape: Shape) -> Select[Any]:
    """Job ``job_id`` when it matches every filter of ``shape`` (its window included)."""
    Job = job_model(shape.history)
    return select(Job).where(
        Job.id == bindparam("job_id", type_=BigInteger),
        *_window(shape, Job),
        *_filters(shape, Job),
    )


@cache
def walk(shape: Shape) -> Select[Any]:
    """``(scanned, last_id, last_at, job)`` rows: the jobs of the window that match, at most
    ``limit`` of them in the walk's order (newest first; oldest first after an ``after``
    cursor), each beside how many rows the walk read (at most ``scan``) and the id and time
    of the last one read; one row with no job when none matched.

    ``created_at`` windows walk the primary key over ``low_id`` <= id < ``high_id``;
    ``finished_at`` windows walk the ``finished_at`` index, ties in id order. A cursor resumes
    past job ``cursor_id`` (and, on ``finished_at``, its ``cursor_at``).
    """
    Job = job_model(shape.history)
    newer = shape.cursor == "after"
    conditions = _window(shape, Job)
    cursor_id = bindparam("cursor_id", type_=BigInteger)
    if shape.time_column == "created_at":
        at = Job.created_at
        if shape.since:
            conditions.append(Job.id >= bindparam("low_id", type_=BigInteger))
        if shape.until:
            conditions.append(Job.id < bindparam("high_id", type_=BigInteger))
        if shape.cursor is not None:
            conditions.append(Job.id > cursor_id if newer else Job.id < cursor_id)
        keys = [Job.id]
    else:
        at = Job.finished_at
        conditions.append(Job.finished_at.is_not(None))
        if shape.cursor is not None:
            cursor_at = bindparam("cursor_at", type_=DateTime(timezone=True))
            # The first test bounds the index scan; the row comparison breaks the ties.
            if newer:
                conditions += [at >= cursor_at, tuple_(at, Job.id) > tuple_(cursor_at, cursor_id)]
            else:
                conditions += [at <= cursor_at, tuple_(at, Job.id) < tuple_(cursor_at, cursor_id)]
        keys = [at, Job.id]
    order = [k.asc() if newer else k.desc() for k in keys]
    filters = _filters(shape, Job)
    hit = and_(*filters) if filters else true()
    columns = [Job.id.label("id"), at.label("at"), hit.label("hit")]
    if shape.history:
        # The partition key, so that reading a hit's row probes its one partition.
        columns.append(Job.finished_at.label("finished_at"))
    walked = (
        select(*columns)
        .where(*conditions)
        .order_by(*order)
        .limit(bindparam("scan", type_=Integer))
        .cte("walked")
        .prefix_with("MATERIALIZED")
    )
    walk_order = [walked.c.at, walked.c.id] if shape.time_column == "finished_at" else [walked.c.id]
    last = (
        select(walked.c.id, walked.c.at)
        .order_by(*[c.desc() if newer else c.asc() for c in walk_order])
        .limit(1)
        .subquery("last_read")
    )
    extent = select(func.count().label("scanned")).select_from(walked).subquery("extent")
    hits = (
        select(walked)
        .where(walked.c.hit)
        .order_by(*[c.asc() if newer else c.desc() for c in walk_order])
        .limit(bindparam("limit", type_=Integer))
        .subquery("hits")
    )
    hits_order = [hits.c.at, hits.c.id] if shape.time_column == "finished_at" else [hits.c.id]
    joined = Job.id == hits.c.id
    if shape.history:
        joined = and_(joined, Job.finished_at == hits.c.finished_at)
    return (
        select(extent.c.scanned, last.c.id, last.c.at, Job)
        .select_from(extent)
        .join(last, true(), isouter=True)
        .join(hits, true(), isouter=True)
        .join(Job, joined, isouter=True)
        .order_by(*[c.asc() if newer else c.desc() for c in hits_order])
    )
