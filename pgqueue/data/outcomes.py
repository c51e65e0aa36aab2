"""Outcomes and leases: writing what became of claimed jobs (one statement per kind, the
dependents of ended jobs settled alongside) and extending their leases (``sql.outcomes``), over
``db.Executor``; never commits. A lost lease shows as an id that matched no row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pgqueue.data import dependencies
from pgqueue.data import signals as signals_data
from pgqueue.data.workers import worker_params
from pgqueue.db import Executor
from pgqueue.jobs import Lease, Outcome, Progress, WorkerEntry
from pgqueue.sql import maintenance
from pgqueue.sql import outcomes as outcome_sql
from pgqueue.sql import workers as workers_sql
from pgqueue.states import FINAL_STATES, OutcomeKind

_OUTCOME_STATEMENTS = {
    OutcomeKind.COMPLETE: outcome_sql.complete,
    OutcomeKind.RETRY: outcome_sql.retry,
    OutcomeKind.FAIL: outcome_sql.fail,
    OutcomeKind.CANCELLED: outcome_sql.mark_cancelled,
    OutcomeKind.RELEASE: outcome_sql.release,
    OutcomeKind.SNOOZE: outcome_sql.snooze,
    OutcomeKind.SUSPEND: outcome_sql.suspend,
}


# Outcomes that end (or, a snooze past its maximum, may end) their job: its dependents are
# settled in the same transaction.
_ENDING_KINDS = frozenset(
    k for k in OutcomeKind if k.transition.target in FINAL_STATES or k is OutcomeKind.SNOOZE
)


def record_outcomes(
    db: Executor,
    outcomes: Iterable[Outcome],
    *,
    lock_wait_ms: int | None = None,
    lock_rows: bool = True,
) -> set[int]:
    """Write many outcomes, one statement per kind, and settle the dependents of the jobs they
    ended; return the ids whose lease was lost. Run in one transaction: an outcome and the
    settling of its dependents commit together. ``lock_wait_ms``: the transaction waits at
    most this long for each row lock (``lock_timeout``, set for this transaction only).

    Outcomes of several kinds, or of one kind with ``lock_rows``, first lock their rows in id
    order, the heartbeat's: one statement per kind would lock them in kind order, and one
    statement in its join's order, either of which can deadlock with a heartbeat of the same
    jobs. A worker passes ``lock_rows=False`` when it knows no heartbeat of these jobs is
    under way (``worker.slots.Slots.heartbeat_in_flight``): the locking statement writes a row
    lock per job, a visible share of the server's work per job."""
    ex = db
    if lock_wait_ms is not None:
        ex.rows(maintenance.set_lock_timeout(), {"ms": str(lock_wait_ms)})
    by_kind: dict[OutcomeKind, list[Outcome]] = {}
    for outcome in outcomes:
        by_kind.setdefault(outcome.kind, []).append(outcome)
    if lock_rows or len(by_kind) > 1:
        ids = sorted({o.job_id for batch in by_kind.values() for o in batch})
        if len(ids) > 1:
            ex.rows(outcome_sql.lock_jobs(), {"ids": ids})
    lost: set[int] = set()
    ended: list[int] = []
    for kind, batch in by_kind.items():
        statement = _OUTCOME_STATEMENTS.get(kind)
        if statement is None:  # pragma: no cover - Outcome kinds are produced by pgqueue only
            raise ValueError(f"unknown outcome kind {kind!r}")
        params = _outcome_params(kind, batch)
        with_progress = _add_progress(params, batch)
        keyed = any(o.keyed for o in batch)
        rows = ex.rows(statement(with_progress, keyed), params)
        if kind in _ENDING_KINDS:
            ended += dependencies.ended_dependents(rows, 1)
        if len(rows) != len(batch):
            done = {row[0] for row in rows}
            lost.update(o.job_id for o in batch if o.job_id not in done)
        if kind is OutcomeKind.SUSPEND and any(o.signal is not None for o in batch):
            # A signal committed while the handler ran found the job RUNNING and woke nothing:
            # this statement, after the suspension took the jobs' row locks, sees it.
            waiting = [o.job_id for o in batch if o.signal is not None]
            signals_data.wake_signalled(ex, waiting)
    if ended:
        dependencies.settle(ex, ended)
    return lost


def check_deferred_constraints(db: Executor) -> None:
    """Check the transaction's deferred constraints now (a violation raises here)."""
    db.rows(outcome_sql.check_deferred_constraints())


def _outcome_params(kind: OutcomeKind, batch: Sequence[Outcome]) -> dict[str, Any]:
    """The bind parameters of the statement of ``kind`` for ``batch``."""
    params: dict[str, Any] = {
        "ids": [o.job_id for o in batch],
        "tokens": [o.lease_token for o in batch],
    }
    if kind == OutcomeKind.COMPLETE:
        params["results"] = [o.result_json for o in batch]
    elif kind == OutcomeKind.RETRY:
        params["delays"] = [o.delay for o in batch]
        params["errors"] = [o.error for o in batch]
    elif kind in (OutcomeKind.FAIL, OutcomeKind.CANCELLED):
        params["errors"] = [o.error for o in batch]
    elif kind == OutcomeKind.SNOOZE:
        params["delays"] = [o.delay for o in batch]
        params["max_snoozes"] = [o.max_snoozes for o in batch]
    elif kind == OutcomeKind.SUSPEND:
        params["wake_ats"] = [o.wake_at for o in batch]
        params["signals"] = [o.signal for o in batch]
    return params


def _add_progress(params: dict[str, Any], batch: Sequence[Outcome]) -> bool:
    """Add the progress arrays of ``batch`` to ``params`` when any of its outcomes carries
    progress no heartbeat wrote (then the statement's ``with_progress`` form runs); whether
    it did."""
    if all(o.progress is None for o in batch):
        return False
    reported = [o.progress for o in batch]
    params["progress_values"] = [None if p is None else p[0] for p in reported]
    params["progress_messages"] = [None if p is None else p[1] for p in reported]
    return True


def heartbeat(
    db: Executor,
    leases: Sequence[Lease],
    worker: WorkerEntry | None = None,
    progress: Mapping[int, Progress] | None = None,
) -> dict[int, bool]:
    """Extend leases ``(job id, token, seconds)``; return ``{id: cancel_requested}`` for those
    still held (ids missing from the result have lost their lease). With ``worker``, the same
    statement refreshes that worker's registry row (``worker_seen``); with ``progress`` (job
    id -> progress reported since the last write), it also writes that progress."""
    if not leases:
        return {}
    params: dict[str, Any] = {
        "ids": [job_id for job_id, _, _ in leases],
        "tokens": [token for _, token, _ in leases],
        "lease_seconds": [seconds for _, _, seconds in leases],
    }
    with_progress = bool(progress)
    if progress:
        reported = [progress.get(job_id) for job_id, _, _ in leases]
        params["progress_values"] = [None if p is None else p[0] for p in reported]
        params["progress_messages"] = [None if p is None else p[1] for p in reported]
    statement = outcome_sql.heartbeat(with_progress)
    if worker is not None:
        params.update(worker_params(worker))
        statement = workers_sql.heartbeat_and_seen(with_progress)
    return {job_id: bool(flag) for job_id, flag in db.rows(statement, params)}
