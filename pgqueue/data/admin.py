"""The admin surface's reads and manual actions (``sql.admin``): one job, counts, lists, time
series, re-run, cancel and delete; over ``db.Executor`` (a ``Session`` where ORM objects are
returned), never committing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from pgqueue.data import dependencies
from pgqueue.db import SessionOrExecutor, executor_for
from pgqueue.models import JOB_COLUMN_NAMES, Job, JobHistory
from pgqueue.sql import admin
from pgqueue.states import JobState


def get_job(session: Session, job_id: int) -> Job | None:
    """The job ``job_id`` (an ORM object of ``session``), or None."""
    return session.execute(admin.get_job(), {"job_id": job_id}).scalar_one_or_none()


def get_moved_job(session: Session, job_id: int) -> Job | None:
    """Job ``job_id`` from the partitioned history, as a ``Job`` of no session
    (``moved_job``), or None."""
    row = session.execute(admin.get_moved_job(), {"job_id": job_id}).scalar_one_or_none()
    return None if row is None else moved_job(row)


def moved_job(row: JobHistory) -> Job:
    """A moved job as a ``Job`` (transient, in no session), so readers get one type whichever
    table held it. Its ``steps`` are empty: steps are not moved."""
    return Job(**{name: getattr(row, name) for name in JOB_COLUMN_NAMES})


def mark_awaited(db: SessionOrExecutor, job_id: int) -> bool:
    """Mark job ``job_id`` as waited for (its end is then announced); False when it is
    finished, missing or already marked."""
    return bool(executor_for(db).rows(admin.mark_awaited(), {"job_id": job_id}))


def state_counts(db: SessionOrExecutor) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` over all jobs."""
    counts: dict[str, dict[JobState, int]] = {}
    for queue, state, count in executor_for(db).rows(admin.job_state_counts()):
        counts.setdefault(queue, {})[JobState(state)] = count
    return counts


def rerun(db: SessionOrExecutor, job_id: int) -> bool:
    """Queue a FAILED or CANCELLED job again; False when it is in no such state."""
    return bool(executor_for(db).rows(admin.rerun(), {"job_id": job_id}))


def cancel_waiting(db: SessionOrExecutor, job_id: int, reason: str) -> bool:
    """Cancel a job that waits (queued, retrying, or waiting on dependencies) and settle its
    dependents; False when it does not wait."""
    ex = executor_for(db)
    rows = ex.rows(admin.cancel_waiting(), {"job_id": job_id, "reason": reason})
    if rows and rows[0][1]:
        dependencies.settle(ex, rows[0][1])
    return bool(rows)


def request_cancel_running(db: SessionOrExecutor, job_id: int) -> bool:
    """Flag a RUNNING job for cancellation; False when it is not running."""
    return bool(executor_for(db).rows(admin.request_cancel_running(), {"job_id": job_id}))


def list_jobs(
    session: Session,
    *,
    queue: str | None = None,
    state: JobState | None = None,
    task_name: str | None = None,
    before: int | None = None,
    after: int | None = None,
    limit: int = 50,
    history: bool = False,
) -> list[Job]:
    """Up to ``limit`` jobs, newest first, matching the filters; ``before``/``after`` (a job id)
    page to older/newer jobs. Returns ORM objects of ``session``; with ``history``, the same
    page of the moved jobs, as ``Job`` objects of no session (``moved_job``)."""
    cursor = "before" if before is not None else "after" if after is not None else None
    params: dict[str, Any] = {"limit": limit}
    params["states"] = [s.value for s in JobState] if state is None else [state.value]
    if queue is not None:
        params["queue"] = queue
        params["queues"] = [queue]
    elif state is not None and task_name is None:
        params["queues"] = job_queues(session, history=history)
    if task_name is not None:
        params["task_name"] = task_name
    if cursor is not None:
        params["cursor"] = before if before is not None else after
    statement = admin.list_jobs(
        by_queue=queue is not None,
        by_state=state is not None,
        by_task=task_name is not None,
        cursor=cursor,
        history=history,
    )
    jobs = [moved_job(row) if history else row for row in session.scalars(statement, params)]
    return jobs[::-1] if cursor == "after" else jobs


def job_queues(db: SessionOrExecutor, *, history: bool = False) -> list[str]:
    """Names of the queues that have jobs, sorted (one index probe per queue); of the moved
    jobs with ``history``."""
    return [row[0] for row in executor_for(db).rows(admin.job_queues(history))]


