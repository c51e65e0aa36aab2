"""Statements of workflows (``chain``/``group``/``chord``) once inserted: closing one when its
last member ended, settling its ``on_failure`` job, reading it, cancelling it, and counting
workflows by state. Inserting one: ``sql.enqueue``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CompoundSelect,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.orm import aliased

from pgqueue.models import Job, MessageQueue, Workflow
from pgqueue.sql.common import (
    OUTCOME_AT,
    announced,
    array_param,
    cancel_flags,
    source_states,
    tickets_for,
    woken,
)
from pgqueue.sql.job_lists import job_model
from pgqueue.states import ABANDON, CANCEL, CLOSE, CLOSE_FAILED, UNBLOCK, JobState, WorkflowRole

_CLOSING = WorkflowRole.CLOSING.value
_ON_FAILURE = WorkflowRole.ON_FAILURE.value


@cache
def close_workflows() -> Select[Any]:
    """Close the workflows whose closing marker is among the WAITING jobs ``ids`` (array) and
    counted down to 0: the marker moves to SUCCEEDED (``close``) when every member succeeded,
    else to FAILED (``close_failed``), and the workflow's row, still running, takes the same
    state and its end time, in this statement. Returns ``(id, new state, dependents)`` of the
    closed markers (their dependents: the ``on_failure`` job, to count down)."""
    member = aliased(Job, name="member")
    failed = (
        select(literal(1))
        .where(member.id == func.any(Job.depends_on), member.state != JobState.SUCCEEDED.value)
        .exists()
    )
    closed = (
        update(Job)
        .where(
            Job.id == func.any(array_param("ids", BigInteger)),
            source_states(CLOSE),
            Job.workflow_role == _CLOSING,
            Job.pending_dependencies <= 0,
        )
        .values(
            state=case((failed, CLOSE_FAILED.target.value), else_=CLOSE.target.value),
            last_error=case((failed, literal("a member failed or was cancelled")), else_=None),
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
        )
        .returning(Job.id, Job.state, Job.dependents, Job.awaited, Job.workflow_id)
        .cte("closed")
    )
    ended = (
        update(Workflow)
        .where(Workflow.id == closed.c.workflow_id, Workflow.state == "running")
        .values(state=closed.c.state, finished_at=OUTCOME_AT)
        .returning(Workflow.id)
        .cte("ended_workflows")
    )
    return (
        select(closed.c.id, closed.c.state, closed.c.dependents)
        .add_cte(ended)
        .where(announced(closed))
    )


@cache
def settle_on_failure() -> CompoundSelect[Any]:
    """Settle the ``on_failure`` jobs among the WAITING jobs ``ids`` (array) whose countdown
    reached 0 (their workflow closed): released when the workflow FAILED, with the list of its
    failed members (``{"id", "task", "error"}``, by id) as first argument, cancelled otherwise
    (it succeeded or was cancelled). Returns ``(id, new state)``."""
    workflow = aliased(Workflow, name="workflow")
    member = aliased(Job, name="member")
    workflow_failed = (
        select(literal(1))
        .where(workflow.id == Job.workflow_id, workflow.state == JobState.FAILED.value)
        .exists()
    )
    failures = select(
        func.coalesce(
            func.jsonb_agg(
                aggregate_order_by(
                    func.jsonb_build_object(
                        "id", member.id, "task", member.task_name, "error", member.last_error
                    ),
                    member.id,
                )
            ),
            cast(literal("[]"), JSONB),
        )
    ).where(
        member.workflow_id == Job.workflow_id,
        member.state == JobState.FAILED.value,
        or_(member.workflow_role.is_(None), member.workflow_role != _CLOSING),
    )
    arguments = cast(
        func.jsonb_build_array(failures.scalar_subquery()).op("||")(cast(Job.args, JSONB)), JSON
    )
    chosen = and_(
        Job.id == func.any(array_param("ids", BigInteger)),
        source_states(UNBLOCK),
        Job.workflow_role == _ON_FAILURE,
        Job.pending_dependencies <= 0,
    )
    released = (
        update(Job)
        .where(chosen, workflow_failed)
        .values(
            state=UNBLOCK.target,
            run_at=func.greatest(Job.run_at, OUTCOME_AT),
            updated_at=OUTCOME_AT,
            args=arguments,
        )
        .returning(
            Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key
        )
        .cte("released")
    )
    tickets = tickets_for(released, "on_failure_tickets")
    skipped = (
        update(Job)
        .where(chosen, ~workflow_failed)
        .values(
            state=ABANDON.target,
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            last_error=literal("the workflow did not fail; not run"),
        )
        .returning(Job.id, Job.state, Job.awaited)
        .cte("skipped")
    )
    return (
        select(released.c.id, released.c.state)
        .where(woken(tickets))
        .union_all(select(skipped.c.id, skipped.c.state).where(announced(skipped)))
        .add_cte(tickets)
    )


@cache
def workflow_row() -> Select[str, Any, Any, list[int], int, int | None, int]:
    """``(state, created_at, finished_at, final_job_ids, closing_job_id, on_failure_job_id,
    job_count)`` of workflow ``workflow``."""
    return select(
        Workflow.state,
        Workflow.created_at,
        Workflow.finished_at,
        Workflow.final_job_ids,
        Workflow.closing_job_id,
        Workflow.on_failure_job_id,
        Workflow.job_count,
    ).where(Workflow.id == bindparam("workflow", type_=BigInteger))


@cache
def workflow_jobs() -> Select[int, str, JobState, int | None, list[int] | None]:
    """``(id, task_name, state, workflow_role, depends_on)`` of workflow ``workflow``'s jobs, by id."""
    return (
        select(Job.id, Job.task_name, Job.state, Job.workflow_role, Job.depends_on)
        .where(Job.workflow_id == bindparam("workflow", type_=BigInteger))
        .order_by(Job.id)
    )


