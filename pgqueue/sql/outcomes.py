"""Statements that write what became of running jobs, batched over parallel arrays and guarded by
the lease token (a worker whose lease was lost updates 0 rows): complete, retry, fail, cancelled,
release, snooze, suspend; the heartbeat that extends leases; and the lock that orders a batch.
The settling of the dependents of jobs that ended is ``sql.dependencies``'.

Each outcome statement and the heartbeat has a second form, ``with_progress=True``, that also
writes the progress handlers reported (``JobContext.progress``): two more arrays, null for the
jobs that reported none. The usual form is unchanged, so jobs that report no progress pay
nothing for it. Likewise each outcome statement has a form with ``keyed=False`` for batches
the claim said hold no job with a concurrency key: it leaves the key counters alone
(``sql.common.free_slots``), so queues that use no keys pay nothing for them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    case,
    cast,
    func,
    literal,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import TextClause

from pgqueue.models import Job, JobSuspension
from pgqueue.sql.common import (
    CLEAR_LEASE,
    OUTCOME_AT,
    REQUEUED_OR_ENDED_COLUMNS,
    announced,
    append_error,
    array_param,
    free_slots,
    ids_with_new_tickets,
    locked_in_id_order,
    seconds,
    source_states,
    tickets_for,
    woken,
)
from pgqueue.states import (
    CANCELLED,
    COMPLETE,
    FAIL,
    RELEASE,
    RETRY,
    SNOOZE,
    SUSPEND,
    JobState,
    Transition,
)

# The arrays of reported progress, as ``(column, bind, type)``: bound under names that are not
# columns of the table, which SQLAlchemy would otherwise SET from the same-named bind.
_PROGRESS_ARRAYS: tuple[tuple[str, str, Any], ...] = (
    ("progress", "progress_values", Float),
    ("progress_message", "progress_messages", Text),
)


def _outcome_rows(*extra: tuple[str, str, Any], progress: bool = False) -> Any:
    """``unnest`` of the binds ``ids``, ``tokens`` and each ``(column, bind, type)`` of
    ``extra`` (and, with ``progress``, ``progress_values`` and ``progress_messages``): one row
    per job, its columns named ``id``, ``token`` and each ``column``."""
    if progress:
        extra = (*extra, *_PROGRESS_ARRAYS)
    names = ["id", "token", *(column for column, _, _ in extra)]
    arrays = [
        array_param("ids", BigInteger),
        array_param("tokens", Uuid),
        *(array_param(bind, item_type) for _, bind, item_type in extra),
    ]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="v")


def _progress_values(rows: Any, progress: bool) -> dict[str, Any]:
    """With ``progress``, the SET items writing the reported progress of each row of ``rows``;
    a row whose progress is null (its handler reported none) keeps the stored one."""
    if not progress:
        return {}
    reported = rows.c.progress.is_not(None)
    return {
        "progress": func.coalesce(rows.c.progress, Job.progress),
        "progress_message": case((reported, rows.c.progress_message), else_=Job.progress_message),
        "progress_at": case((reported, OUTCOME_AT), else_=Job.progress_at),
    }


def _leased(transition: Transition, rows: Any) -> ColumnElement[bool]:
    """The row of ``rows`` is this job, in a source state of ``transition``, under its lease."""
    return and_(Job.id == rows.c.id, source_states(transition), Job.lease_token == rows.c.token)


@cache
def complete(with_progress: bool = False, keyed: bool = True) -> Select[int, list[int] | None]:
    """RUNNING -> SUCCEEDED for many jobs. Binds ``ids``, ``tokens``, ``results`` (JSON text).

    Clears ``last_error`` (a succeeded job has none; the failed attempts stay in ``errors``).
    Returns the ids actually updated; a missing id means that worker's lease was lost.
    """
    rows = _outcome_rows(("result", "results", Text), progress=with_progress)
    completed = (
        update(Job)
        .where(_leased(COMPLETE, rows))
        .values(
            state=COMPLETE.target,
            result=cast(rows.c.result, JSON),
            last_error=null(),
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            **CLEAR_LEASE,
            **_progress_values(rows, with_progress),
        )
        .returning(Job.id, Job.queue, Job.concurrency_key, Job.dependents, Job.awaited)
        .cte("completed")
    )
    return (
        select(completed.c.id, completed.c.dependents)
        .add_cte(*free_slots(completed, keyed))
        .where(announced(completed))
    )


@cache
def retry(with_progress: bool = False, keyed: bool = True) -> Select[int]:
    """RUNNING -> RETRYING for many jobs, each with a new ticket at ``now() + delay``.

    Binds ``ids``, ``tokens``, ``delays`` (seconds), ``errors`` (text). Returns updated ids.
    """
    rows = _outcome_rows(
        ("delay", "delays", Float), ("error", "errors", Text), progress=with_progress
    )
    updated = (
        update(Job)
        .where(_leased(RETRY, rows))
        .values(
            state=RETRY.target,
            run_at=OUTCOME_AT + seconds(rows.c.delay),
            updated_at=OUTCOME_AT,
            last_error=rows.c.error,
            errors=append_error(Job.attempts, rows.c.error),
            **CLEAR_LEASE,
            **_progress_values(rows, with_progress),
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key)
        .cte("retried")
    )
    return ids_with_new_tickets(updated).add_cte(*free_slots(updated, keyed))


def _end_with_error(
    transition: Transition, name: str, *, record: bool, with_progress: bool, keyed: bool
) -> Any:
    """RUNNING -> ``transition.target`` for many jobs, ``errors`` as their last error (and,
    with ``record``, appended to their error history); returns the ids and dependents of the
    jobs moved. The CTE is named ``name``."""
    rows = _outcome_rows(("error", "errors", Text), progress=with_progress)
    # Explicit when not recorded, or SQLAlchemy would SET errors from the same-named bind.
    history = append_error(Job.attempts, rows.c.error) if record else Job.errors
    ended = (
        update(Job)
        .where(_leased(transition, rows))
        .values(
            state=transition.target,
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            last_error=rows.c.error,
            errors=history,
            **CLEAR_LEASE,
            **_progress_values(rows, with_progress),
        )
        .returning(Job.id, Job.queue, Job.concurrency_key, Job.state, Job.dependents, Job.awaited)
        .cte(name)
    )
    return (
        select(ended.c.id, ended.c.dependents)
        .add_cte(*free_slots(ended, keyed))
        .where(announced(ended))
    )


@cache
def fail(with_progress: bool = False, keyed: bool = True) -> Select[int, list[int] | None]:
    """RUNNING -> FAILED for many jobs. Binds ``ids``, ``tokens``, ``errors``."""
    failed: Select[int, list[int] | None] = _end_with_error(
        FAIL, "failed", record=True, with_progress=with_progress, keyed=keyed
    )
    return failed


@cache
def mark_cancelled(
    with_progress: bool = False, keyed: bool = True
) -> Select[int, list[int] | None]:
    """RUNNING -> CANCELLED for jobs whose handler stopped on a cancel request.

    Binds ``ids``, ``tokens``, ``errors`` (the reason)."""
    stopped: Select[int, list[int] | None] = _end_with_error(
        CANCELLED, "stopped", record=False, with_progress=with_progress, keyed=keyed
    )
    return stopped


@cache
def release(with_progress: bool = False, keyed: bool = True) -> Select[int]:
    """RUNNING -> QUEUED at shutdown, ticket at now(); the interrupted attempt is not counted.

    Binds ``ids``, ``tokens``."""
    rows = _outcome_rows(progress=with_progress)
    updated = (
        update(Job)
        .where(_leased(RELEASE, rows))
        .values(
            state=RELEASE.target,
            attempts=Job.attempts - 1,
            run_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            **CLEAR_LEASE,
            **_progress_values(rows, with_progress),
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key)
        .cte("released")
    )
    return ids_with_new_tickets(updated).add_cte(*free_slots(updated, keyed))


@cache
def snooze(with_progress: bool = False, keyed: bool = True) -> Select[int, list[int] | None]:
    """RUNNING -> QUEUED for many jobs whose handler raised ``Snooze``: a ticket at
    ``now() + delay``, the attempt the claim counted given back (``attempts - 1``), no error
    recorded, ``snoozes + 1``.

    A job that already snoozed ``max_snoozes`` times is written as a failed attempt instead, in
    the same statement: ``retry`` (ticket at ``now() + delay``) or, on its last attempt,
    ``fail``, with an error saying why; ``snoozes`` still counts it. Binds ``ids``, ``tokens``,
    ``delays`` (seconds), ``max_snoozes`` (integers). Returns the ids updated, and the
    dependents of those that failed.
    """
    rows = _outcome_rows(
        ("delay", "delays", Float),
        ("max_snoozes", "max_snoozes", Integer),
        progress=with_progress,
    )
    error = func.concat(
        literal("Snooze: snooze "),
        Job.snoozes + 1,
        literal(" of this job is past the max_snoozes setting ("),
        rows.c.max_snoozes,
        literal("), so it counts as a failed attempt"),
    )
    free = Job.snoozes < rows.c.max_snoozes
    exhausted = Job.attempts >= Job.max_attempts
    failed = and_(~free, exhausted)
    new_state = case(
        (free, literal(SNOOZE.target.value)),
        (exhausted, literal(FAIL.target.value)),
        else_=literal(RETRY.target.value),
    )
    updated = (
        update(Job)
        .where(_leased(SNOOZE, rows))
        .values(
            state=new_state,
            attempts=case((free, Job.attempts - 1), else_=Job.attempts),
            snoozes=Job.snoozes + 1,
            run_at=case((failed, Job.run_at), else_=OUTCOME_AT + seconds(rows.c.delay)),
            finished_at=case((failed, OUTCOME_AT), else_=null()),
            updated_at=OUTCOME_AT,
            last_error=case((free, Job.last_error), else_=error),
            errors=case((free, Job.errors), else_=append_error(Job.attempts, error)),
            **CLEAR_LEASE,
            **_progress_values(rows, with_progress),
        )
        .returning(*REQUEUED_OR_ENDED_COLUMNS)
        .cte("snoozed")
    )
    ended = updated.c.state == FAIL.target.value
    tickets = tickets_for(updated, "snooze_tickets", ~ended)
    return (
        select(updated.c.id, case((ended, updated.c.dependents), else_=null()))
        .add_cte(tickets, *free_slots(updated, keyed))
        .where(woken(tickets), announced(updated, ended))
    )


@cache
def suspend(with_progress: bool = False, keyed: bool = True) -> Select[int, None]:
    """RUNNING -> QUEUED for many jobs whose handler called ``ctx.sleep`` or
    ``ctx.wait_for_signal``: a ticket at the wake time (the end of the sleep, the wait's
    deadline), the attempt the claim counted given back (``attempts - 1``), no error recorded,
    and what the job waits for recorded in ``pgqueue_job_suspensions`` (``suspended_at`` equal
    to the job's new ``updated_at``). Binds ``ids``, ``tokens``, ``wake_ats`` (epoch seconds,
    database clock), ``signals`` (the awaited signal's name, null for a sleep). Returns the ids
    updated. ``sql.signals.wake_signalled`` follows it in the same transaction."""
    rows = _outcome_rows(
        ("wake_at", "wake_ats", Float), ("signal", "signals", Text), progress=with_progress
    )
    updated = (
        update(Job)
        .where(_leased(SUSPEND, rows))
        .values(
            state=SUSPEND.target,
            attempts=Job.attempts - 1,
            run_at=func.to_timestamp(rows.c.wake_at),
            updated_at=OUTCOME_AT,
            **CLEAR_LEASE,
            **_progress_values(rows, with_progress),
        )
        .returning(*REQUEUED_OR_ENDED_COLUMNS, Job.updated_at, rows.c.signal)
        .cte("suspended")
    )
    recorded = insert(JobSuspension).from_select(
        ["job_id", "signal", "wake_at", "suspended_at"],
        select(updated.c.id, updated.c.signal, updated.c.run_at, updated.c.updated_at),
    )
    recorded = recorded.on_conflict_do_update(
        index_elements=[JobSuspension.job_id],
        set_={
            "signal": recorded.excluded.signal,
            "wake_at": recorded.excluded.wake_at,
            "suspended_at": recorded.excluded.suspended_at,
        },
    )
    tickets = tickets_for(updated, "suspend_tickets")
    return (
        select(updated.c.id, null())
        .add_cte(tickets, recorded.cte("suspensions"), *free_slots(updated, keyed))
        .where(woken(tickets))
    )


@cache
def heartbeat(with_progress: bool = False) -> ReturningUpdate[int, bool]:
    """Extend the leases of running jobs. Binds ``ids``, ``tokens``, ``lease_seconds`` (one
    lease length per job).

    Returns ``(id, cancel_requested)`` for each lease still held, so cancel requests reach the
    worker within one heartbeat.
    """
    rows = _outcome_rows(("lease_seconds", "lease_seconds", Float), progress=with_progress)
    return (
        update(Job)
        .where(
            Job.id == rows.c.id,
            Job.state == JobState.RUNNING,
            Job.lease_token == rows.c.token,
            Job.id.in_(locked_in_id_order(Job.state == JobState.RUNNING)),
        )
        .values(
            lease_expires_at=func.now() + seconds(rows.c.lease_seconds),
            **_progress_values(rows, with_progress),
        )
        .returning(Job.id, Job.cancel_requested)
    )


@cache
def lock_jobs() -> Select[int]:
    """Lock the rows of jobs ``ids`` (array) in id order, first thing in a transaction that
    then updates them in several statements (``record_outcomes``). Binds ``ids``."""
    return locked_in_id_order()


@cache
def check_deferred_constraints() -> TextClause:
    """``SET CONSTRAINTS ALL IMMEDIATE``: check the transaction's deferred constraints now (a
    violation raises here, not at the commit)."""
    return text("SET CONSTRAINTS ALL IMMEDIATE")
