"""Queue control and schedules (``sql.control``): a queue's pause and concurrency limit, the
schedules' recorded ticks, and the database clock; over ``db.Executor``, never committing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from pgqueue.db import Executor
from pgqueue.sql import control


def set_queue_control(
    db: Executor,
    name: str,
    *,
    paused: bool | None = None,
    concurrency_limit: int | bool | None = False,
) -> None:
    """Upsert a queue's switches; ``concurrency_limit=False`` leaves the limit as it is. Setting
    a limit (re)starts the queue's counter from its RUNNING jobs: call inside a transaction
    (READ COMMITTED), as the recount must be a later statement than the row's lock."""
    params: dict[str, Any] = {"name": name}
    if paused is not None:
        params["paused"] = paused
    set_limit = concurrency_limit is not False
    if set_limit:
        params["concurrency_limit"] = concurrency_limit
    statement = control.set_queue_control(paused=paused is not None, limit=set_limit)
    ex = db
    ex.rows(statement, params)
    if set_limit:
        ex.rows(control.recount_queue(), {"names": [name]})


def queue_controls(session: Session) -> list[Any]:
    """All queue control rows (``QueueControl`` objects of ``session``)."""
    return list(session.scalars(control.queue_controls()))


def record_tick(db: Executor, schedule_name: str, scheduled_at: dt.datetime) -> bool:
    """True when this caller recorded the tick first (and so must enqueue its job); false too
    when a newer tick of the schedule is recorded already. Call inside a transaction: the
    schedule's lock is held until it ends."""
    params = {"tick_name": schedule_name, "tick_at": scheduled_at}
    ex = db
    ex.rows(control.lock_schedule(), {"tick_name": schedule_name})
    return bool(ex.rows(control.record_tick(), params))


def set_tick_job(db: Executor, schedule_name: str, scheduled_at: dt.datetime, job_id: int) -> None:
    """Record the job enqueued for a tick."""
    params = {"tick_name": schedule_name, "tick_at": scheduled_at, "tick_job": job_id}
    db.rows(control.set_tick_job(), params)


def last_ticks(db: Executor, names: Sequence[str]) -> dict[str, dt.datetime]:
    """Latest recorded tick per schedule name (schedules never ticked are absent)."""
    rows = db.rows(control.last_ticks(), {"names": list(names)})
    return {name: at for name, at in rows}


def database_now(db: Executor) -> dt.datetime:
    """The database clock."""
    value = db.rows(control.database_now())[0][0]
    assert isinstance(value, dt.datetime)
    return value
