"""The database operations of the bulk actions: count, retry, cancel or delete the jobs a
``JobFilter`` chooses, and write the audit record; one function per operation over
``db.Executor``, never committing (``pgq.admin`` runs each action and its record in one
transaction). The statements are ``sql.bulk``'s; the filter's translation into binds and the
settling after a cancel are here.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from sqlalchemy.exc import DBAPIError

from pgqueue.data import dependencies
from pgqueue.db import Executor
from pgqueue.errors import BulkCountChanged, InvalidStateTransition
from pgqueue.job_filter import BulkAction, JobFilter
from pgqueue.sql import bulk
from pgqueue.sqlstates import is_unique_violation
from pgqueue.states import JobState


def like_pattern(text: str) -> str:
    """An ``ILIKE`` pattern (escape character ``\\``) matching ``text`` anywhere, its ``%``,
    ``_`` and ``\\`` taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _statement_input(
    job_filter: JobFilter, states: Collection[JobState], *, deleting: bool = False
) -> tuple[bulk.Shape, dict[str, Any]]:
    shape = bulk.Shape(
        by_queue=job_filter.queue is not None,
        by_task=job_filter.task_name is not None,
        since=job_filter.since is not None,
        until=job_filter.until is not None,
        time_column=job_filter.time_column,
        by_error=job_filter.error_contains is not None,
        deleting=deleting,
    )
    params: dict[str, Any] = {"filter_states": sorted(s.value for s in states)}
    if job_filter.queue is not None:
        params["filter_queue"] = job_filter.queue
    if job_filter.task_name is not None:
        params["filter_task"] = job_filter.task_name
    if job_filter.since is not None:
        params["since"] = job_filter.since
    if job_filter.until is not None:
        params["until"] = job_filter.until
    if job_filter.error_contains is not None:
        params["error_pattern"] = like_pattern(job_filter.error_contains)
    return shape, params


def count_matching(
    db: Executor,
    job_filter: JobFilter,
    states: Collection[JobState],
    *,
    deleting: bool = False,
) -> int:
    """How many jobs in ``states`` the filter matches for a retry or cancel, or with
    ``deleting`` for a delete."""
    shape, params = _statement_input(job_filter, states, deleting=deleting)
    return int(db.rows(bulk.count(shape), params)[0][0])


def retry_matching(db: Executor, job_filter: JobFilter, states: Collection[JobState]) -> int:
    """Queue the matching FAILED/CANCELLED jobs (of ``states``) again; how many. Refused with
    InvalidStateTransition, nothing changed, when that would give one unique key two holders."""
    shape, params = _statement_input(job_filter, states)
    try:
        return int(db.rows(bulk.retry(shape), params)[0][0])
    except DBAPIError as exc:
        if not is_unique_violation(exc):
            raise
        raise InvalidStateTransition(
            "retry changed nothing: a matched job's unique_key is held by a job that has not "
            "ended, or two matched jobs share one; retry those jobs one at a time (a job's "
            "retry names the holder) or narrow the filter"
        ) from exc


def cancel_matching(
    db: Executor, job_filter: JobFilter, states: Collection[JobState], reason: str
) -> tuple[int, int]:
    """Cancel the matching waiting jobs (settling their dependents) and flag the matching
    running ones, among ``states``: ``(cancelled, flagged)``."""
    ex = db
    waiting = [s for s in states if s is not JobState.RUNNING]
    cancelled = flagged = 0
    if waiting:
        shape, params = _statement_input(job_filter, waiting)
        params["reason"] = reason
        cancelled, dependents = ex.rows(bulk.cancel_waiting(shape), params)[0]
        if dependents:
            dependencies.settle(ex, dependents)
    if JobState.RUNNING in states:
        shape, params = _statement_input(job_filter, [JobState.RUNNING])
        flagged = ex.rows(bulk.flag_running(shape), params)[0][0]
    return int(cancelled), int(flagged)


def delete_matching(db: Executor, job_filter: JobFilter, states: Collection[JobState]) -> int:
    """Delete the matching jobs of ``states`` that are not running, and their tickets,
    cancelling the jobs that waited on them (``dependencies.abandon_orphans``); how many jobs."""
    ex = db
    shape, params = _statement_input(job_filter, states, deleting=True)
    count, parents, orphans = ex.rows(bulk.delete_jobs(shape), params)[0]
    dependencies.abandon_orphans(ex, parents, orphans)
    return int(count)


def record_action(
    db: Executor,
    *,
    actor: str,
    source: str,
    action: BulkAction,
    job_filter: JobFilter,
    count: int,
) -> int:
    """Write the audit record of one bulk action; its id."""
    params = {
        "actor": actor,
        "source": source,
        "action": action.value,
        "filter": json.dumps(job_filter.as_record(), sort_keys=True),
        "count": count,
    }
    return int(db.rows(bulk.insert_audit(), params)[0][0])


def act_and_record(
    db: Executor,
    action: BulkAction,
    job_filter: JobFilter,
    states: Collection[JobState],
    *,
    actor: str,
    source: str,
    expected_count: int | None,
    cancel_reason: str,
) -> tuple[int, int, int]:
    """Apply ``action`` to the matching jobs of ``states`` and write its audit record:
    ``(count changed, running jobs flagged, audit record id)``. With ``expected_count``, an
    action that changes another number of jobs raises ``BulkCountChanged``, so that the
    caller's transaction rolls back and nothing was changed."""
    ex = db
    flagged = 0
    if action is BulkAction.RETRY:
        count = retry_matching(ex, job_filter, states)
    elif action is BulkAction.CANCEL:
        cancelled, flagged = cancel_matching(ex, job_filter, states, cancel_reason)
        count = cancelled + flagged
    else:
        count = delete_matching(ex, job_filter, states)
    if expected_count is not None and count != expected_count:
        raise BulkCountChanged(
            f"{action.value} would now change {count} jobs, not the {expected_count} "
            "previewed; nothing was changed (preview again)"
        )
    audit_id = record_action(
        ex, actor=actor, source=source, action=action, job_filter=job_filter, count=count
    )
    return count, flagged, audit_id
