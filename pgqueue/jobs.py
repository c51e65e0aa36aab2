"""The values that cross between layers: a job to insert, a claimed attempt, an attempt's outcome.

Plain data classes with no behaviour and no database access, so the task API, the repository
and the worker can all name them without importing each other.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to build, once per job
class NewJob:
    """One validated job ready to insert (arguments already encoded as JSON text)."""

    task_name: str
    queue: str
    args_json: str
    kwargs_json: str
    priority: int
    max_attempts: int
    delay: float | None
    run_at: dt.datetime | None
    unique_key: str | None
    atomic: bool
    depends_on: tuple[int, ...] = ()


@dataclass(slots=True)  # not frozen: cheaper to build (thousands per second); see _claimed_jobs
class ClaimedJob:
    """What a worker needs to run one claimed attempt."""

    id: int
    task_name: str
    queue: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    priority: int
    lease_token: uuid.UUID
    atomic: bool
    cancel_requested: bool
    problem: str | None = None  # why the row cannot run (its arguments did not decode)


@dataclass(slots=True)  # not frozen (cheaper to build, one per job); never mutated
class Outcome:
    """The result of one attempt, to be written by a batched transition."""

    job_id: int
    lease_token: uuid.UUID
    kind: str  # "complete" | "retry" | "fail" | "cancelled" | "release"
    result_json: str = "null"
    error: str = ""
    delay: float = 0.0
