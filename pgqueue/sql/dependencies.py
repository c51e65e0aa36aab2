"""Statements that settle the jobs waiting on others (``depends_on``, and workflow jobs): the
lock that orders concurrent settlings, the countdown of workflow jobs' unfinished
dependencies, the release or cancellation of the waiting jobs whose dependencies ended, and
the cancellation of jobs whose dependency was deleted.

A job outside workflows is settled by reading all its dependencies' states each time one ends.
A workflow job carries the count of its dependencies that have not ended
(``Job.pending_dependencies``): each transaction that ends some of them takes it down by as
many (``count_down``), and the job is settled once, when it reaches 0, so a chord callback over
n members costs O(n) statements' work in all, not O(n) per member.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.orm import aliased

from pgqueue.models import Job
from pgqueue.sql.common import (
    OUTCOME_AT,
    announced,
    array_param,
    in_states,
    source_states,
    tickets_for,
    woken,
)
from pgqueue.states import ABANDON, UNBLOCK, JobState, WorkflowRole

# The roles from this one on (closing markers, ``on_failure`` jobs) are settled by their own
# statements (``sql.workflows``), never here.
_SETTLED_ELSEWHERE = WorkflowRole.CLOSING.value


@cache
def lock_waiting_dependents() -> Select[int]:
    """Lock the WAITING jobs ``ids`` (array) in id order, the statement before
    ``settle_dependents`` in the transaction that ended some of their dependencies.

    Two dependencies of one job may end in two transactions open at once; each settling,
    reading in its own snapshot, would see the other dependency still RUNNING and leave the job
    WAITING for good. With the dependent locked first, the second settling waits for the first
    transaction to end and its next statement sees that dependency's outcome. The lock also
    serialises the countdowns of one workflow job (``count_down``)."""
    return (
        select(Job.id)
        .where(
            Job.id == func.any(array_param("ids", BigInteger)),
            Job.state == JobState.WAITING.value,
        )
        .order_by(Job.id)
        .with_for_update(key_share=True)
    )


@cache
def count_down() -> Select[Any]:
    """Take ``counts`` (array) off the ``pending_dependencies`` of the WAITING workflow jobs
    ``ids`` (parallel array): each count is how many of the job's dependencies this transaction
    ended. Returns ``(id, pending_dependencies, workflow_role)`` of the jobs that reached 0."""
    ended = (
        func.unnest(array_param("ids", BigInteger), array_param("counts", Integer))
        .table_valued("id", "n")
        .render_derived(name="ended")
    )
    counted = (
        update(Job)
        .where(
            Job.id == ended.c.id,
            Job.state == JobState.WAITING.value,
            Job.pending_dependencies.is_not(None),
        )
        .values(pending_dependencies=Job.pending_dependencies - ended.c.n)
        .returning(Job.id, Job.pending_dependencies, Job.workflow_role)
        .cte("counted")
    )
    return select(counted.c.id, counted.c.pending_dependencies, counted.c.workflow_role).where(
        counted.c.pending_dependencies <= 0
    )


def _with_first_argument(value: ColumnElement[Any]) -> ColumnElement[Any]:
    """The job's ``args`` with ``value`` (jsonb) put first."""
    prepended: ColumnElement[Any] = cast(
        func.jsonb_build_array(value).op("||")(cast(Job.args, JSONB)), JSON
    )
    return prepended


def released_arguments() -> ColumnElement[Any]:
    """A released job's arguments: a workflow job that takes its parents' results gets them
    first, read here from the parents' rows (one statement for all of them however many),
    as one value (``TAKES_RESULT``) or a list in ``depends_on`` order (``TAKES_RESULTS``)."""
    parent = aliased(Job, name="parent")
    first = select(cast(parent.result, JSONB)).where(
        parent.id == Job.depends_on[literal_column("1", Integer)]
    )
    order = (
        func.unnest(Job.depends_on)
        .table_valued("id", with_ordinality="ord")
        .render_derived(name="parent_ids")
    )
    listed = (
        select(
            func.coalesce(
                func.jsonb_agg(aggregate_order_by(cast(parent.result, JSONB), order.c.ord)),
                literal_column("'[]'::jsonb"),
            )
        )
        .select_from(order)
        .join(parent, parent.id == order.c.id)
    )
    arguments: ColumnElement[Any] = case(
        (
            Job.workflow_role == WorkflowRole.TAKES_RESULT.value,
            _with_first_argument(first.scalar_subquery()),
        ),
        (
            Job.workflow_role == WorkflowRole.TAKES_RESULTS.value,
            _with_first_argument(listed.scalar_subquery()),
        ),
        else_=Job.args,
    )
    return arguments


