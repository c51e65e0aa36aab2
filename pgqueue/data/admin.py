"""The admin surface's reads and manual actions (``sql.admin``, ``sql.job_lists``): one job,
counts, lists, time series, re-run, cancel and delete; over ``db.Executor`` (with the
``Session`` it was made of where ORM objects are returned), never committing.

Each operation ``pgq.admin`` runs is one function here, composed of the statements it needs:
the reads of jobs cover the tables the executor's ``tables`` name (``jobs.JobTables``: the
partitioned history's moved jobs too), and an action that changes nothing says why by raising.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from pgqueue.admin_values import ListArguments
from pgqueue.data import dependencies
from pgqueue.data.enqueue import unique_key_holders
from pgqueue.data.history import moved_state
from pgqueue.db import Executor, executor_for
from pgqueue.errors import InvalidStateTransition, JobNotFound, UniqueKeyHeld
from pgqueue.models import JOB_COLUMN_NAMES, Job, JobHistory
from pgqueue.sql import admin, job_lists
from pgqueue.sql import workflows as workflows_sql
from pgqueue.sqlstates import is_unique_violation
from pgqueue.states import JobState, WorkflowRole

RERUNNABLE: Final = frozenset({JobState.FAILED, JobState.CANCELLED})
CANCELLABLE: Final = frozenset({JobState.QUEUED, JobState.RETRYING, JobState.RUNNING})
# ``throughput``'s bound on the live table's jobs read under the partitioned history: none (the
# largest int a LIMIT takes), since ``throughput`` counts every job of the hour.
UNCAPPED: Final = 2**31 - 1
THROUGHPUT_WINDOW: Final = 3600
# Bucket widths (seconds) a shrunken window is divided into, at most 60 buckets of them.
BUCKET_WIDTHS: Final = (1, 2, 5, 10, 15, 30, 60)


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


def mark_awaited(db: Executor, job_id: int) -> bool:
    """Mark job ``job_id`` as waited for (its end is then announced); False when it is
    finished, missing or already marked."""
    return bool(db.rows(admin.mark_awaited(), {"job_id": job_id}))


def state_counts(db: Executor) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` over all jobs."""
    counts: dict[str, dict[JobState, int]] = {}
    for queue, state, count in db.rows(admin.job_state_counts()):
        counts.setdefault(queue, {})[JobState(state)] = count
    return counts


def rerun(db: Executor, job_id: int) -> bool:
    """Queue a FAILED or CANCELLED job again; False when it is in no such state."""
    return bool(db.rows(admin.rerun(), {"job_id": job_id}))


def cancel_waiting(ex: Executor, job_id: int, reason: str) -> bool:
    """Cancel a job that waits (queued, retrying, or waiting on dependencies) and settle its
    dependents; False when it does not wait."""
    rows = ex.rows(admin.cancel_waiting(), {"job_id": job_id, "reason": reason})
    if rows and rows[0][1]:
        dependencies.settle(ex, rows[0][1])
    return bool(rows)


def request_cancel_running(db: Executor, job_id: int) -> bool:
    """Flag a RUNNING job for cancellation; False when it is not running."""
    return bool(db.rows(admin.request_cancel_running(), {"job_id": job_id}))


def list_jobs(session: Session, listing: ListArguments, *, history: bool = False) -> list[Job]:
    """The page of jobs ``listing`` asks for, newest first. Returns ORM objects of ``session``;
    with ``history``, the same page of the moved jobs, as ``Job`` objects of no session
    (``moved_job``)."""
    queue, state, task_name = listing.queue, listing.state, listing.task_name
    before, after = listing.before, listing.after
    cursor = "before" if before is not None else "after" if after is not None else None
    params: dict[str, Any] = {"limit": listing.limit}
    params["states"] = [s.value for s in JobState] if state is None else [state.value]
    if queue is not None:
        params["queue"] = queue
        params["queues"] = [queue]
    elif state is not None and task_name is None:
        params["queues"] = job_queues(executor_for(session), history=history)
    if task_name is not None:
        params["task_name"] = task_name
    if cursor is not None:
        params["cursor"] = before if before is not None else after
    statement = job_lists.list_jobs(
        by_queue=queue is not None,
        by_state=state is not None,
        by_task=task_name is not None,
        cursor=cursor,
        history=history,
    )
    jobs = [moved_job(row) if history else row for row in session.scalars(statement, params)]
    return jobs[::-1] if cursor == "after" else jobs


def job_queues(db: Executor, *, history: bool = False) -> list[str]:
    """Names of the queues that have jobs, sorted by code point (one index probe per queue);
    of the moved jobs with ``history``."""
    return [row[0] for row in db.rows(job_lists.job_queues(history))]


