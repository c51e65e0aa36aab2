"""Statements that write what became of running jobs, batched over parallel arrays and guarded by
the lease token (a worker whose lease was lost updates 0 rows): complete, retry, fail, cancelled,
release; the heartbeat that extends leases; the lock that orders a batch; and the settling of
the dependents of jobs that ended.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    CompoundSelect,
    Float,
    Select,
    Text,
    Uuid,
    and_,
    cast,
    func,
    literal,
    null,
    select,
    true,
    update,
)
from sqlalchemy.orm import aliased
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.models import Job
from pgqueue.sql.common import (
    CLEAR_LEASE,
    announced,
    append_error,
    array_param,
    free_slots,
    ids_with_new_tickets,
    in_states,
    locked_in_id_order,
    seconds,
    source_states,
    tickets_for,
    woken,
)
from pgqueue.states import (
    ABANDON,
    CANCELLED,
    COMPLETE,
    FAIL,
    RELEASE,
    RETRY,
    UNBLOCK,
    JobState,
    Transition,
)


def _outcome_rows(*extra: tuple[str, str, Any]) -> Any:
    """``unnest`` of the binds ``ids``, ``tokens`` and each ``(column, bind, type)`` of
    ``extra``: one row per job, its columns named ``id``, ``token`` and each ``column``."""
    names = ["id", "token", *(column for column, _, _ in extra)]
    arrays = [
        array_param("ids", BigInteger),
        array_param("tokens", Uuid),
        *(array_param(bind, item_type) for _, bind, item_type in extra),
    ]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="v")


def _leased(transition: Transition, rows: Any) -> ColumnElement[bool]:
    """The row of ``rows`` is this job, in a source state of ``transition``, under its lease."""
    return and_(Job.id == rows.c.id, source_states(transition), Job.lease_token == rows.c.token)


@cache
def complete() -> Select[int, list[int] | None]:
    """RUNNING -> SUCCEEDED for many jobs. Binds ``ids``, ``tokens``, ``results`` (JSON text).

    Clears ``last_error`` (a succeeded job has none; the failed attempts stay in ``errors``).
    Returns the ids actually updated; a missing id means that worker's lease was lost.
    """
    rows = _outcome_rows(("result", "results", Text))
    completed = (
        update(Job)
        .where(_leased(COMPLETE, rows))
        .values(
            state=COMPLETE.target,
            result=cast(rows.c.result, JSON),
            last_error=null(),
            finished_at=func.now(),
            updated_at=func.now(),
            **CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.concurrency_key, Job.dependents)
        .cte("completed")
    )
    return (
        select(completed.c.id, completed.c.dependents)
        .add_cte(*free_slots(completed))
        .where(announced(completed))
    )


@cache
def retry() -> Select[int]:
    """RUNNING -> RETRYING for many jobs, each with a new ticket at ``now() + delay``.

    Binds ``ids``, ``tokens``, ``delays`` (seconds), ``errors`` (text). Returns updated ids.
    """
    rows = _outcome_rows(("delay", "delays", Float), ("error", "errors", Text))
    updated = (
        update(Job)
        .where(_leased(RETRY, rows))
        .values(
            state=RETRY.target,
            run_at=func.now() + seconds(rows.c.delay),
            updated_at=func.now(),
            last_error=rows.c.error,
            errors=append_error(Job.attempts, rows.c.error),
            **CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key)
        .cte("retried")
    )
    return ids_with_new_tickets(updated).add_cte(*free_slots(updated))


def _end_with_error(transition: Transition, name: str, *, record: bool) -> Any:
    """RUNNING -> ``transition.target`` for many jobs, ``errors`` as their last error (and,
    with ``record``, appended to their error history); returns the ids and dependents of the
    jobs moved. The CTE is named ``name``."""
    rows = _outcome_rows(("error", "errors", Text))
    # Explicit when not recorded, or SQLAlchemy would SET errors from the same-named bind.
    history = append_error(Job.attempts, rows.c.error) if record else Job.errors
    ended = (
        update(Job)
        .where(_leased(transition, rows))
        .values(
            state=transition.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=rows.c.error,
            errors=history,
            **CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.concurrency_key, Job.state, Job.dependents)
        .cte(name)
    )
    return (
        select(ended.c.id, ended.c.dependents).add_cte(*free_slots(ended)).where(announced(ended))
    )


@cache
def fail() -> Select[int, list[int] | None]:
    """RUNNING -> FAILED for many jobs. Binds ``ids``, ``tokens``, ``errors``."""
    failed: Select[int, list[int] | None] = _end_with_error(FAIL, "failed", record=True)
    return failed


@cache
def mark_cancelled() -> Select[int, list[int] | None]:
    """RUNNING -> CANCELLED for jobs whose handler stopped on a cancel request.

    Binds ``ids``, ``tokens``, ``errors`` (the reason)."""
    stopped: Select[int, list[int] | None] = _end_with_error(CANCELLED, "stopped", record=False)
    return stopped


@cache
def release() -> Select[int]:
    """RUNNING -> QUEUED at shutdown, ticket at now(); the interrupted attempt is not counted.

    Binds ``ids``, ``tokens``."""
    rows = _outcome_rows()
    updated = (
        update(Job)
        .where(_leased(RELEASE, rows))
        .values(
            state=RELEASE.target,
            attempts=Job.attempts - 1,
            run_at=func.now(),
            updated_at=func.now(),
            **CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key)
        .cte("released")
    )
    return ids_with_new_tickets(updated).add_cte(*free_slots(updated))


@cache
def heartbeat() -> ReturningUpdate[int, bool]:
    """Extend the leases of running jobs. Binds ``ids``, ``tokens``, ``lease_seconds`` (one
    lease length per job).

    Returns ``(id, cancel_requested)`` for each lease still held, so cancel requests reach the
    worker within one heartbeat.
    """
    rows = _outcome_rows(("lease_seconds", "lease_seconds", Float))
    return (
        update(Job)
        .where(
            Job.id == rows.c.id,
            Job.state == JobState.RUNNING,
            Job.lease_token == rows.c.token,
            Job.id.in_(locked_in_id_order(Job.state == JobState.RUNNING)),
        )
        .values(lease_expires_at=func.now() + seconds(rows.c.lease_seconds))
        .returning(Job.id, Job.cancel_requested)
    )


@cache
def lock_jobs() -> Select[int]:
    """Lock the rows of jobs ``ids`` (array) in id order, first thing in a transaction that
    then updates them in several statements (``record_outcomes``). Binds ``ids``."""
    return locked_in_id_order()


@cache
def settle_dependents() -> CompoundSelect[Any]:
    """Release or cancel the WAITING jobs ``ids`` (array) from their dependencies' states.

    A job all of whose ``depends_on`` SUCCEEDED gets its ticket (``unblock``); a job with a
    dependency FAILED or CANCELLED is cancelled (``abandon``) with the reason, and so is every
    WAITING job depending on it, transitively. Others stay WAITING. Idempotent: the state guard
    makes a second run (or a concurrent one) change nothing, so each job is queued at most once.
    Returns ``(id, new state)``.
    """
    dependency = aliased(Job, name="dependency")
    candidates = (
        select(Job.id, Job.depends_on)
        .where(Job.id == func.any(array_param("ids", BigInteger)), source_states(UNBLOCK))
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
    deeper = select(
        func.unnest(Job.dependents).label("id"), seeds.c.root, seeds.c.root_state
    ).where(Job.id == seeds.c.id, Job.dependents.is_not(None))
    doomed = seeds.union(deeper)
    reason = func.concat("dependency ", doomed.c.root, " ended ", doomed.c.root_state, "; not run")
    abandoned = (
        update(Job)
        .where(Job.id == doomed.c.id, source_states(ABANDON))
        .values(
            state=ABANDON.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=reason,
        )
        .returning(Job.id, Job.state)
        .cte("abandoned")
    )
    ready = select(candidates.c.id).where(~unfinished)
    unblocked = (
        update(Job)
        .where(Job.id.in_(ready), source_states(UNBLOCK))
        .values(
            state=UNBLOCK.target,
            run_at=func.greatest(Job.run_at, func.now()),
            updated_at=func.now(),
        )
        .returning(
            Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key
        )
        .cte("unblocked")
    )
    tickets = tickets_for(unblocked, "unblocked_tickets")
    return (
        select(abandoned.c.id, abandoned.c.state)
        .where(announced(abandoned))
        .union_all(select(unblocked.c.id, unblocked.c.state).where(woken(tickets)))
        .add_cte(tickets)
    )
