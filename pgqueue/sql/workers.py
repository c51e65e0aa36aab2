"""Statements of the worker registry (``pgqueue_workers``): a worker's row written at start and
refreshed by its heartbeat, deleted at a clean stop or, once stale, by any worker's maintenance;
and the operators' reads (the live workers with their running job counts, the holder of a job,
the ready jobs whose task no live worker registers).

``is_live`` is the one rule of which rows count as running workers: ``last_seen_at`` within
the bound ``stale_seconds`` of the database clock. Every statement here that tells live from
stale uses it, and so should any other reader of the registry.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    delete,
    exists,
    extract,
    func,
    literal,
    literal_column,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.sql.dml import Delete, ReturningDelete, ReturningInsert, ReturningUpdate

from pgqueue.models import Job, MessageQueue, WorkerRecord
from pgqueue.sql.common import array_param, seconds
from pgqueue.sql.outcomes import heartbeat
from pgqueue.states import JobState


def is_live(worker: Any = WorkerRecord) -> ColumnElement[bool]:
    """The row of ``worker`` (the table or an alias of it) belongs to a live worker: seen
    within ``stale_seconds`` (bind). Rows failing it are stale: their worker is gone."""
    stale_seconds = bindparam("stale_seconds", type_=Float)
    live: ColumnElement[bool] = worker.last_seen_at >= func.now() - seconds(stale_seconds)
    return live


def serves(worker: Any, queue: Any) -> ColumnElement[bool]:
    """The worker claims from ``queue``: it names it, or names none (it serves every queue)."""
    served: ColumnElement[bool] = or_(
        queue == func.any(worker.queues), func.cardinality(worker.queues) == 0
    )
    return served


def registers(worker: Any, task_name: Any) -> ColumnElement[bool]:
    """The worker registers ``task_name``; a row without task names (written by a version
    that did not record them) is taken to register every task."""
    registered: ColumnElement[bool] = or_(
        worker.tasks.is_(None), task_name == func.any(worker.tasks)
    )
    return registered


def _seen_upsert() -> Insert:
    """Insert the worker's row, or refresh ``last_seen_at`` when it exists. Binds
    ``worker_id``, ``worker_host``, ``worker_pid``, ``worker_queues`` (empty: all queues),
    ``worker_concurrency``, ``worker_version``, ``worker_started_at`` (null: now),
    ``worker_claim_error`` (null while its claims work), ``worker_tasks`` (the task names
    it registers) and ``worker_pool``; the last two written on insert only, as they do not
    change while a worker runs. ``claim_failing_since`` is set when a claim error is first
    written and kept while one is, so it says since when claims fail."""
    claim_error = bindparam("worker_claim_error", type_=Text)
    statement = insert(WorkerRecord).values(
        id=bindparam("worker_id", type_=Text),
        host=bindparam("worker_host", type_=Text),
        pid=bindparam("worker_pid", type_=Integer),
        queues=array_param("worker_queues", Text),
        concurrency=bindparam("worker_concurrency", type_=Integer),
        version=bindparam("worker_version", type_=Text),
        started_at=func.coalesce(
            bindparam("worker_started_at", type_=DateTime(timezone=True)), func.now()
        ),
        last_seen_at=func.now(),
        claim_error=claim_error,
        claim_failing_since=case((claim_error.is_not(None), func.now())),
        tasks=array_param("worker_tasks", Text),
        pool=bindparam("worker_pool", type_=Text),
    )
    written = statement.excluded.claim_error
    return statement.on_conflict_do_update(
        index_elements=[WorkerRecord.id],
        set_={
            "last_seen_at": func.now(),
            "claim_error": written,
            "claim_failing_since": case(
                (written.is_not(None), func.coalesce(WorkerRecord.claim_failing_since, func.now()))
            ),
        },
    )


@cache
def register() -> ReturningInsert[Any]:
    """Write the worker's row (see ``_seen_upsert`` for the binds) and return its
    ``started_at``. Also the heartbeat's refresh when no lease needs extending: a row deleted
    as stale while its worker was cut off comes back with its first start time."""
    return _seen_upsert().returning(WorkerRecord.started_at)


@cache
def heartbeat_and_seen(with_progress: bool = False) -> ReturningUpdate[int, bool]:
    """``sql.outcomes.heartbeat`` (of the same ``with_progress`` form) that also refreshes the
    worker's row, in the same statement: the binds of both (``ids``, ``tokens``,
    ``lease_seconds``, the progress arrays with progress, and those of ``register``)."""
    seen = _seen_upsert().cte("worker_seen")
    return heartbeat(with_progress).add_cte(seen)


@cache
def unregister() -> Delete:
    """Delete the worker's row at a clean stop. Binds ``worker_id``."""
    return delete(WorkerRecord).where(WorkerRecord.id == bindparam("worker_id", type_=Text))


