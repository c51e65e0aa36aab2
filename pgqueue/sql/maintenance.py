"""Statements of the worker's housekeeping: rescue of jobs whose lease expired, pruning of
finished jobs, the advisory lock electing one maintenance leader, the recount of limited queues'
``running`` counters, the removal of idle concurrency keys' rows, and the outcome writes' lock
timeout (the settings each transaction begins with behind a pooler are ``sql.server``'s).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    update,
)

from pgqueue.models import ConcurrencyKey, Job, MessageQueue, QueueControl, Workflow
from pgqueue.sql import flow as flow_sql
from pgqueue.sql.common import (
    CLEAR_LEASE,
    REQUEUED_OR_ENDED_COLUMNS,
    among,
    announced,
    append_error,
    array_param,
    free_slots,
    in_states,
    key_hash,
    outside_running_workflows,
    recounted,
    seconds,
    source_states,
    tickets_for,
    woken,
)
from pgqueue.states import (
    RESCUE,
    RESCUE_FAIL,
    JobState,
)


@cache
def expired_lease_exists() -> Select[bool]:
    """Whether any RUNNING job's lease has expired (database clock): the rescue's cheap
    autocommit pre-check, so an idle worker's maintenance pass opens no transaction."""
    return select(
        select(literal(1))
        .where(Job.state == JobState.RUNNING.value, Job.lease_expires_at < func.now())
        .exists()
    )


@cache
def expired_leases() -> Select[int, str]:
    """``(id, queue)`` of up to ``limit`` RUNNING jobs whose lease expired (database clock),
    the longest expired first; reads only, for a rescue done in parts. Binds ``limit``."""
    return (
        select(Job.id, Job.queue)
        .where(Job.state == JobState.RUNNING, Job.lease_expires_at < func.now())
        .order_by(Job.lease_expires_at)
        .limit(bindparam("limit", type_=Integer))
    )


