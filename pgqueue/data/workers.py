"""The worker registry (``sql.workers``): each worker's row, refreshed while it lives, read by
the admin surface and the elected worker's choice; over ``db.Executor``, never committing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from pgqueue.db import Executor
from pgqueue.jobs import WorkerEntry
from pgqueue.sql import workers as workers_sql


def worker_params(worker: WorkerEntry) -> dict[str, Any]:
    return {
        "worker_id": worker.id,
        "worker_host": worker.host,
        "worker_pid": worker.pid,
        "worker_queues": list(worker.queues),
        "worker_concurrency": worker.concurrency,
        "worker_version": worker.version,
        "worker_started_at": worker.started_at,
        "worker_claim_error": worker.claim_error,
        "worker_tasks": list(worker.tasks),
        "worker_pool": worker.pool,
    }


def worker_seen(db: Executor, worker: WorkerEntry) -> dt.datetime:
    """Write or refresh ``worker``'s registry row; its ``started_at``."""
    started_at = db.rows(workers_sql.register(), worker_params(worker))[0][0]
    assert isinstance(started_at, dt.datetime)
    return started_at


def unregister_worker(db: Executor, worker_id: str) -> None:
    """Delete ``worker_id``'s registry row."""
    db.rows(workers_sql.unregister(), {"worker_id": worker_id})


def unregistered_ready(db: Executor, stale_seconds: float, cap: int) -> dict[str, int]:
    """Per queue, the ready jobs whose task no live worker serving the queue registers
    (``sql.workers.unregistered_ready``: at most ``cap`` tickets read)."""
    params = {"stale_seconds": stale_seconds, "cap": cap}
    return {queue: int(n) for queue, n in db.rows(workers_sql.unregistered_ready(), params)}


def delete_stale_workers(db: Executor, stale_seconds: float) -> list[str]:
    """Delete the registry rows of workers not seen within ``stale_seconds``; their ids."""
    rows = db.rows(workers_sql.delete_stale(), {"stale_seconds": stale_seconds})
    return [row[0] for row in rows]


def list_workers(
    db: Executor, stale_seconds: float, *, include_stale: bool = False
) -> Sequence[Any]:
    """Registry rows (``sql.workers.list_workers``), live ones first."""
    params = {"stale_seconds": stale_seconds, "include_stale": include_stale}
    return db.rows(workers_sql.list_workers(), params)


def job_holder(db: Executor, job_id: int, stale_seconds: float) -> Any | None:
    """The worker holding RUNNING job ``job_id`` (``sql.workers.job_holder``), or None."""
    params = {"job_id": job_id, "stale_seconds": stale_seconds}
    rows = db.rows(workers_sql.job_holder(), params)
    return rows[0] if rows else None


def elected_worker(db: Executor, worker_id: str, stale_seconds: float) -> bool:
    """Whether no live worker has an id below ``worker_id`` (the cluster's elected worker)."""
    params = {"worker_id": worker_id, "stale_seconds": stale_seconds}
    return bool(db.rows(workers_sql.no_live_worker_before(), params)[0][0])
