"""Statements of the admin surface (``PgQueue`` methods, the CLIs and the Flask dashboard): one job,
state counts, the oldest waiting ticket per queue, finished jobs per minute, and the manual
actions (re-run, cancel, delete); the paged job lists are in ``sql.job_lists``. Read-mostly, and kept apart from the worker's
hot path.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.orm import selectinload
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.models import FinishedMinute, Job, JobHistory, MessageQueue
from pgqueue.sql.common import (
    CLEAR_LEASE,
    announced,
    deleted_by_hand,
    ids_with_new_tickets,
    in_states,
    minute_of,
    retried_or_cancelled_by_hand,
    seconds,
    source_states,
)
from pgqueue.sql.job_lists import job_model
from pgqueue.states import (
    CANCEL,
    FINAL_STATES,
    RERUN,
    JobState,
)


@cache
def get_job() -> Select[Job]:
    """One job by ``job_id``, with its durable steps (a second, keyed read of them)."""
    return (
        select(Job)
        .where(Job.id == bindparam("job_id", type_=BigInteger))
        .options(selectinload(Job.steps))
    )


@cache
def get_moved_job() -> Select[JobHistory]:
    """One moved job by ``job_id`` from ``pgqueue_job_history`` (each partition's primary key
    probed by id)."""
    return select(JobHistory).where(JobHistory.id == bindparam("job_id", type_=BigInteger))


@cache
def mark_awaited() -> ReturningUpdate[tuple[int]]:
    """Mark job ``job_id`` as awaited unless it is finished or already marked (so a second
    waiter writes nothing). Binds ``job_id``.

    An UPDATE of the job's own row, so it orders with the statement that ends the job: whichever
    takes the row first, the other sees its write (the ending sees ``awaited`` and announces;
    or the mark finds the job finished and the waiter's next read returns it)."""
    return (
        update(Job)
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            Job.awaited.is_(false()),
            in_states(Job.state, frozenset(JobState) - FINAL_STATES),
        )
        .values(awaited=true())
        .returning(Job.id)
    )


@cache
def job_state_counts() -> Select[str, JobState, int]:
    """``(queue, state, count)`` over all jobs."""
    return select(Job.queue, Job.state, func.count()).group_by(Job.queue, Job.state)


# A manual re-run's ``max_attempts``: room for one more attempt when the job has none left, as
# operators expect of a manual retry (it runs once more, and the job never reads "6 of 5"); a
# job cancelled before using its attempts keeps its maximum.
RERUN_MAX_ATTEMPTS: Final[ColumnElement[int]] = func.greatest(
    Job.max_attempts, Job.attempts + 1, type_=Integer
)


# What a manual re-run writes (``rerun`` here, and the bulk retry of ``pgqueue.sql.bulk``).
RERUN_VALUES: Final[dict[str, Any]] = {
    "state": RERUN.target,
    "max_attempts": RERUN_MAX_ATTEMPTS,
    "run_at": func.now(),
    "finished_at": null(),
    "updated_at": func.now(),
    "cancel_requested": False,
    **CLEAR_LEASE,
}


@cache
def rerun() -> Select[int]:
    """FAILED/CANCELLED -> QUEUED with a ticket for now (``retry_job``). Binds ``job_id``.

    The attempt count is kept (the history stays true); ``max_attempts`` is raised to make room
    for at least one more attempt, so the next attempt is within the job's stated bounds.
    """
    updated = (
        update(Job)
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            source_states(RERUN),
            retried_or_cancelled_by_hand(),
        )
        .values(**RERUN_VALUES)
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key)
        .cte("rerun")
    )
    return ids_with_new_tickets(updated)


@cache
def rerun_key() -> Select[str | None]:
    """The ``unique_key`` of job ``job_id`` when ``rerun`` would move it (FAILED/CANCELLED, of
    no workflow or its ``on_failure`` job); no row otherwise. Binds ``job_id``."""
    return select(Job.unique_key).where(
        Job.id == bindparam("job_id", type_=BigInteger),
        source_states(RERUN),
        retried_or_cancelled_by_hand(),
    )


def _ticket_deleted(job_id: Any, name: str) -> Any:
    """CTE named ``name``: delete the ticket of job ``job_id`` (if any), returning its job id."""
    return (
        delete(MessageQueue)
        .where(MessageQueue.job_id == job_id)
        .returning(MessageQueue.job_id)
        .cte(name)
    )


# What a cancel of a waiting job writes (``cancel_waiting`` here, and the bulk cancel of
# ``pgqueue.sql.bulk``). Binds ``reason``.
CANCEL_VALUES: Final[dict[str, Any]] = {
    "state": CANCEL.target,
    "finished_at": func.now(),
    "updated_at": func.now(),
    "last_error": bindparam("reason", type_=Text),
}