@cache
def delete_stale() -> ReturningDelete[str]:
    """Delete the rows of workers not seen within ``stale_seconds``; returns their ids."""
    return delete(WorkerRecord).where(~is_live()).returning(WorkerRecord.id)


# Written out, not bound: only a constant lets a generic plan (a prepared statement's) use the
# partial index of running jobs instead of reading every job.
_RUNNING: Final[ColumnElement[Any]] = literal_column("'running'")


def _running_counts() -> Any:
    """RUNNING jobs per lease owner."""
    return (
        select(Job.lease_owner.label("owner"), func.count().label("running"))
        .where(Job.state == _RUNNING, Job.lease_owner.is_not(None))
        .group_by(Job.lease_owner)
        .subquery("running_counts")
    )


def _seconds_since(column: Any) -> ColumnElement[Any]:
    # The wall clock, not now(): a heartbeat that committed after this transaction began
    # stamped a later now() than ours, and an age must never come out negative.
    return extract("epoch", func.clock_timestamp() - column)


@cache
def list_workers() -> Select[*tuple[Any, ...]]:
    """The registry's rows, live first by id, each with the seconds since it was seen,
    whether it is live, how many RUNNING jobs it holds, its claim error with the seconds
    its claims have been failing (nulls while they work), the tasks it registers, and its
    pool. Binds ``stale_seconds`` and ``include_stale`` (false: live rows only)."""
    running = _running_counts()
    live = is_live()
    return (
        select(
            WorkerRecord.id,
            WorkerRecord.host,
            WorkerRecord.pid,
            WorkerRecord.queues,
            WorkerRecord.concurrency,
            WorkerRecord.version,
            WorkerRecord.started_at,
            WorkerRecord.last_seen_at,
            _seconds_since(WorkerRecord.last_seen_at),
            live,
            func.coalesce(running.c.running, 0),
            WorkerRecord.claim_error,
            _seconds_since(WorkerRecord.claim_failing_since),
            WorkerRecord.tasks,
            WorkerRecord.pool,
        )
        .outerjoin(running, running.c.owner == WorkerRecord.id)
        .where(live | bindparam("include_stale", type_=Boolean))
        .order_by(live.desc(), WorkerRecord.id)
    )


@cache
def job_holder() -> Select[*tuple[Any, ...]]:
    """The lease owner of job ``job_id`` when it is RUNNING, with its registry row's host,
    pid, last seen time, seconds since seen and liveness (nulls when it has no row). Binds
    ``job_id`` and ``stale_seconds``; no row when the job is not RUNNING."""
    return (
        select(
            Job.lease_owner,
            WorkerRecord.host,
            WorkerRecord.pid,
            WorkerRecord.last_seen_at,
            _seconds_since(WorkerRecord.last_seen_at),
            is_live(),
        )
        .select_from(Job)
        .outerjoin(WorkerRecord, WorkerRecord.id == Job.lease_owner)
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            Job.state == JobState.RUNNING,
            Job.lease_owner.is_not(None),
        )
    )


@cache
def unregistered_ready() -> Select[str, int]:
    """``(queue, count)``: per queue, the ready tickets (at most ``cap`` read in all) whose
    job's task no live worker serving the queue registers, while some live worker serves it
    (a queue nobody serves is a different wait). Binds ``stale_seconds`` and ``cap``. Reads
    the ticket table and each read ticket's job by its primary key."""
    live = (
        select(WorkerRecord.queues, WorkerRecord.tasks)
        .where(is_live())
        .cte("live_workers")
        .prefix_with("MATERIALIZED")
    )
    tickets = (
        select(MessageQueue.job_id, MessageQueue.queue)
        .where(MessageQueue.run_at <= func.now())
        .limit(bindparam("cap", type_=Integer))
        .subquery("ready")
    )
    served = exists(select(literal(1)).select_from(live).where(serves(live.c, tickets.c.queue)))
    registered = exists(
        select(literal(1))
        .select_from(live)
        .where(serves(live.c, tickets.c.queue), registers(live.c, Job.task_name))
    )
    return (
        select(tickets.c.queue, func.count())
        .select_from(tickets.join(Job, Job.id == tickets.c.job_id))
        .where(served, ~registered)
        .group_by(tickets.c.queue)
    )


@cache
def no_live_worker_before() -> Select[bool]:
    """Whether no live worker has an id smaller than ``worker_id``: true for exactly one live
    worker of the cluster (the elected one), and for any worker while the registry has no
    live row below it. Binds ``worker_id`` and ``stale_seconds``."""
    earlier = and_(WorkerRecord.id < bindparam("worker_id", type_=Text), is_live())
    return select(~exists(select(literal(1)).select_from(WorkerRecord).where(earlier)))
