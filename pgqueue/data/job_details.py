"""A job's signals as its page shows them (``sql.job_details``): the signals stored for it and,
while it is suspended, what it waits for; over ``db.Executor``, never committing."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pgqueue.data import signals as signals_data
from pgqueue.db import Executor
from pgqueue.sql import job_details as details_sql


def received(db: Executor, job_id: int) -> list[tuple[str, Any, dt.datetime]]:
    """``(name, payload, sent_at)`` of each signal stored for job ``job_id``, oldest first."""
    rows = db.rows(details_sql.received_signals(), {"job_id": job_id})
    return [(str(name), payload, sent_at) for name, payload, sent_at in rows]


def waiting(db: Executor, job_id: int) -> Any | None:
    """``(signal, wake_at, arrived)`` while job ``job_id`` is suspended, else None."""
    return signals_data.suspension(db, job_id)