@cache
def results_of(history: bool = False) -> Select[Any]:
    """``(id, state, result)`` of jobs ``ids`` (array); of the moved jobs with ``history``
    (each history partition's primary key probed by id)."""
    Job = job_model(history)
    return select(Job.id, Job.state, Job.result).where(
        Job.id == func.any(array_param("ids", BigInteger))
    )


@cache
def mark_cancelled() -> Select[Any]:
    """Workflow ``workflow``, still running -> cancelled, locked by this update until the transaction
    ends; returns its id (none when it was not running)."""
    cancelled = (
        update(Workflow)
        .where(Workflow.id == bindparam("workflow", type_=BigInteger), Workflow.state == "running")
        .values(state="cancelled", finished_at=func.now())
        .returning(Workflow.id)
        .cte("cancelled_workflow")
    )
    return select(cancelled.c.id)


@cache
def cancel_waiting_jobs() -> Select[Any]:
    """Workflow ``workflow``'s QUEUED/RETRYING/WAITING jobs -> CANCELLED (``cancel``), tickets
    deleted first, the closing marker left to close when its count reaches 0; returns the
    dependents of the cancelled jobs, one entry per edge, to count down."""
    in_workflow = Job.workflow_id == bindparam("workflow", type_=BigInteger)
    gone = (
        delete(MessageQueue)
        .where(MessageQueue.job_id.in_(select(Job.id).where(in_workflow)))
        .returning(MessageQueue.job_id)
        .cte("gone")
    )
    has_ticket_or_blocked = or_(
        Job.id.in_(select(gone.c.job_id)), Job.state == JobState.WAITING.value
    )
    cancelled = (
        update(Job)
        .where(
            in_workflow,
            has_ticket_or_blocked,
            source_states(CANCEL),
            Job.workflow_role != _CLOSING,
        )
        .values(
            state=CANCEL.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=literal("workflow cancelled"),
        )
        .returning(Job.id, Job.dependents, Job.awaited)
        .cte("cancelled_jobs")
    )
    dependents = func.array(select(func.unnest(cancelled.c.dependents)).scalar_subquery())
    return select(dependents).where(announced(cancelled))


@cache
def flag_running_jobs() -> Select[int]:
    """Flag workflow ``workflow``'s RUNNING jobs for cancellation (their handlers see it and stop,
    cooperatively); the rows locked in id order first, as ``sql.bulk.flag_running`` does."""
    return cancel_flags(Job.workflow_id == bindparam("workflow", type_=BigInteger))


@cache
def state_counts() -> Select[str, int]:
    """``(state, count)`` of the workflows in each state of ``states`` (array), each count
    stopping at ``cap``: the metrics' reading, whatever the table's size."""
    states = func.unnest(array_param("states", Text)).table_valued("state").render_derived()
    capped = (
        select(literal(1).label("hit"))
        .where(Workflow.state == states.c.state)
        .limit(bindparam("cap", type_=Integer))
        .correlate(states)
        .lateral("capped")
    )
    return (
        select(states.c.state, func.count(capped.c.hit))
        .select_from(states)
        .outerjoin(capped, literal(True))
        .group_by(states.c.state)
    )
