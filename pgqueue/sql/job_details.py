"""Statements of a job's page beyond its row: the signals stored for one job, oldest first."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import BigInteger, Select, bindparam, select

from pgqueue.models import JobSignal


@cache
def received_signals() -> Select[tuple[str, str, Any]]:
    """The signals stored for job ``job_id``: name, payload and when it was
    stored, oldest first."""
    return (
        select(JobSignal.name, JobSignal.payload, JobSignal.sent_at)
        .where(JobSignal.job_id == bindparam("job_id", type_=BigInteger))
        .order_by(JobSignal.sent_at, JobSignal.name)
    )