@cache
def cancel_waiting() -> Select[int, list[int] | None]:
    """QUEUED/RETRYING -> CANCELLED, deleting the ticket. Binds ``job_id``, ``reason``."""
    job_id = bindparam("job_id", type_=BigInteger)
    gone = _ticket_deleted(job_id, "gone")
    # A WAITING job (blocked on dependencies) has no ticket to delete.
    has_ticket_or_blocked = or_(
        Job.id.in_(select(gone.c.job_id)), Job.state == JobState.WAITING.value
    )
    updated = (
        update(Job)
        .where(
            Job.id == job_id,
            has_ticket_or_blocked,
            source_states(CANCEL),
            retried_or_cancelled_by_hand(),
        )
        .values(**CANCEL_VALUES)
        .returning(Job.id, Job.dependents, Job.awaited)
        .cte("cancelled")
    )
    return select(updated.c.id, updated.c.dependents).where(announced(updated))


@cache
def request_cancel_running() -> ReturningUpdate[int]:
    """Flag a RUNNING job for cancellation; its worker sees it at the next heartbeat."""
    return (
        update(Job)
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            Job.state == JobState.RUNNING,
            retried_or_cancelled_by_hand(),
        )
        .values(cancel_requested=True, updated_at=func.now())
        .returning(Job.id)
    )


@cache
def oldest_waiting_per_queue() -> Select[str, int, Any, Any]:
    """``(queue, job_id, run_at, waiting_seconds)``: per queue, the ticket with the earliest
    ``run_at`` (``waiting_seconds`` is negative for a job scheduled in the future).

    Reads the ticket table, which holds waiting work only, so this stays small."""
    from sqlalchemy.dialects.postgresql import distinct_on  # only this dashboard query needs it

    return (
        select(
            MessageQueue.queue,
            MessageQueue.job_id,
            MessageQueue.run_at,
            func.extract("epoch", func.now() - MessageQueue.run_at).label("waiting_seconds"),
        )
        .ext(distinct_on(MessageQueue.queue))
        .order_by(MessageQueue.queue, MessageQueue.run_at, MessageQueue.job_id)
    )


@cache
def finished_per_minute() -> Select[str, JobState, int, int]:
    """``(queue, state, minutes_ago, count)`` for jobs finished in the last hour, bucketed by
    whole minutes before ``now()`` (0 = the current minute). Uses the ``finished_at`` index."""
    minutes_ago = cast(func.floor(seconds_ago(Job.finished_at) / 60.0), Integer).label(
        "minutes_ago"
    )
    return (
        select(Job.queue, Job.state, minutes_ago, func.count())
        .where(
            Job.finished_at.is_not(None),
            Job.finished_at > func.now() - seconds(literal(3600.0)),
        )
        .group_by(Job.queue, Job.state, minutes_ago)
    )


@cache
def finished_per_clock_minute() -> Select[str, JobState, int, int]:
    """``(queue, state, minutes_ago, count)`` over the last 60 clock minutes (0 = the current
    one, whole minutes since the Unix epoch) under the partitioned history: the jobs still in
    ``pgqueue_jobs`` (of the ``cap`` most recently finished, ``newest_finished``) plus the
    moved ones' counts in ``pgqueue_finished_minutes``, which the move writes as it deletes
    them. One statement, so one snapshot: a job moved meanwhile is counted exactly once."""
    this_minute = minute_of(func.now())
    since = this_minute - seconds(literal(59 * 60.0))
    recent = newest_finished(Job, Job.queue, Job.state, Job.finished_at)
    minute = minute_of(recent.c.finished_at).label("minute")
    live = (
        select(recent.c.queue, recent.c.state, minute, func.count().label("jobs"))
        .where(recent.c.finished_at >= since)
        .group_by(recent.c.queue, recent.c.state, minute)
    )
    moved = select(
        FinishedMinute.queue, FinishedMinute.state, FinishedMinute.minute, FinishedMinute.jobs
    ).where(FinishedMinute.minute >= since)
    both = union_all(live, moved).subquery("both_tables")
    minutes_ago = cast(
        func.round(func.extract("epoch", this_minute - both.c.minute) / 60), Integer
    ).label("minutes_ago")
    return select(both.c.queue, both.c.state, minutes_ago, func.sum(both.c.jobs)).group_by(
        both.c.queue, both.c.state, minutes_ago
    )


def seconds_ago(at: Any) -> ColumnElement[float]:
    """Seconds from ``at`` to ``now()`` as a float: ``date_part``, which stays in floating
    point, where ``extract`` computes in numeric (since PostgreSQL 14), at several times the
    cost per row of a chart's tens of thousands. Buckets come out the same: the float of a
    whole number of microseconds under a day is within 1e-9 s of it, far nearer than the next
    microsecond, and bucket edges are whole seconds (which a double holds exactly)."""
    seconds: ColumnElement[float] = func.date_part(
        literal_column("'epoch'"), func.now() - at, type_=Float
    )
    return seconds


