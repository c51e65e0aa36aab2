"""Statements of atomic runs (``pgqueue_atomic_runs``): record a run before its handler starts,
clear a job's records when its run commits, and count the runs whose transaction was lost;
and the lock an atomic run's transaction takes on a job claimed by a committed statement.

An atomic claim lives and dies with the handler's transaction, so only a row committed on
another connection can tell that a handler ran in a transaction that never committed. Whoever
next holds the job's ticket (the worker that lost the transaction, or the next claim of the job)
counts those runs as failed attempts before the handler may run again.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import AtomicRun, Job, MessageQueue
from pgqueue.sql.common import announced, append_error, seconds, source_states
from pgqueue.states import LOST_FAIL, LOST_RETRY, JobState


@cache
def record_run() -> Insert:
    """Record that the handler of job ``job_id`` starts attempt ``attempt`` on ``worker``;
    returns the row, or nothing when a run of that attempt is already recorded (its
    transaction was lost: that attempt must be counted first) or when the job's committed row
    says the claim is stale: an in-transaction claim sees the count before its attempt, a
    committed claim its own RUNNING attempt under ``worker``. Anything else means the claim's
    transaction ended (its connection was cut while the worker was frozen, say) and the job
    moved on: the attempt was counted or run elsewhere, and its handler must not run."""
    job_id = bindparam("job_id", type_=BigInteger)
    attempt = bindparam("attempt", type_=Integer)
    worker = bindparam("worker", type_=Text)
    current = exists().where(
        Job.id == job_id,
        or_(
            Job.attempts < attempt,
            and_(
                Job.state == JobState.RUNNING,
                Job.attempts == attempt,
                Job.lease_owner == worker,
            ),
        ),
    )
    return (
        pg_insert(AtomicRun)
        .from_select(
            [AtomicRun.job_id, AtomicRun.attempt, AtomicRun.worker],
            select(job_id, attempt, worker).where(current),
        )
        .on_conflict_do_nothing(index_elements=[AtomicRun.job_id, AtomicRun.attempt])
        .returning(AtomicRun.job_id)
    )


@cache
def clear_runs() -> Delete:
    """Delete every recorded run of job ``job_id``: run in the transaction that commits its
    attempt, so a record outlives only a transaction that did not commit."""
    return delete(AtomicRun).where(AtomicRun.job_id == bindparam("job_id", type_=BigInteger))


@cache
def count_lost_runs() -> Select[Any]:
    """Count as failed attempts the recorded runs of job ``job_id`` whose transaction was lost
    (attempt above the job's count; their claims rolled back, so the job waits with its ticket
    and its old count), and delete their records: ``lost_retry`` with the ticket moved to
    ``now() + delay``, or ``lost_fail`` with the ticket deleted once the attempts are used up.
    Only while this statement can lock the job's ticket (SKIP LOCKED): a claim of the job under
    way elsewhere holds it and counts them itself. Binds ``job_id``, ``delay`` (seconds),
    ``error``. Returns the new state and the dependents; no row when nothing was counted."""
    job_id = bindparam("job_id", type_=BigInteger)
    error = bindparam("error", type_=Text)
    delay = seconds(bindparam("delay", type_=Float))
    ticket = (
        select(MessageQueue.job_id)
        .where(MessageQueue.job_id == job_id)
        .with_for_update(skip_locked=True)
        .cte("ticket")
    )
    count_before = select(Job.attempts).where(Job.id == job_id).scalar_subquery()
    lost = (
        delete(AtomicRun)
        .where(
            AtomicRun.job_id == select(ticket.c.job_id).scalar_subquery(),
            AtomicRun.attempt > count_before,
        )
        .returning(AtomicRun.attempt)
        .cte("lost")
    )
    runs = select(func.count()).select_from(lost).scalar_subquery()
    attempts = Job.attempts + runs
    exhausted = attempts >= Job.max_attempts
    counted = (
        update(Job)
        .where(
            Job.id == select(ticket.c.job_id).scalar_subquery(),
            runs > 0,
            # Both waiting states: a RETRYING job's lost attempt leaves it RETRYING.
            source_states(LOST_FAIL),
        )
        .values(
            state=case((exhausted, LOST_FAIL.target), else_=LOST_RETRY.target),
            attempts=attempts,
            run_at=case((exhausted, Job.run_at), else_=func.now() + delay),
            finished_at=case((exhausted, func.now()), else_=null()),
            updated_at=func.now(),
            last_error=error,
            errors=append_error(attempts, error),
        )
        .returning(Job.id, Job.state, Job.dependents, Job.awaited)
        .cte("counted")
    )
    moved = (
        update(MessageQueue)
        .where(MessageQueue.job_id == counted.c.id, counted.c.state == LOST_RETRY.target)
        .values(run_at=func.now() + delay)
        .cte("moved_ticket")
    )
    dropped = (
        delete(MessageQueue)
        .where(MessageQueue.job_id == counted.c.id, counted.c.state == LOST_FAIL.target)
        .cte("dropped_ticket")
    )
    ended = counted.c.state == LOST_FAIL.target
    return (
        select(counted.c.state, counted.c.dependents)
        .add_cte(moved, dropped)
        .where(announced(counted, ended))
    )


@cache
def lock_claimed() -> Select[int]:
    """Lock the row of RUNNING job ``job_id`` whose lease token is ``token`` (its id, or
    nothing when the lease was lost): an atomic job claimed by a committed statement, held by
    the handler's transaction so that no rescue can take it while the handler runs. NO KEY
    UPDATE, the lock an update of the job takes: it keeps every writer and the rescue out but
    lets the run's record (``atomic_runs.record_run``, whose foreign key takes KEY SHARE on
    the job's row) be committed on another connection while the transaction holds the row."""
    return (
        select(Job.id)
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            Job.state == JobState.RUNNING,
            Job.lease_token == bindparam("token", type_=Uuid),
        )
        .with_for_update(key_share=True)
    )
