"""Signals and suspensions (``sql.signals``): send a signal to a job, read the one a handler
waits for, wake jobs whose signal arrived while they were being suspended, and read what a
suspended job waits for; over ``db.Executor`` or a caller's ``Session``, never committing.
"""

from __future__ import annotations

from typing import Any

from pgqueue.data.history import moved_state
from pgqueue.db import Executor
from pgqueue.errors import InvalidStateTransition, JobNotFound
from pgqueue.sql import signals as signals_sql
from pgqueue.states import FINAL_STATES, JobState


def lock_state(db: Executor, job_id: int) -> JobState | None:
    """The state of job ``job_id``, its row locked until the transaction ends; None when there
    is no such job."""
    rows = db.rows(signals_sql.lock_for_signal(), {"job_id": job_id})
    return JobState(rows[0][0]) if rows else None


def send(db: Executor, job_id: int, name: str, payload: str) -> bool:
    """Store signal ``name`` (``payload``: JSON text) of job ``job_id`` and wake the job if it
    waits for it; False when a signal of that name was stored already (nothing changes)."""
    params = {"target": job_id, "name": name, "payload": payload}
    return bool(db.rows(signals_sql.send_signal(), params))


def waited(db: Executor, job_id: int, name: str | None) -> tuple[float, str | None, float | None]:
    """The database clock (epoch seconds), and the JSON text of signal ``name`` of job
    ``job_id`` with when it was stored (epoch seconds); ``(now, None, None)`` when it was not
    sent (or ``name`` is None: the clock alone)."""
    params = {"job_id": job_id, "name": name}
    now, payload, sent_at = db.rows(signals_sql.waited_signal(), params)[0]
    return float(now), payload, None if sent_at is None else float(sent_at)


def wake_signalled(db: Executor, job_ids: list[int]) -> None:
    """Wake those of the just suspended jobs ``job_ids`` whose awaited signal is stored."""
    db.rows(signals_sql.wake_signalled(), {"ids": job_ids})


def suspension(db: Executor, job_id: int) -> Any | None:
    """``(signal, wake_at, arrived)`` of job ``job_id`` while it is suspended, else None."""
    rows = db.rows(signals_sql.suspension(), {"job_id": job_id})
    return rows[0] if rows else None


def signal_job(db: Executor, job_id: int, name: str, payload: str) -> bool:
    """``pgq.signal``: store signal ``name`` of job ``job_id`` (``payload``: JSON text) and
    wake the job if it waits for it. True when stored, False when a signal of that name was
    stored already (the first is kept). JobNotFound when there is no such job in ``db.tables``,
    InvalidStateTransition when it has finished (moved to the history or not); nothing is
    written then."""
    state = lock_state(db, job_id)
    if state is None:
        moved = moved_state(db, job_id)
        if moved is not None:
            raise InvalidStateTransition(
                f"cannot signal job {job_id}: it finished ({moved.value}) and was moved to the "
                f"history (history=partitioned), so nothing will wait for the signal {name!r}"
            )
        raise JobNotFound(f"cannot signal job {job_id}: no job with id {job_id}")
    if state in FINAL_STATES:
        raise InvalidStateTransition(
            f"cannot signal job {job_id}: it {state.phrase}, so nothing will wait for the "
            f"signal {name!r}"
        )
    return send(db, job_id, name, payload)
