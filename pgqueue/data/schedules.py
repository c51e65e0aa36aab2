"""The schedules' switches and listing (``sql.schedules``): pause and resume a schedule under
its lock, read the switches, and read the ticked schedules with their latest tick; over
``db.Executor``, never committing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pgqueue.db import Executor
from pgqueue.sql import control as control_sql
from pgqueue.sql import schedules as schedules_sql


@dataclass(frozen=True, slots=True)
class Switch:
    """An operator's switch of a schedule: ``paused``, and when it last changed."""

    paused: bool
    changed_at: dt.datetime


@dataclass(frozen=True, slots=True)
class LastTick:
    """A schedule's latest recorded tick and the job enqueued for it (None: dropped)."""

    at: dt.datetime
    job_id: int | None


def set_paused(db: Executor, name: str, paused: bool) -> bool:
    """Pause or resume schedule ``name``; False when it was so already (nothing written). Call
    inside a transaction: the schedule's lock is held until it ends."""
    db.rows(control_sql.lock_schedule(), {"tick_name": name})
    statement = schedules_sql.pause() if paused else schedules_sql.resume()
    return bool(db.rows(statement, {"schedule": name}))


def switches(db: Executor) -> dict[str, Switch]:
    """Every switched schedule's switch, by name."""
    return {
        name: Switch(bool(paused), at) for name, paused, at in db.rows(schedules_sql.switches())
    }


def last_ticks(db: Executor) -> dict[str, LastTick]:
    """The latest recorded tick of every schedule that has one, by name."""
    rows = db.rows(schedules_sql.ticked_schedules())
    return {name: LastTick(at, job_id) for name, at, job_id in rows}
