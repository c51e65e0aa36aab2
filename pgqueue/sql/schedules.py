"""Statements of the schedules' switches and listing: pause and resume a schedule by name
(``pgqueue_schedules``), read the switches, and the schedules the recorded ticks know with the
latest tick of each. Each switch is written under the schedule's advisory lock
(``sql.control.lock_schedule``), the lock a tick is recorded under, so a pass recording a tick
ends before a pause is written, and every tick recorded after it sees the pause.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Select, Text, bindparam, func, select, true, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import PeriodicTick, ScheduleState


@cache
def pause() -> Any:  # a ReturningInsert
    """Pause schedule ``schedule`` (a row made when it has none); returns its name unless it was
    paused already (its ``changed_at`` then stays)."""
    stmt = pg_insert(ScheduleState).values(
        name=bindparam("schedule", type_=Text), paused=True, changed_at=func.now()
    )
    return stmt.on_conflict_do_update(
        index_elements=[ScheduleState.name],
        set_={"paused": True, "changed_at": func.now()},
        where=ScheduleState.paused.is_(False),
    ).returning(ScheduleState.name)


@cache
def resume() -> Any:  # a ReturningUpdate
    """Resume schedule ``schedule`` when it is paused, from ``now()`` on; returns its name then.
    A schedule that is not paused keeps its ``changed_at``, so its late ticks still follow its
    ``missed`` policy."""
    return (
        update(ScheduleState)
        .where(ScheduleState.name == bindparam("schedule", type_=Text), ScheduleState.paused)
        .values(paused=False, changed_at=func.now())
        .returning(ScheduleState.name)
    )


@cache
def switches() -> Select[str, bool, Any]:
    """``(name, paused, changed_at)`` of every schedule an operator switched."""
    return select(ScheduleState.name, ScheduleState.paused, ScheduleState.changed_at)


@cache
def ticked_schedules() -> Select[str, Any, Any]:
    """``(name, latest scheduled_at, its job_id)`` of every schedule with a recorded tick: the
    names by a loose scan of the ticks' primary key (one probe per name, however many ticks
    each has), the latest tick of each by one more."""
    first = select(func.min(PeriodicTick.schedule_name).label("name")).cte(
        "tick_names", recursive=True
    )
    following = (
        select(
            select(func.min(PeriodicTick.schedule_name))
            .where(PeriodicTick.schedule_name > first.c.name)
            .scalar_subquery()
            .label("name")
        )
        .select_from(first)
        .where(first.c.name.is_not(None))
    )
    names = first.union_all(following)
    latest = (
        select(PeriodicTick.scheduled_at, PeriodicTick.job_id)
        .where(PeriodicTick.schedule_name == names.c.name)
        .order_by(PeriodicTick.scheduled_at.desc())
        .limit(1)
        .lateral("latest")
    )
    return (
        select(names.c.name, latest.c.scheduled_at, latest.c.job_id)
        .select_from(names.join(latest, true()))
        .where(names.c.name.is_not(None))
    )