def newest_finished(Job: Any, *columns: Any) -> Any:  # a Subquery
    """``columns`` of the ``cap`` (a bind) most recently finished jobs, newest first.

    The only condition is the ``finished_at`` index's own (``IS NOT NULL``); callers apply
    their window to these rows, and give as ``cap`` the count ``finished_window_edge`` found in
    it. With a range on ``finished_at`` here the planner would guess how many jobs the range
    holds, and on statistics taken before a burst (until autovacuum's next ANALYZE) a guess
    below ``cap`` has it read every job of the range and sort them, where a walk of the index
    stops after ``cap`` entries. The price: the count's walk reads ``cap`` index entries even
    when the window holds fewer jobs."""
    return (
        select(*columns)
        .where(Job.finished_at.is_not(None))
        .order_by(Job.finished_at.desc())
        .limit(bindparam("cap", type_=Integer))
        .subquery("recent")
    )


def _within_window(finished_at: Any) -> ColumnElement[bool]:
    """Finished during the last ``window`` seconds (a bound float)."""
    within: ColumnElement[bool] = finished_at >= func.now() - seconds(
        bindparam("window", type_=Float)
    )
    return within


@cache
def finished_window_edge(history: bool = False) -> Select[int, float | None]:
    """``(count, seconds_ago)``: how many of the ``cap`` most recently finished jobs finished
    within the last ``window`` seconds, and how many seconds ago the oldest of those did (null
    when none did). A count of ``cap`` means the window holds at least that many jobs, and the
    oldest counted marks the window of the ``cap`` newest. Reads ``cap`` entries of the
    ``finished_at`` index (fewer when fewer jobs have finished), an index-only scan
    (``newest_finished``). ``history``: in ``pgqueue_job_history``."""
    Job = job_model(history)
    recent = newest_finished(Job, Job.finished_at)
    return select(
        func.count(), func.extract("epoch", func.now() - func.min(recent.c.finished_at))
    ).where(_within_window(recent.c.finished_at))


@cache
def finished_per_bucket(history: bool = False) -> Select[str, JobState, int, int]:
    """``(queue, state, buckets_ago, count)`` for jobs finished in the last ``window`` seconds,
    bucketed by ``width`` seconds before ``now()`` (0 = the newest bucket); of the ``cap`` most
    recently finished jobs only (``newest_finished``), so callers give the count
    ``finished_window_edge`` found in the window. ``history``: in ``pgqueue_job_history``."""
    Job = job_model(history)
    recent = newest_finished(Job, Job.queue, Job.state, Job.finished_at)
    buckets_ago = cast(
        func.floor(seconds_ago(recent.c.finished_at) / bindparam("width", type_=Float)),
        Integer,
    ).label("buckets_ago")
    return (
        select(recent.c.queue, recent.c.state, buckets_ago, func.count())
        .where(_within_window(recent.c.finished_at))
        .group_by(recent.c.queue, recent.c.state, buckets_ago)
    )


# The dependents a deleted job leaves behind: those of a job that had not SUCCEEDED, which can
# now never succeed (``sql.dependencies.abandon_orphans`` cancels them). A SUCCEEDED job released its
# dependents when it ended, and deleting it (pruned history, say) must not cancel the ones still
# waiting on another dependency.
ORPHANED: Final[ColumnElement[list[int] | None]] = case(
    (Job.state != JobState.SUCCEEDED.value, Job.dependents), else_=null()
)


@cache
def delete_job() -> Any:  # a ReturningDelete
    """Delete one job that is not RUNNING, and its ticket. Binds ``job_id``; returns the id and
    the dependents it orphans (``ORPHANED``) when deleted. A running job is left alone: its
    worker still holds it and would report an outcome for a missing row (and it has no ticket:
    the claim deleted it).

    The ticket goes first, in the claim's lock order (ticket, then job), so this statement and
    a claim of the same job cannot deadlock: whichever locks the ticket first wins, and the
    other finds it gone (the claim then skips it, or this sees the job RUNNING and stops)."""
    job_id = bindparam("job_id", type_=BigInteger)
    ticket = _ticket_deleted(job_id, "gone_ticket")
    ticket_first = select(func.count()).select_from(ticket).scalar_subquery() >= 0
    return (
        delete(Job)
        .where(Job.id == job_id, Job.state != JobState.RUNNING, ticket_first, deleted_by_hand())
        .returning(Job.id, ORPHANED)
    )


@cache
def job_count() -> Select[int]:
    """The number of rows in ``pgqueue_jobs``."""
    return select(func.count()).select_from(Job)


@cache
def ticket_count() -> Select[int]:
    """The number of rows (tickets) in ``pgqueue_message_queue``."""
    return select(func.count()).select_from(MessageQueue)


@cache
def states_of_jobs() -> Select[int, JobState]:
    """``(id, state)`` of the jobs ``job_ids`` (an expanding list) that exist."""
    return select(Job.id, Job.state).where(Job.id.in_(bindparam("job_ids", expanding=True)))
