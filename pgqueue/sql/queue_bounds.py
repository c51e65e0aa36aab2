"""Statements of bounded queues (``pgqueue_queues.max_depth``): a queue's waiting depth, the
locks that serialise a bounded queue's enqueuers, the depths counted under them, and the bound
itself. The plan writer (``data.enqueue``) takes the locks, then counts the depths in a snapshot
taken after them: in one statement the count would be stale, since a statement that waits for a
lock still reads the database as of its start. ``explain`` reports the same depth.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import ColumnElement, Integer, Select, Text, bindparam, func, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import Job, QueueControl
from pgqueue.sql.common import array_param, listed_by_state
from pgqueue.states import JobState

# The states a bounded queue's depth counts: jobs not yet started (scheduled ones are QUEUED
# with a later run_at).
WAITING_STATES: Final = (JobState.QUEUED, JobState.RETRYING, JobState.WAITING)
# The first key of the two-key advisory locks that serialise a bounded queue's enqueuers ("pgqd");
# the second is the hash of the queue's name. Two-key locks never meet pgqueue's one-key
# maintenance locks, and two names with the same hash only share a lock.
QUEUE_LOCK_CLASS: Final = 0x70677164


def waiting_depth(queue: Any, cap: Any) -> ColumnElement[int]:
    """How many jobs of ``queue`` wait (``WAITING_STATES``), counted up to ``cap``: a bound is
    decided by its first ``max_depth`` jobs, however deep the queue. One equality range of the
    ``(queue, state, id)`` index per state: with both columns fixed the planner reads that index,
    while with ``state = ANY(...)`` and a queue it cannot see (a correlated one) it may pick a
    sequential scan over the whole history, and with an ``ORDER BY id`` the primary key."""
    per_state = []
    for state in WAITING_STATES:
        jobs = (
            select(Job.id)
            .where(Job.queue == queue, Job.state == state.value, listed_by_state())
            .limit(cap)
            .correlate(QueueControl)
            .subquery()
        )
        per_state.append(select(func.count()).select_from(jobs).scalar_subquery())
    return func.least(per_state[0] + per_state[1] + per_state[2], cap)


@cache
def lock_bounded_queues() -> Select[Any]:
    """``(name, max_depth, transaction isolation)`` of each bounded queue among ``queues``
    (array), by name, each queue's advisory lock taken in that order (held until the
    transaction ends; the lock is evaluated after the sort, so two batches never wait for each
    other's queues crosswise). An advisory lock, not the control row's: the claim and the
    outcomes write that row of a limited queue, and must not wait for a caller's transaction."""
    lock = func.pg_advisory_xact_lock(
        literal(QUEUE_LOCK_CLASS, Integer), func.hashtext(QueueControl.name)
    )
    return (
        select(
            QueueControl.name,
            QueueControl.max_depth,
            func.current_setting(literal("transaction_isolation")),
            lock,
        )
        .where(
            QueueControl.name == func.any(array_param("queues", Text)),
            QueueControl.max_depth.is_not(None),
        )
        .order_by(QueueControl.name)
    )


@cache
def queue_depths() -> Select[str, int | None, int]:
    """``(name, max_depth, depth)`` of each bounded queue among ``queues`` (array), by name;
    ``depth`` counts its waiting jobs up to one more than ``max_depth``."""
    return (
        select(
            QueueControl.name,
            QueueControl.max_depth,
            waiting_depth(QueueControl.name, QueueControl.max_depth + 1),
        )
        .where(
            QueueControl.name == func.any(array_param("queues", Text)),
            QueueControl.max_depth.is_not(None),
        )
        .order_by(QueueControl.name)
    )


@cache
def set_max_depth() -> Any:
    """Create or update a queue's control row with its bound. Binds ``name`` and ``max_depth``
    (null removes the bound)."""
    stmt = pg_insert(QueueControl).values(
        name=bindparam("name", type_=Text),
        max_depth=bindparam("max_depth", type_=Integer),
        updated_at=func.now(),
    )
    return stmt.on_conflict_do_update(
        index_elements=[QueueControl.name],
        set_={"max_depth": stmt.excluded.max_depth, "updated_at": stmt.excluded.updated_at},
    )
