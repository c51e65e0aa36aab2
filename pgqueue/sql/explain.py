"""Statements behind "why isn't this job running?" (``pgqueue.explain``): reads only, each
bounded by a key or an index and a ``LIMIT``, so explaining a job costs the same however long
the history or deep the queue. The lease holder of a running job is read with
``sql.workers.job_holder``, and liveness is the registry's rule (``sql.workers.is_live``); a
bounded queue's depth is the one its enqueues check (``sql.queue_bounds.waiting_depth``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    SmallInteger,
    Text,
    bindparam,
    extract,
    func,
    literal,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import TIMESTAMP

from pgqueue.models import Job, MessageQueue, QueueControl, WorkerRecord
from pgqueue.sql.common import array_param, running
from pgqueue.sql.queue_bounds import waiting_depth
from pgqueue.sql.workers import is_live, registers, serves
from pgqueue.states import JobState


@cache
def job_facts() -> Select[*tuple[Any, ...]]:
    """One job by ``job_id`` with its ticket (if any) and its queue's control row (if any), and
    the database clock: everything the claim checks that lives on those three rows. Reads each
    by its primary key."""
    return (
        select(
            Job.id,
            Job.state,
            Job.queue,
            Job.task_name,
            Job.attempts,
            Job.max_attempts,
            Job.run_at,
            Job.started_at,
            Job.finished_at,
            Job.last_error,
            Job.lease_owner,
            Job.lease_expires_at,
            Job.depends_on,
            Job.pending_dependencies,
            Job.workflow_id,
            Job.workflow_role,
            Job.atomic,
            Job.snoozes,
            Job.concurrency_key,
            MessageQueue.job_id.is_not(None).label("has_ticket"),
            MessageQueue.run_at.label("ticket_run_at"),
            MessageQueue.priority.label("ticket_priority"),
            MessageQueue.atomic.label("ticket_atomic"),
            func.coalesce(QueueControl.paused, False).label("paused"),
            QueueControl.concurrency_limit,
            func.coalesce(QueueControl.running, 0).label("running"),
            QueueControl.max_depth,
            QueueControl.rate_limit,
            func.now().label("now"),
        )
        .select_from(Job)
        .outerjoin(MessageQueue, MessageQueue.job_id == Job.id)
        .outerjoin(QueueControl, QueueControl.name == Job.queue)
        .where(Job.id == bindparam("job_id", type_=BigInteger))
    )


@cache
def running_in_queue() -> Select[int]:
    """Ids of the RUNNING jobs of ``queue``, lowest first, at most ``cap``: the jobs that fill a
    queue's limit. Reads the lease index, which lists the running jobs."""
    return (
        select(Job.id)
        .where(Job.queue == bindparam("queue", type_=Text), running())
        .order_by(Job.id)
        .limit(bindparam("cap", type_=Integer))
    )


@cache
def queue_depth() -> Select[int]:
    """How many jobs of ``queue`` wait, counted up to ``cap``: the depth its bound checks
    (``sql.queue_bounds.waiting_depth``)."""
    return select(waiting_depth(bindparam("queue", type_=Text), bindparam("cap", type_=Integer)))


@cache
def dependency_states() -> Select[int, JobState]:
    """``(id, state)`` of the jobs ``ids`` (an array; the caller caps its length) that exist, by
    primary key."""
    return (
        select(Job.id, Job.state)
        .where(Job.id == func.any(array_param("ids", BigInteger)))
        .order_by(Job.id)
    )


@cache
def tickets_ahead() -> Select[int]:
    """How many tickets of ``queue`` a claim would take before the ticket ``(priority, run_at,
    job_id)``, stopping at ``cap``: ready ones (``run_at`` now or earlier) of the same kind
    (``atomic``) that come first in the claim's order. A range of the claim index, with the
    queue read from the index entries, never from the table."""
    position = tuple_(
        bindparam("priority", type_=SmallInteger),
        bindparam("run_at", type_=TIMESTAMP(timezone=True)),
        bindparam("job_id", type_=BigInteger),
    )
    ahead = (
        select(literal(1).label("ahead"))
        .where(
            MessageQueue.atomic == bindparam("atomic", type_=Boolean),
            tuple_(MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id) < position,
            MessageQueue.run_at <= func.now(),
            MessageQueue.queue == bindparam("queue", type_=Text),
        )
        .limit(bindparam("cap", type_=Integer))
        .subquery("ahead")
    )
    return select(func.count()).select_from(ahead)


@cache
def live_workers(*, serving_queue: bool) -> Select[*tuple[Any, ...]]:
    """Ids of the live workers (the registry's rule, ``sql.workers.is_live``: binds
    ``stale_seconds``), at most ``cap``, each with its claim error and the seconds its claims
    have failed (nulls while they work); with ``serving_queue`` only those that claim from
    ``queue``. The registry holds one row per worker process, so this reads a small table."""
    failing_for = extract("epoch", func.clock_timestamp() - WorkerRecord.claim_failing_since)
    stmt = select(WorkerRecord.id, WorkerRecord.claim_error, failing_for).where(is_live())
    if serving_queue:
        stmt = stmt.where(serves(WorkerRecord, bindparam("queue", type_=Text)))
    return stmt.order_by(WorkerRecord.id).limit(bindparam("cap", type_=Integer))


@cache
def task_registered() -> Select[bool]:
    """Whether a live worker that claims from ``queue`` registers task ``task``
    (``sql.workers.registers``). Binds ``stale_seconds``, ``queue`` and ``task``."""
    registering = select(literal(1)).where(
        is_live(),
        serves(WorkerRecord, bindparam("queue", type_=Text)),
        registers(WorkerRecord, bindparam("task", type_=Text)),
    )
    return select(registering.exists())
