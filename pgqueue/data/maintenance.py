"""Maintenance (``sql.maintenance``): rescuing expired leases, pruning finished jobs, the
maintenance lock, correcting drifted counters and deleting idle key rows; over
``db.Executor``, never committing.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgqueue.data import dependencies
from pgqueue.db import Executor
from pgqueue.sql import maintenance
from pgqueue.states import JobState


def expired_lease_exists(db: Executor) -> bool:
    """Whether any RUNNING job's lease has expired."""
    return bool(db.rows(maintenance.expired_lease_exists())[0][0])


def rescue_expired(
    db: Executor,
    *,
    lock_key: int,
    limit: int,
    error: str,
    ids: Sequence[int] | None = None,
    lock_wait_ms: int | None = None,
) -> list[tuple[int, str]]:
    """Re-queue or end jobs whose lease expired (only among ``ids`` when given) and settle the
    dependents of those that ended; ``(id, new state)`` of each. ``lock_wait_ms``: the
    transaction waits at most this long for each row lock (``lock_timeout``, this transaction
    only)."""
    ex = db
    if lock_wait_ms is not None:
        ex.rows(maintenance.set_lock_timeout(), {"ms": str(lock_wait_ms)})
    params: dict[str, object] = {"lock_key": lock_key, "limit": limit, "error": error}
    if ids is not None:
        params["ids"] = list(ids)
    rows = ex.rows(maintenance.rescue_expired(ids is not None), params)
    ended = [d for row in rows if row[1] != JobState.RETRYING.value for d in row[2] or ()]
    if ended:
        dependencies.settle(ex, ended)
    return [(row[0], row[1]) for row in rows]


def expired_leases(db: Executor, *, limit: int) -> list[tuple[int, str]]:
    """``(id, queue)`` of up to ``limit`` RUNNING jobs whose lease expired, longest first."""
    return [(row[0], row[1]) for row in db.rows(maintenance.expired_leases(), {"limit": limit})]


def prune_finished(
    db: Executor, *, succeeded_before: float, failed_before: float, limit: int
) -> int:
    """Delete up to ``limit`` finished jobs past their retention; how many were deleted."""
    params = {"succeeded_before": succeeded_before, "failed_before": failed_before, "limit": limit}
    return int(db.rows(maintenance.prune_finished(), params)[0][0])


def try_maintenance_lock(db: Executor, key: int) -> bool:
    """Take the transaction's advisory lock ``key`` if free."""
    return bool(db.rows(maintenance.try_maintenance_lock(), {"key": key})[0][0])


def recount_running(db: Executor) -> dict[str, int]:
    """Correct drifted ``running`` counters of limited queues (call inside a transaction);
    returns ``{queue: corrected count}``. Queues a claim is using right now are skipped."""
    ex = db
    names = [row[0] for row in ex.rows(maintenance.lock_limited_queues())]
    if not names:
        return {}
    return {
        name: running for name, running in ex.rows(maintenance.recount_running(), {"names": names})
    }


def delete_idle_keys(db: Executor, *, after: str, limit: int) -> tuple[str | None, int]:
    """Delete the idle rows among up to ``limit`` key rows after key ``after`` (call inside a
    transaction); ``(last key read, None when none was left; rows deleted)``."""
    ex = db
    last, keys = ex.rows(maintenance.lock_idle_keys(), {"after": after, "limit": limit})[0]
    if not keys:
        return last, 0
    return last, len(ex.rows(maintenance.delete_idle_keys(), {"keys": list(keys)}))
