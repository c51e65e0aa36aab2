"""Statements of an operator's edits of one job that has not started: a new ``run_at``
(``reschedule``, ``run_now``) or a new priority (``reprioritize``), on the job's row and on its
ticket in one statement, and the read that says why an edit changed nothing.

Each edit is one of the state-keeping edits of ``pgqueue.states`` (``RESCHEDULE``,
``REPRIORITIZE``), guarded by its source states. The ticket is written first, in the claim's lock
order (ticket, then job): a claim that holds the ticket makes the edit wait and then find it
gone (the job is RUNNING by then, and the edit changes nothing); an edit that holds it makes a
claim skip it until the edit commits.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Select,
    SmallInteger,
    and_,
    bindparam,
    exists,
    func,
    or_,
    select,
    update,
)

from pgqueue.models import Job, JobSuspension, MessageQueue
from pgqueue.sql.common import in_states, not_a_closing_marker, woken
from pgqueue.states import BLOCKED_STATES, REPRIORITIZE, RESCHEDULE, WAITING_STATES, Edit


def suspended() -> ColumnElement[bool]:
    """The job is suspended (``ctx.sleep``, ``ctx.wait_for_signal``): QUEUED by the suspension
    recorded for it, which describes it while its ``updated_at`` is the suspension's."""
    return exists(
        select(JobSuspension.job_id).where(
            JobSuspension.job_id == Job.id,
            JobSuspension.suspended_at == Job.updated_at,
            Job.state == "queued",
        )
    )


def _editable(edit: Edit) -> ColumnElement[bool]:
    guard = [in_states(Job.state, edit.sources), not_a_closing_marker()]
    return and_(*guard) if edit.suspended else and_(*guard, ~suspended())


def _edited(
    edit: Edit, ticket_values: dict[str, Any], job_values: dict[str, Any], *, wake: bool
) -> Any:
    """``edit`` of job ``target``: ``ticket_values`` on its ticket and ``job_values`` on its row,
    when it is in one of the edit's states; returns its ``(id, run_at, priority)`` then, else no
    row. With ``wake``, tells idle workers of the ticket's queue of its new ``run_at`` (a ticket
    moved to now is claimable at once)."""
    # Not named ``job_id``: an UPDATE of the tickets would SET the column a bind is named after.
    job_id = bindparam("target", type_=BigInteger)
    holds_ticket = (
        select(Job.id)
        .where(Job.id == job_id, _editable(edit), in_states(Job.state, WAITING_STATES))
        .exists()
    )
    ticket = (
        update(MessageQueue)
        .where(MessageQueue.job_id == job_id, holds_ticket)
        .values(**ticket_values)
        .returning(MessageQueue.job_id, MessageQueue.queue, MessageQueue.run_at)
        .cte(f"{edit.name}_ticket")
    )
    # A WAITING job has no ticket: its unblock makes one from the row.
    ticket_or_blocked = or_(
        Job.id.in_(select(ticket.c.job_id)), in_states(Job.state, BLOCKED_STATES)
    )
    job = (
        update(Job)
        .where(Job.id == job_id, _editable(edit), ticket_or_blocked)
        .values(**job_values)
        .returning(Job.id, Job.run_at, Job.priority)
        .cte(f"{edit.name}_job")
    )
    edited = select(job.c.id, job.c.run_at, job.c.priority)
    return edited.where(woken(ticket)) if wake else edited


@cache
def reschedule(*, now: bool) -> Any:  # a Select of (id, run_at, priority)
    """Give job ``target`` (QUEUED, RETRYING or WAITING, not suspended) ``new_run_at``, or
    with ``now`` the database's ``now()``, on its row and its ticket. Returns its
    ``(id, run_at, priority)`` when edited."""
    run_at: Any = func.now() if now else bindparam("new_run_at", type_=DateTime(timezone=True))
    return _edited(RESCHEDULE, {"run_at": run_at}, {"run_at": run_at}, wake=True)


@cache
def reprioritize() -> Any:  # a Select of (id, run_at, priority)
    """Give job ``target`` (QUEUED, RETRYING or WAITING) ``new_priority``,
    on its row and its ticket. Returns its ``(id, run_at, priority)`` when edited."""
    priority = bindparam("new_priority", type_=SmallInteger)
    # No wake-up: a ticket ready now was claimable before, and one due later is still due then.
    return _edited(REPRIORITIZE, {"priority": priority}, {"priority": priority}, wake=False)


@cache
def edit_refusal() -> Select[Any, Any, Any, bool]:
    """Of job ``job_id``: its state, workflow role, workflow id and whether it is suspended;
    read after an edit changed nothing, to say why."""
    return select(Job.state, Job.workflow_role, Job.workflow_id, suspended()).where(
        Job.id == bindparam("job_id", type_=BigInteger)
    )