@cache
def rescue_expired(among_ids: bool = False) -> Select[int, str, list[int] | None]:
    """Re-queue (``rescue``) or fail for good (``rescue_fail``) up to ``limit`` jobs whose lease
    expired by the database clock; rescued jobs get a ticket for now. A job whose cancellation
    was requested ends CANCELLED instead. Binds ``lock_key``, ``limit``, ``error``, and with
    ``among_ids`` the ``ids`` the rescue is limited to. Returns ``(id, new state)``; nothing
    when another session holds the maintenance lock.
    The SQL counterpart of ``backoff.after_failure``: the same retry-or-fail rule, for attempts
    whose worker is gone.
    """
    # The advisory lock (held to the end of the transaction) elects a single rescuer per
    # database at a time; SKIP LOCKED would keep concurrent rescuers correct anyway.
    leader = select(
        func.pg_try_advisory_xact_lock(bindparam("lock_key", type_=BigInteger))
    ).scalar_subquery()
    only = (Job.id == func.any(array_param("ids", BigInteger)),) if among_ids else ()
    expired = (
        select(Job.id)
        .where(leader, Job.state == JobState.RUNNING, Job.lease_expires_at < func.now(), *only)
        .order_by(Job.lease_expires_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    exhausted = Job.attempts >= Job.max_attempts
    new_state = case(
        (Job.cancel_requested, literal(JobState.CANCELLED.value)),
        (exhausted, literal(RESCUE_FAIL.target.value)),
        else_=literal(RESCUE.target.value),
    )
    error = bindparam("error", type_=Text)
    goes_final = or_(Job.cancel_requested, exhausted)
    updated = (
        update(Job)
        .where(Job.id == expired.c.id, source_states(RESCUE))
        .values(
            state=new_state,
            run_at=case((goes_final, Job.run_at), else_=func.now()),
            finished_at=case((goes_final, func.now()), else_=null()),
            updated_at=func.now(),
            last_error=error,
            errors=append_error(Job.attempts, error),
            **CLEAR_LEASE,
        )
        .returning(*REQUEUED_OR_ENDED_COLUMNS)
        .cte("rescued")
    )
    tickets = tickets_for(updated, "rescue_tickets", updated.c.state == RESCUE.target.value)
    return (
        select(updated.c.id, updated.c.state, updated.c.dependents)
        .add_cte(tickets, *free_slots(updated))
        .where(woken(tickets), announced(updated, updated.c.state != RESCUE.target.value))
    )


@cache
def prune_finished() -> Select[int]:
    """Delete up to ``limit`` finished jobs older than their retention; returns their count.

    Binds ``succeeded_before``/``failed_before`` (seconds of age), ``limit``. A finished job
    has no ticket (the claim deleted it, a re-run gives a new one only to a job it moves out of
    the finished states, and this statement locks what it deletes); any ticket of a pruned job
    is deleted all the same, since no foreign key cascades the delete to tickets. The row of a
    workflow whose closing marker is pruned is deleted too."""
    old = (
        select(Job.id)
        .where(
            Job.finished_at.is_not(None),
            or_(
                and_(
                    Job.state == JobState.SUCCEEDED,
                    Job.finished_at
                    < func.now() - seconds(bindparam("succeeded_before", type_=Float)),
                ),
                and_(
                    in_states(Job.state, (JobState.FAILED, JobState.CANCELLED)),
                    Job.finished_at < func.now() - seconds(bindparam("failed_before", type_=Float)),
                ),
            ),
            outside_running_workflows(),
        )
        .order_by(Job.finished_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    pruned = delete(Job).where(Job.id.in_(old)).returning(Job.id).cte("pruned")
    tickets = (
        delete(MessageQueue).where(among(MessageQueue.job_id, pruned.c.id)).cte("pruned_tickets")
    )
    # A workflow's row goes with its closing marker, the last of its jobs to end.
    workflows = (
        delete(Workflow).where(among(Workflow.closing_job_id, pruned.c.id)).cte("pruned_workflows")
    )
    return select(func.count()).select_from(pruned).add_cte(tickets, workflows)


@cache
def try_maintenance_lock() -> Select[bool]:
    """Transaction-scoped advisory lock electing one maintenance leader per database."""
    return select(func.pg_try_advisory_xact_lock(bindparam("key", type_=BigInteger)))


@cache
def lock_limited_queues() -> Select[str]:
    """Names of limited queues, their control rows locked (SKIP LOCKED) until the transaction
    ends: the first half of ``recount_running``."""
    return (
        select(QueueControl.name)
        .where(QueueControl.concurrency_limit.is_not(None))
        .order_by(QueueControl.name)
        .with_for_update(skip_locked=True)
    )


@cache
def recount_running() -> Any:  # a ReturningUpdate
    """Reset the ``running`` counter of the queues ``names`` (array) to their RUNNING jobs,
    where it drifted. Returns ``(name, running)`` for the corrected queues.

    Run in the transaction that locked those rows (``lock_limited_queues``), as a later
    statement: its snapshot then holds every claim that counted against the queue (claims take
    the row lock), and a job leaving RUNNING right now still counts as running here, because
    its statement also updates the locked row and so waits to commit until after this one.
    """
    return recounted(QueueControl.name, QueueControl.running, Job.queue, "names")


def _idle_key() -> ColumnElement[bool]:
    """A key row no one needs: nothing counted as running, no rate window still holding a
    start, and no job with the key (in any state: a waiting dependent, a retry or a re-run of
    a finished job gets a ticket without writing the key row, and the task's limit lives only
    on it) nor a ticket of its hash."""
    rate_limit, rate_per = flow_sql.key_rate_of(ConcurrencyKey.key)
    in_window = case(
        (
            rate_limit.is_not(None),
            flow_sql.starts_in_window(ConcurrencyKey.recent_starts, rate_per),
        ),
        else_=0,
    )
    has_job = select(literal(1)).where(Job.concurrency_key == ConcurrencyKey.key).exists()
    has_ticket = (
        select(literal(1)).where(MessageQueue.key_hash == key_hash(ConcurrencyKey.key)).exists()
    )
    return and_(ConcurrencyKey.running == 0, in_window == 0, ~has_job, ~has_ticket)


@cache
def lock_idle_keys() -> Select[Any, list[str]]:
    """Of up to ``limit`` key rows after key ``after`` (key order), lock the idle ones (SKIP
    LOCKED: a row a claim or an uncommitted enqueue holds is not idle); returns ``(last key
    read or null, locked keys)``: the first half of ``delete_idle_keys``.

    An enqueue holds a ``FOR KEY SHARE`` lock on its key's row until it commits, which this
    ``FOR UPDATE`` skips; one that comes later waits for this transaction, and finds the row
    deleted (and inserts it again) or kept."""
    scanned = (
        select(ConcurrencyKey.key)
        .where(ConcurrencyKey.key > bindparam("after", type_=Text))
        .order_by(ConcurrencyKey.key)
        .limit(bindparam("limit", type_=Integer))
        .cte("scanned_keys")
    )
    idle = (
        select(ConcurrencyKey.key)
        .where(among(ConcurrencyKey.key, scanned.c.key), _idle_key())
        .order_by(ConcurrencyKey.key)
        .with_for_update(skip_locked=True)
        .cte("idle_keys")
    )
    return select(
        select(func.max(scanned.c.key)).scalar_subquery(),
        func.array(select(idle.c.key).scalar_subquery()),
    )


@cache
def delete_idle_keys() -> Any:  # a ReturningDelete
    """Delete the rows of the keys ``keys`` (array) that are still idle; returns their keys.

    Run in the transaction that locked those rows (``lock_idle_keys``), as a later statement:
    its snapshot (which its ``NOT EXISTS`` reads) holds every job whose enqueue committed
    before it began, an enqueue still open holds its row (skipped there) or waits for this
    transaction, and the lock keeps the row's own columns as they were."""
    return (
        delete(ConcurrencyKey)
        .where(ConcurrencyKey.key == func.any(array_param("keys", Text)), _idle_key())
        .returning(ConcurrencyKey.key)
    )


@cache
def set_lock_timeout() -> Select[Any]:
    """``lock_timeout`` for the current transaction only: ``ms`` (milliseconds, as text)."""
    return select(func.set_config("lock_timeout", bindparam("ms", type_=Text), True))