def capped_state_counts(
    db: SessionOrExecutor, cap: int, *, history: bool = False
) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` for every queue with jobs, each count stopping at ``cap``
    (``cap`` means "``cap`` or more"); states without jobs count 0. Of the moved jobs with
    ``history``."""
    counts: dict[str, dict[JobState, int]] = {}
    params = {"states": [s.value for s in JobState], "cap": cap}
    for queue, state, count in executor_for(db).rows(admin.capped_state_counts(history), params):
        counts.setdefault(queue, {})[JobState(state)] = int(count)
    return counts


def oldest_waiting(db: SessionOrExecutor) -> dict[str, tuple[int, dt.datetime, float]]:
    """``{queue: (job_id, run_at, seconds waiting)}`` for the earliest ticket of each queue."""
    rows = executor_for(db).rows(admin.oldest_waiting_per_queue())
    return {row[0]: (row[1], row[2], float(row[3])) for row in rows}


def _series(rows: Iterable[Any], buckets: int) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per bucket]}}`` from ``(queue, state, buckets_ago, count)``
    rows; rows outside ``0 .. buckets - 1`` are left out (the window's far edge by a fraction of
    a second, or a ``finished_at`` ahead of the database's clock)."""
    series: dict[str, dict[JobState, list[int]]] = {}
    for queue, state, buckets_ago, count in rows:
        if 0 <= buckets_ago < buckets:
            by_state = series.setdefault(queue, {})
            by_state.setdefault(JobState(state), [0] * buckets)[buckets_ago] += int(count)
    return series


def finished_per_minute(db: SessionOrExecutor) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last hour; index 0 is the current
    minute, index 59 an hour ago. Only queues with finished jobs in that hour appear."""
    return _series(executor_for(db).rows(admin.finished_per_minute()), 60)


def finished_per_clock_minute(
    db: SessionOrExecutor, cap: int
) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last 60 clock minutes, index 0 the
    current one, under the partitioned history: moved jobs from their per-minute counts, the
    live table's finished jobs read up to ``cap``. Only queues with finished jobs appear."""
    return _series(executor_for(db).rows(admin.finished_per_clock_minute(), {"cap": cap}), 60)


def finished_window_edge(
    db: SessionOrExecutor, window: float, cap: int, *, history: bool = False
) -> float | None:
    """Seconds since the ``cap``-th most recently finished job of the last ``window`` seconds
    finished; None when fewer than ``cap`` finished in that window. Of the moved jobs with
    ``history``."""
    params = {"window": float(window), "skip": cap - 1}
    rows = executor_for(db).rows(admin.finished_window_edge(history), params)
    return float(rows[0][0]) if rows else None


def finished_per_bucket(
    db: SessionOrExecutor, width: float, buckets: int, cap: int, *, history: bool = False
) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per bucket]}}`` over the last ``buckets`` x ``width`` seconds,
    counting at most the ``cap`` most recent jobs; index 0 is the newest bucket. Only queues
    with finished jobs in that window appear. Of the moved jobs with ``history``."""
    params = {"window": float(width * buckets), "width": float(width), "cap": cap}
    return _series(executor_for(db).rows(admin.finished_per_bucket(history), params), buckets)


def delete_job(db: SessionOrExecutor, job_id: int) -> bool:
    """Delete a job that is not running (and its ticket), cancelling the jobs that waited on it
    (``dependencies.abandon_orphans``); False when nothing was deleted."""
    ex = executor_for(db)
    rows = ex.rows(admin.delete_job(), {"job_id": job_id})
    if not rows:
        return False
    dependencies.abandon_orphans(ex, [job_id], rows[0][1] or ())
    return True


def table_counts(db: SessionOrExecutor) -> dict[str, int]:
    """Row counts of ``pgqueue_jobs`` and of ``pgqueue_message_queue`` (its tickets)."""
    ex = executor_for(db)
    return {
        "pgqueue_jobs": int(ex.rows(admin.job_count())[0][0]),
        "pgqueue_message_queue": int(ex.rows(admin.ticket_count())[0][0]),
    }


def states_of_jobs(db: SessionOrExecutor, job_ids: list[int]) -> dict[int, JobState]:
    """The current state of each of ``job_ids`` that exists."""
    rows = executor_for(db).rows(admin.states_of_jobs(), {"job_ids": job_ids})
    return {job_id: JobState(state) for job_id, state in rows}
