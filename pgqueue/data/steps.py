"""Durable steps (``sql.steps``): read a job's saved steps, and save one completed step under the
job's lease; over ``db.Executor`` or a caller's ``Session``, never committing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgqueue.db import Executor
from pgqueue.errors import LeaseLost
from pgqueue.sql import steps as steps_sql


def load_saved(db: Executor, job_id: int) -> dict[str, str]:
    """``{name: result as JSON text}`` of the saved steps of job ``job_id``."""
    rows = db.rows(steps_sql.saved_steps(), {"job_id": job_id})
    return {name: result for name, result in rows}


def save(db: Executor, job_id: int, token: str, name: str, result: str) -> None:
    """Save step ``name`` of job ``job_id`` with ``result`` (JSON text) under lease ``token``.
    Raises LeaseLost when that lease is no longer the job's."""
    params: Mapping[str, Any] = {"job_id": job_id, "token": token, "name": name, "result": result}
    if not db.rows(steps_sql.save_step(), params):
        raise LeaseLost(
            f"step {name!r} of job {job_id} was not saved: this worker no longer holds the "
            "job's lease (it expired and the job was rescued, or the job was deleted)"
        )