def capped_state_counts(
    db: Executor, cap: int, *, history: bool = False
) -> dict[str, dict[JobState, int]]:
    """``{queue: {state: count}}`` for every queue with jobs, each count stopping at ``cap``
    (``cap`` means "``cap`` or more"); states without jobs count 0. Of the moved jobs with
    ``history``."""
    counts: dict[str, dict[JobState, int]] = {}
    params = {"states": [s.value for s in JobState], "cap": cap}
    for queue, state, count in db.rows(job_lists.capped_state_counts(history), params):
        counts.setdefault(queue, {})[JobState(state)] = int(count)
    return counts


def oldest_waiting(db: Executor) -> dict[str, tuple[int, dt.datetime, float]]:
    """``{queue: (job_id, run_at, seconds waiting)}`` for the earliest ticket of each queue."""
    rows = db.rows(admin.oldest_waiting_per_queue())
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


def finished_per_minute(db: Executor) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last hour; index 0 is the current
    minute, index 59 an hour ago. Only queues with finished jobs in that hour appear."""
    return _series(db.rows(admin.finished_per_minute()), 60)


def finished_per_clock_minute(db: Executor, cap: int) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per minute]}}`` over the last 60 clock minutes, index 0 the
    current one, under the partitioned history: moved jobs from their per-minute counts, the
    live table's finished jobs among its ``cap`` most recent. Only queues with finished jobs
    appear."""
    return _series(db.rows(admin.finished_per_clock_minute(), {"cap": cap}), 60)


@dataclass(frozen=True, slots=True)
class WindowEdge:
    """Of the ``cap`` most recently finished jobs, the ``count`` that finished within a window,
    and how many seconds ago the oldest of those finished (None when none did)."""

    count: int
    seconds_ago: float | None

    def shortens(self, cap: int) -> float | None:
        """The window holding the ``cap`` newest jobs (seconds) when this one holds at least
        that many; None when it holds fewer."""
        return self.seconds_ago if self.count >= cap else None


def finished_window_edge(
    db: Executor, window: float, cap: int, *, history: bool = False
) -> WindowEdge:
    """How many of the ``cap`` most recently finished jobs finished within the last ``window``
    seconds, and when the oldest of them did. Of the moved jobs with ``history``."""
    params = {"window": float(window), "cap": cap}
    count, seconds_ago = db.rows(admin.finished_window_edge(history), params)[0]
    return WindowEdge(int(count), None if seconds_ago is None else float(seconds_ago))


def finished_per_bucket(
    db: Executor, width: float, buckets: int, cap: int, *, history: bool = False
) -> dict[str, dict[JobState, list[int]]]:
    """``{queue: {state: [count per bucket]}}`` over the last ``buckets`` x ``width`` seconds,
    of the ``cap`` most recently finished jobs; index 0 is the newest bucket. Only queues with
    finished jobs in that window appear. Of the moved jobs with ``history``."""
    if cap < 1:
        return {}
    params = {"window": float(width * buckets), "width": float(width), "cap": cap}
    return _series(db.rows(admin.finished_per_bucket(history), params), buckets)


def delete_job(ex: Executor, job_id: int) -> bool:
    """Delete a job that is not running (and its ticket), cancelling the jobs that waited on it
    (``dependencies.abandon_orphans``); False when nothing was deleted."""
    rows = ex.rows(admin.delete_job(), {"job_id": job_id})
    if not rows:
        return False
    dependencies.abandon_orphans(ex, [job_id], rows[0][1] or ())
    return True


# -- the operations of ``pgq.admin`` that compose the statements above --------------------------


def job_snapshot(session: Session, ex: Executor, job_id: int) -> Job:
    """Job ``job_id`` read in ``session`` (``ex`` its executor) and detached from it; under the
    partitioned history, found there when it is no longer in ``pgqueue_jobs`` (a ``Job`` of no
    session, without steps). Raises JobNotFound."""
    job = get_job(session, job_id)
    if job is None:
        # Read after the live table: a job moved in between is found here, never missed.
        moved = get_moved_job(session, job_id) if ex.tables.partitioned else None
        if moved is None:
            raise JobNotFound(f"no job with id {job_id}")
        return moved
    session.expunge(job)
    return job


def jobs_page(session: Session, ex: Executor, listing: ListArguments) -> list[Job]:
    """``list_jobs`` over every table of ``ex.tables`` (``ex``: the executor of ``session``):
    up to ``listing.limit`` jobs nearest the cursor, newest first, each once, detached from
    ``session``."""
    pages = [list_jobs(session, listing, history=moved) for moved in ex.tables.reads]
    session.expunge_all()
    if len(pages) == 1:
        return pages[0]
    by_id: dict[int, Job] = {}
    for page in pages:
        for job in page:
            by_id.setdefault(job.id, job)  # the live table's row first
    ids = sorted(by_id)
    limit = listing.limit
    nearest = ids[:limit] if listing.after is not None else ids[-limit:]
    return [by_id[i] for i in reversed(nearest)]


