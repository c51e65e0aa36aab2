"""Statements of the bulk actions (retry, cancel or delete the jobs a filter chooses) and of
their audit record.

Each action is one set-based statement per table, built on one predicate (``matching``) that
the dry run's count shares, so the count is of exactly the rows the action would change. The
statements write the same values (``sql.admin.RERUN_VALUES``, ``CANCEL_VALUES``), under the
same guards and in the same lock order (ticket, then job), as the single-job statements of
``pgqueue.sql.admin``. Builders are cached by the filter's ``Shape`` (which fields are given);
the values are binds:

- ``filter_states``: array of state names (always; narrowed to the action's states);
- ``filter_queue``, ``filter_task``, ``since``, ``until``, and ``error_pattern`` (an ``ILIKE``
  pattern whose escape character is ``\\``), each when the shape says the field is given.

No bind is named like a column of ``pgqueue_jobs``: SQLAlchemy would take such a parameter of an
``UPDATE`` for a value to set.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from pgqueue.models import AuditRecord, Job, MessageQueue
from pgqueue.sql.admin import CANCEL_VALUES, ORPHANED, RERUN_VALUES
from pgqueue.sql.common import (
    announced,
    array_param,
    cancel_flags,
    deleted_by_hand,
    listed_by_state,
    retried_or_cancelled_by_hand,
    running,
    source_states,
    tickets_for,
    woken,
)
from pgqueue.states import CANCEL, RERUN, JobState


class Shape(NamedTuple):
    """Which fields of a filter are given (the values are binds); ``time_column`` is the column
    ``since``/``until`` bound; ``deleting``: the filter chooses jobs to delete (the jobs of ended
    workflows may be), not to retry or cancel (of no workflow, or an ended workflow's
    ``on_failure`` job), as the single-job statements choose."""

    by_queue: bool
    by_task: bool
    since: bool
    until: bool
    time_column: str
    by_error: bool
    deleting: bool


def matching(shape: Shape) -> ColumnElement[bool]:
    """The filter: the job is in one of ``states`` and matches every given field; a job its
    workflow settles never matches (``sql.common.deleted_by_hand``,
    ``retried_or_cancelled_by_hand``)."""
    conditions: list[ColumnElement[bool]] = [
        Job.state == func.any(array_param("filter_states", Text)),
        deleted_by_hand() if shape.deleting else retried_or_cancelled_by_hand(),
    ]
    if shape.by_queue:
        conditions.append(Job.queue == bindparam("filter_queue", type_=Text))
    if shape.by_task:
        conditions.append(Job.task_name == bindparam("filter_task", type_=Text))
    column = Job.finished_at if shape.time_column == "finished_at" else Job.created_at
    if shape.since:
        conditions.append(column >= bindparam("since", type_=DateTime(timezone=True)))
    if shape.until:
        conditions.append(column < bindparam("until", type_=DateTime(timezone=True)))
    if shape.by_error:
        pattern = bindparam("error_pattern", type_=Text)
        conditions.append(Job.last_error.ilike(pattern, escape="\\"))
    return and_(*conditions)


@cache
def count(shape: Shape) -> Select[int]:
    """The number of jobs matching the filter (a dry run): those not running, off the indexes
    of ``(queue, state, id)`` and ``(task_name, state, id)``, plus the running ones, off the
    lease index (a statement names each index's predicate to read it)."""
    listed = select(func.count()).select_from(Job).where(matching(shape), listed_by_state())
    running_jobs = select(func.count()).select_from(Job).where(matching(shape), running())
    return select(listed.scalar_subquery() + running_jobs.scalar_subquery())


@cache
def retry(shape: Shape) -> Select[int]:
    """FAILED/CANCELLED matching jobs -> QUEUED with a ticket for now, as ``sql.admin.rerun``
    does one job; returns how many."""
    updated = (
        update(Job)
        .where(matching(shape), source_states(RERUN), listed_by_state())
        .values(**RERUN_VALUES)
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key)
        .cte("rerun")
    )
    tickets = tickets_for(updated, "requeued")
    return select(func.count()).select_from(updated).add_cte(tickets).where(woken(tickets))


@cache
def cancel_waiting(shape: Shape) -> Select[int, list[int] | None]:
    """Matching QUEUED/RETRYING/WAITING jobs -> CANCELLED, their tickets deleted first, as
    ``sql.admin.cancel_waiting`` does one job. Binds ``reason``; returns how many, and the
    dependents of the cancelled jobs (to settle)."""
    gone = (
        delete(MessageQueue)
        .where(MessageQueue.job_id.in_(select(Job.id).where(matching(shape), listed_by_state())))
        .returning(MessageQueue.job_id)
        .cte("gone")
    )
    # A WAITING job (blocked on dependencies) has no ticket to delete; a queued job whose ticket
    # a claim took meanwhile is the claim's.
    has_ticket_or_blocked = or_(
        Job.id.in_(select(gone.c.job_id)), Job.state == JobState.WAITING.value
    )
    updated = (
        update(Job)
        .where(matching(shape), has_ticket_or_blocked, source_states(CANCEL), listed_by_state())
        .values(**CANCEL_VALUES)
        .returning(Job.id, Job.dependents, Job.awaited)
        .cte("cancelled")
    )
    cancelled = select(func.count()).select_from(updated).scalar_subquery()
    dependents = func.array(select(func.unnest(updated.c.dependents)).scalar_subquery())
    return select(cancelled, dependents).where(announced(updated))


@cache
def flag_running(shape: Shape) -> Select[int]:
    """Flag matching RUNNING jobs for cancellation, as ``sql.admin.request_cancel_running`` does
    one job; returns how many. The rows are locked in id order first, the order in which
    heartbeats and outcome writers lock several running jobs, so none of them deadlocks with
    this."""
    return cancel_flags(matching(shape))


@cache
def delete_jobs(shape: Shape) -> Select[int, list[int], list[int]]:
    """Delete the matching jobs that are not RUNNING and their tickets, tickets first, as
    ``sql.admin.delete_job`` does one job; returns how many jobs, the deleted jobs that orphan
    dependents, and those dependents (``sql.admin.ORPHANED``)."""
    ticket = (
        delete(MessageQueue)
        .where(MessageQueue.job_id.in_(select(Job.id).where(matching(shape), listed_by_state())))
        .returning(MessageQueue.job_id)
        .cte("gone_tickets")
    )
    ticket_first = select(func.count()).select_from(ticket).scalar_subquery() >= 0
    deleted = (
        delete(Job)
        .where(matching(shape), listed_by_state(), ticket_first)
        .returning(Job.id, ORPHANED.label("orphaned"))
        .cte("deleted")
    )
    count = select(func.count()).select_from(deleted).scalar_subquery()
    parents = func.array(
        select(deleted.c.id).where(deleted.c.orphaned.is_not(None)).scalar_subquery()
    )
    orphans = func.array(select(func.unnest(deleted.c.orphaned)).scalar_subquery())
    return select(count, parents, orphans)


@cache
def insert_audit() -> Any:  # a ReturningInsert
    """One audit record. Binds ``actor``, ``source``, ``action``, ``filter`` (JSON text) and
    ``count``; returns its id."""
    return (
        insert(AuditRecord)
        .values(
            actor=bindparam("actor", type_=Text),
            source=bindparam("source", type_=Text),
            action=bindparam("action", type_=Text),
            filter=cast(bindparam("filter", type_=Text), JSONB),
            count=bindparam("count", type_=Integer),
        )
        .returning(AuditRecord.id)
    )
