"""Statements that switch queues (pause, concurrency limit) and record the ticks of periodic
schedules, plus the database clock the scheduler reads.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    Text,
    bindparam,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import Job, PeriodicTick, QueueControl, ScheduleState
from pgqueue.sql.common import (
    array_param,
    recounted,
)

# The first key of the two-key advisory locks that serialise the recording of one schedule's
# ticks ("pgst"); the second is the hash of the schedule's name.
SCHEDULE_LOCK_CLASS: Final = 0x70677374


@cache
def set_queue_control(*, paused: bool, limit: bool) -> Any:
    """Create or update a queue's control row, locking it. Binds ``name`` and ``paused`` and/or
    ``concurrency_limit`` (null removes the limit). A new limit's ``running`` counter is set
    by ``recount_queue``, a later statement of the same transaction."""
    name = bindparam("name", type_=Text)
    values: dict[str, Any] = {"name": name, "updated_at": func.now()}
    if paused:
        values["paused"] = bindparam("paused", type_=Boolean)
    if limit:
        values["concurrency_limit"] = bindparam("concurrency_limit", type_=Integer)
    stmt = pg_insert(QueueControl).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=[QueueControl.name],
        set_={k: stmt.excluded[k] for k in values if k != "name"},
    )


@cache
def recount_queue() -> Any:  # a ReturningUpdate
    """Start the ``running`` counter of the queues ``names`` (array) from their RUNNING jobs,
    so jobs already running count against a limit just set.

    Run after ``set_queue_control`` locked the row, as a later statement of its transaction,
    never in the same statement: a statement counts from the snapshot it began with, and a
    claim that was counting a job against the queue then held the row and committed while the
    upsert waited for it. Counted before that wait, such a job is forgotten and the queue runs
    one over its limit; counted after it, the claim is seen, and a job leaving RUNNING now
    still counts, since its statement waits for the row to lower the counter after this one."""
    return recounted(QueueControl.name, QueueControl.running, Job.queue, "names")


@cache
def queue_controls() -> Select[QueueControl]:
    """All queue control rows, by name."""
    return select(QueueControl).order_by(QueueControl.name)


@cache
def lock_schedule() -> Select[Any]:
    """Take the transaction's advisory lock of schedule ``tick_name``, so its ticks are
    recorded one transaction at a time."""
    return select(
        func.pg_advisory_xact_lock(
            literal(SCHEDULE_LOCK_CLASS, Integer),
            func.hashtext(bindparam("tick_name", type_=Text)),
        )
    )


@cache
def record_tick() -> Any:
    """Claim one tick of a schedule; binds ``tick_name``, ``tick_at``. Returns a row only for
    the one caller that inserted it, which then enqueues the job in the same transaction.
    Inserts nothing when the schedule already has a tick at or after ``tick_at``: a scheduler
    that worked from an older view never adds a tick behind a newer one; nor while the schedule
    is paused (``ScheduleState``), which this statement, run after ``lock_schedule``, sees as
    soon as the pause has committed."""
    name = bindparam("tick_name", type_=Text)
    at = bindparam("tick_at", type_=PeriodicTick.scheduled_at.type)
    newer = (
        select(PeriodicTick.scheduled_at)
        .where(PeriodicTick.schedule_name == name, PeriodicTick.scheduled_at >= at)
        .exists()
    )
    paused = (
        select(ScheduleState.name).where(ScheduleState.name == name, ScheduleState.paused).exists()
    )
    return (
        pg_insert(PeriodicTick)
        .from_select(
            [PeriodicTick.schedule_name, PeriodicTick.scheduled_at],
            select(name, at).where(~newer, ~paused),
        )
        .on_conflict_do_nothing(
            index_elements=[PeriodicTick.schedule_name, PeriodicTick.scheduled_at]
        )
        .returning(PeriodicTick.scheduled_at)
    )


@cache
def set_tick_job() -> Any:
    """Record the job enqueued for a tick. Binds ``tick_name``, ``tick_at``, ``tick_job``."""
    return (
        update(PeriodicTick)
        .where(
            PeriodicTick.schedule_name == bindparam("tick_name", type_=Text),
            PeriodicTick.scheduled_at == bindparam("tick_at", type_=PeriodicTick.scheduled_at.type),
        )
        .values(job_id=bindparam("tick_job", type_=BigInteger))
    )


@cache
def last_ticks() -> Select[str, Any]:
    """``(schedule_name, latest scheduled_at)`` for the schedules ``names`` (array)."""
    return (
        select(PeriodicTick.schedule_name, func.max(PeriodicTick.scheduled_at))
        .where(PeriodicTick.schedule_name == func.any(array_param("names", Text)))
        .group_by(PeriodicTick.schedule_name)
    )


@cache
def database_now() -> Select[Any]:
    """The database clock."""
    return select(func.now())