def remove_job(session: Session, ex: Executor, job_id: int) -> bool:
    """``delete_job``, or InvalidStateTransition when its workflow refuses it (a job of a
    running workflow, a closing marker); False when it is running or gone."""
    if delete_job(ex, job_id):
        return True
    job = get_job(session, job_id)
    refusal = None if job is None else workflow_refusal(session, job, "delete")
    if refusal is not None:
        raise InvalidStateTransition(refusal)
    return False


def rerun_job(session: Session, ex: Executor, job_id: int) -> None:
    """``rerun``, or the reason it changed nothing: InvalidStateTransition, JobNotFound, or
    UniqueKeyHeld when another job holds its unique key (it would hold it twice).

    The update runs in a savepoint: when the unique index refuses it, the key's holder is
    looked up and named, and the caller's transaction stays usable."""
    for attempt in range(_RERUN_TRIES):
        try:
            with session.begin_nested():
                # Through the session, inside its savepoint (which begins on first use).
                moved = rerun(executor_for(session), job_id)
            break
        except DBAPIError as exc:
            if not is_unique_violation(exc):
                raise
            _refuse_held_key(ex, job_id)
            # The holder ended before the look found it: the key is free for the next try.
            if attempt == _RERUN_TRIES - 1:
                raise
    if not moved:
        _raise_for_state(session, ex, job_id, "retry", RERUNNABLE)


# How many times a retry meets a unique key's holder that ends before it can be named.
_RERUN_TRIES: Final = 3


def _refuse_held_key(ex: Executor, job_id: int) -> None:
    """UniqueKeyHeld when a retry of job ``job_id`` would give its unique key a second holder."""
    keys = ex.rows(admin.rerun_key(), {"job_id": job_id})
    key = keys[0][0] if keys else None
    if key is None:
        return
    holder = unique_key_holders(ex, [key]).get(key)
    if holder is not None:
        raise UniqueKeyHeld(key, *holder, refused=f"cannot retry job {job_id}")


def cancel_job(session: Session, ex: Executor, job_id: int, reason: str) -> JobState:
    """Cancel a waiting job (CANCELLED) or flag a running one (RUNNING); otherwise the reason
    nothing changed: InvalidStateTransition or JobNotFound."""
    if cancel_waiting(ex, job_id, reason):
        return JobState.CANCELLED
    if request_cancel_running(ex, job_id):
        return JobState.RUNNING
    _raise_for_state(session, ex, job_id, "cancel", CANCELLABLE)
    raise AssertionError("unreachable")  # pragma: no cover


def _raise_for_state(
    session: Session, ex: Executor, job_id: int, action: str, allowed: frozenset[JobState]
) -> None:
    job = get_job(session, job_id)
    if job is None:
        moved = moved_state(ex, job_id)
        if moved is not None:
            raise InvalidStateTransition(
                f"cannot {action} job {job_id}: it finished ({moved.value}) and was moved "
                "to the history (history=partitioned), where jobs are read-only; enqueue a new "
                "job with its arguments instead"
            )
        raise JobNotFound(f"no job with id {job_id}")
    refusal = workflow_refusal(session, job, action)
    if refusal is not None:
        raise InvalidStateTransition(refusal)
    names = ", ".join(sorted(s.value for s in allowed))
    raise InvalidStateTransition(
        f"cannot {action} job {job_id}: it {job.state.phrase} (allowed from: {names})"
    )


def workflow_refusal(session: Session, job: Job, action: str) -> str | None:
    """Why ``action`` (retry, cancel, delete) of ``job`` by hand is refused because of its
    workflow (``sql.common.retried_or_cancelled_by_hand``, ``deleted_by_hand``); None when its
    workflow does not refuse it."""
    workflow = job.workflow_id
    if workflow is None:
        return None
    prefix = f"cannot {action} job {job.id}"
    if job.workflow_role == WorkflowRole.CLOSING:
        return (
            f"{prefix}: it is the closing marker of workflow {workflow}, which ends when the "
            "workflow's jobs end; to stop the workflow, cancel it "
            f"(`pgqueue workflow {workflow} --cancel`)"
        )
    state = executor_for(session).rows(workflows_sql.workflow_row(), {"workflow": workflow})
    running = bool(state) and state[0][0] == "running"
    if running:
        return (
            f"{prefix}: it belongs to workflow {workflow}, which is running; its jobs are "
            "settled by the workflow (a callback gets one result per member), so act on the "
            f"whole workflow (`pgqueue workflow {workflow} --cancel`)"
        )
    if action == "delete" or job.workflow_role == WorkflowRole.ON_FAILURE:
        return None
    ended = state[0][0] if state else "ended"
    return (
        f"{prefix}: it belongs to workflow {workflow}, which {ended}; a workflow's jobs are "
        "not run again one by one (its callbacks were settled by this outcome): enqueue the "
        "workflow again"
    )


