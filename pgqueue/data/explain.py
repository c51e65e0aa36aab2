"""The reads behind ``pgqueue.explain`` (``sql.explain``, and ``sql.flow``'s key and rate
facts): one function per read, each bounded by a key or an index and capped where it lists;
over ``db.Executor``, read-only.
"""

from __future__ import annotations

from typing import Any

from pgqueue.db import Executor
from pgqueue.sql import explain as explain_sql
from pgqueue.sql import flow as flow_sql
from pgqueue.states import JobState


def job_facts(db: Executor, job_id: int) -> Any | None:
    """The ``sql.explain.job_facts`` row of job ``job_id`` (its ticket, its queue's control
    row, the database's ``now``), or None when there is no such job."""
    rows = db.rows(explain_sql.job_facts(), {"job_id": job_id})
    return rows[0] if rows else None


def running_in_queue(db: Executor, queue: str, cap: int) -> list[int]:
    """Ids of the RUNNING jobs of ``queue``, lowest first, at most ``cap``."""
    rows = db.rows(explain_sql.running_in_queue(), {"queue": queue, "cap": cap})
    return [row[0] for row in rows]


def dependency_states(db: Executor, job_ids: list[int]) -> dict[int, JobState]:
    """The state of each of ``job_ids`` that exists (the caller caps how many it asks for)."""
    rows = db.rows(explain_sql.dependency_states(), {"ids": job_ids})
    return {job_id: JobState(state) for job_id, state in rows}


def tickets_ahead(db: Executor, job: Any, cap: int) -> int:
    """How many tickets of its queue a claim would take before the ticket of ``job`` (a
    ``job_facts`` row that has a ticket), counted up to ``cap``."""
    params = {
        "atomic": job.ticket_atomic,
        "priority": job.ticket_priority,
        "run_at": job.ticket_run_at,
        "job_id": job.id,
        "queue": job.queue,
        "cap": cap,
    }
    return int(db.rows(explain_sql.tickets_ahead(), params)[0][0])


def serving_workers(
    db: Executor, queue: str, stale_seconds: float, cap: int
) -> list[tuple[str, str | None, float | None]]:
    """``(worker id, claim error, seconds failing)`` of the live workers claiming from
    ``queue``, at most ``cap``."""
    params = {"stale_seconds": stale_seconds, "cap": cap, "queue": queue}
    rows = db.rows(explain_sql.live_workers(serving_queue=True), params)
    return [
        (worker_id, error, None if failing_for is None else float(failing_for))
        for worker_id, error, failing_for in rows
    ]


def live_worker_count(db: Executor, stale_seconds: float, cap: int) -> int:
    """How many workers are live, counted up to ``cap``."""
    params = {"stale_seconds": stale_seconds, "cap": cap}
    return len(db.rows(explain_sql.live_workers(serving_queue=False), params))


def task_registered(db: Executor, queue: str, task: str, stale_seconds: float) -> bool:
    """Whether a live worker claiming from ``queue`` registers task ``task``."""
    params = {"stale_seconds": stale_seconds, "queue": queue, "task": task}
    return bool(db.rows(explain_sql.task_registered(), params)[0][0])


def queue_depth(db: Executor, queue: str, cap: int) -> int:
    """How many jobs of ``queue`` wait, counted up to ``cap``."""
    rows = db.rows(explain_sql.queue_depth(), {"queue": queue, "cap": cap})
    return int(rows[0][0])


def key_facts(db: Executor, key: str) -> Any | None:
    """Concurrency key ``key``'s ``sql.flow.key_facts`` row (running, limit, rate limit, rate
    period, starts in the window, seconds until the window has room), or None without a row."""
    rows = db.rows(flow_sql.key_facts(), {"key": key})
    return rows[0] if rows else None


def running_with_key(db: Executor, key: str, cap: int) -> list[int]:
    """Ids of the RUNNING jobs with concurrency key ``key``, at most ``cap``."""
    rows = db.rows(flow_sql.running_with_key(), {"key": key, "cap": cap})
    return [row[0] for row in rows]


def queue_rate_facts(db: Executor, queue: str) -> Any | None:
    """``queue``'s ``sql.flow.queue_rate_facts`` row (rate limit, rate period, starts in the
    window, seconds until the window has room), or None without a row."""
    rows = db.rows(flow_sql.queue_rate_facts(), {"queue": queue})
    return rows[0] if rows else None