@cache
def settle_dependents() -> CompoundSelect[Any]:
    """Release or cancel the WAITING jobs ``ids`` (array) from their dependencies' states.

    A job all of whose ``depends_on`` SUCCEEDED gets its ticket (``unblock``, its parents'
    results put first in its arguments if it takes them: ``released_arguments``); a job with a
    dependency FAILED or CANCELLED is cancelled (``abandon``) with the reason, and so is every
    WAITING job outside workflows depending on it, transitively. A workflow job is settled only
    once its countdown reached 0 (``count_down``); the cancelled ones' dependents are returned
    for the caller to count down and settle in turn. Others stay WAITING. Idempotent: the state
    guard makes a second run (or a concurrent one) change nothing, so each job is queued at most
    once. Returns ``(id, new state, dependents)`` (dependents of the cancelled jobs only).
    """
    dependency = aliased(Job, name="dependency")
    counted_down = or_(Job.pending_dependencies.is_(None), Job.pending_dependencies <= 0)
    candidates = (
        select(Job.id, Job.depends_on)
        .where(
            Job.id == func.any(array_param("ids", BigInteger)),
            source_states(UNBLOCK),
            counted_down,
            or_(Job.workflow_role.is_(None), Job.workflow_role < _SETTLED_ELSEWHERE),
        )
        .cte("candidates")
    )
    dead = (
        select(dependency.id, dependency.state)
        .where(
            dependency.id == func.any(candidates.c.depends_on),
            in_states(dependency.state, (JobState.FAILED, JobState.CANCELLED)),
        )
        .order_by(dependency.id)
        .limit(1)
        .lateral("dead")
    )
    unfinished = (
        select(literal(1))
        .where(
            dependency.id == func.any(candidates.c.depends_on),
            dependency.state != JobState.SUCCEEDED.value,
        )
        .exists()
    )
    seeds = (
        select(
            candidates.c.id.label("id"),
            dead.c.id.label("root"),
            dead.c.state.label("root_state"),
        )
        .select_from(candidates.join(dead, true()))
        .cte("doomed", recursive=True)
    )
    # Workflow jobs are not cancelled by the cascade: their countdown settles them (the
    # cancelled jobs' dependents come back to the caller), so the cascade stops at them.
    deeper = select(
        func.unnest(Job.dependents).label("id"), seeds.c.root, seeds.c.root_state
    ).where(Job.id == seeds.c.id, Job.dependents.is_not(None), Job.workflow_id.is_(None))
    doomed = seeds.union(deeper)
    reason = func.concat("dependency ", doomed.c.root, " ended ", doomed.c.root_state, "; not run")
    abandoned = (
        update(Job)
        .where(Job.id == doomed.c.id, source_states(ABANDON), counted_down)
        .values(
            state=ABANDON.target,
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            last_error=reason,
        )
        .returning(Job.id, Job.state, Job.dependents, Job.awaited)
        .cte("abandoned")
    )
    ready = select(candidates.c.id).where(~unfinished)
    unblocked = (
        update(Job)
        .where(Job.id.in_(ready), source_states(UNBLOCK))
        .values(
            state=UNBLOCK.target,
            run_at=func.greatest(Job.run_at, OUTCOME_AT),
            updated_at=OUTCOME_AT,
            args=released_arguments(),
        )
        .returning(
            Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key
        )
        .cte("unblocked")
    )
    tickets = tickets_for(unblocked, "unblocked_tickets")
    return (
        select(abandoned.c.id, abandoned.c.state, abandoned.c.dependents)
        .where(announced(abandoned))
        .union_all(
            select(
                unblocked.c.id, unblocked.c.state, cast(null(), abandoned.c.dependents.type)
            ).where(woken(tickets))
        )
        .add_cte(tickets)
    )


@cache
def abandon_orphans() -> Select[int, list[int] | None]:
    """WAITING jobs ``ids`` (array) that depend on a job of ``deleted`` (array) -> CANCELLED,
    the reason naming the deleted dependency (the smallest id, when several were deleted).

    A deleted dependency can never succeed, and ``settle_dependents`` cannot tell a deleted
    dependency from a finished one (it finds no row), so deleting a job cancels its dependents
    here, right after the delete. Returns ``(id, dependents)`` of the cancelled jobs, whose own
    dependents ``settle_dependents`` then cancels in turn.
    """
    deleted = func.unnest(array_param("deleted", BigInteger)).column_valued("deleted_id")
    gone = select(func.min(deleted)).where(deleted == func.any(Job.depends_on)).scalar_subquery()
    abandoned = (
        update(Job)
        .where(
            Job.id == func.any(array_param("ids", BigInteger)),
            source_states(ABANDON),
            gone.is_not(None),
        )
        .values(
            state=ABANDON.target,
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            last_error=func.concat("dependency ", gone, " was deleted; not run"),
        )
        .returning(Job.id, Job.dependents, Job.awaited)
        .cte("orphans_abandoned")
    )
    return select(abandoned.c.id, abandoned.c.dependents).where(announced(abandoned))