def queue_names(db: Executor) -> list[str]:
    """The queues that have jobs in any table of ``db.tables``, sorted."""
    return sorted({name for moved in db.tables.reads for name in job_queues(db, history=moved)})


def capped_counts(db: Executor, cap: int) -> dict[str, dict[JobState, int]]:
    """``capped_state_counts`` over every table of ``db.tables``, each sum capped too."""
    counts = capped_state_counts(db, cap)
    for moved in db.tables.reads[1:]:
        for queue, more in capped_state_counts(db, cap, history=moved).items():
            live = counts.setdefault(queue, dict.fromkeys(JobState, 0))
            for state, count in more.items():
                live[state] = min(cap, live.get(state, 0) + count)
    return counts


def throughput(db: Executor) -> dict[str, dict[JobState, list[int]]]:
    """Jobs finished per minute over the last hour (``finished_per_minute``); under the
    partitioned history per clock minute, the moved jobs from their per-minute counts."""
    if db.tables.partitioned:
        return finished_per_clock_minute(db, UNCAPPED)
    return finished_per_minute(db)


def recent_throughput(
    ex: Executor, cap: int
) -> tuple[int, int, dict[str, dict[JobState, list[int]]], bool]:
    """``(window, width, series, shortened)``: jobs finished per bucket of ``width`` seconds
    over the last hour, or, when more than ``cap`` finished in that hour, over the shorter
    ``window`` holding the ``cap`` most recent ones (``shortened``), in 1 to 60 second
    buckets (at most 60). Reads at most about ``cap`` index entries per table twice. Under the
    partitioned history the moved jobs of a whole hour come from their per-minute counts."""
    tables = ex.tables
    # The bucket reads take as many of the newest jobs as each table's window was seen to
    # hold (at most ``cap``): in a quiet hour, only the hour's few.
    live = finished_window_edge(ex, THROUGHPUT_WINDOW, cap)
    held = {False: live.count}
    live_edge = live.shortens(cap)
    edges = [] if live_edge is None else [live_edge]
    if tables.partitioned:
        if live_edge is None:
            # The whole hour: the live table's few minutes of finished jobs, and the moved ones
            # from their per-minute counts (never the history's rows).
            return THROUGHPUT_WINDOW, 60, finished_per_clock_minute(ex, live.count), False
        # The window is no longer than the live table's: the history is read within it only,
        # to ``cap`` as well, so at most about twice ``cap`` jobs are read.
        moved = finished_window_edge(ex, live_edge, cap, history=True)
        held[True] = moved.count
        if (moved_edge := moved.shortens(cap)) is not None:
            edges.append(moved_edge)
    edge = min(edges) if edges else None
    if edge is None:
        width, window = 60, THROUGHPUT_WINDOW
    else:
        width = next((w for w in BUCKET_WIDTHS if w * 60 >= edge), BUCKET_WIDTHS[-1])
        # Rounded up to whole buckets: the window must reach the cap-th newest job, or a burst
        # that finished within one bucket, some seconds ago, falls outside it.
        window = max(1, math.ceil(edge / width)) * width
    series: dict[str, dict[JobState, list[int]]] = {}
    for in_history in tables.reads:
        part = finished_per_bucket(ex, width, window // width, held[in_history], history=in_history)
        for queue, by_state in part.items():
            for state, counts in by_state.items():
                into = series.setdefault(queue, {}).setdefault(state, [0] * len(counts))
                for i, count in enumerate(counts):
                    into[i] += count
    return window, width, series, edge is not None


def table_counts(ex: Executor) -> dict[str, int]:
    """Row counts of ``pgqueue_jobs`` and of ``pgqueue_message_queue`` (its tickets)."""
    return {
        "pgqueue_jobs": int(ex.rows(admin.job_count())[0][0]),
        "pgqueue_message_queue": int(ex.rows(admin.ticket_count())[0][0]),
    }


def states_of_jobs(db: Executor, job_ids: list[int]) -> dict[int, JobState]:
    """The current state of each of ``job_ids`` that exists."""
    rows = db.rows(admin.states_of_jobs(), {"job_ids": job_ids})
    return {job_id: JobState(state) for job_id, state in rows}
