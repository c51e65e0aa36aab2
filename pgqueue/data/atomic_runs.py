"""The run records of atomic jobs (``sql.atomic_runs``): an attempt's start recorded outside
its transaction, so a transaction lost with its connection is still counted; over
``db.Executor``, never committing.
"""

from __future__ import annotations

from pgqueue.data import dependencies
from pgqueue.db import SessionOrExecutor, executor_for
from pgqueue.jobs import ClaimedJob
from pgqueue.sql import atomic_runs
from pgqueue.states import JobState


def record_atomic_run(db: SessionOrExecutor, job: ClaimedJob, worker_id: str) -> bool:
    """Record, on a connection other than the claim's and committed at once, that ``job``'s
    handler starts its attempt (``sql.atomic_runs.record_run``). False when a run of that
    attempt is already recorded (an earlier run's transaction was lost and must be counted
    before the handler may run again), or when the claim is stale: its transaction ended and
    the job moved on, so the handler must not run."""
    params = {"job_id": job.id, "attempt": job.attempt, "worker": worker_id}
    return bool(executor_for(db).rows(atomic_runs.record_run(), params))


def clear_atomic_runs(db: SessionOrExecutor, job_id: int) -> None:
    """Delete the job's run records, in the transaction that commits its attempt."""
    executor_for(db).rows(atomic_runs.clear_runs(), {"job_id": job_id})


def count_lost_attempt(
    db: SessionOrExecutor, job: ClaimedJob, *, delay: float, error: str
) -> JobState | None:
    """Count the recorded runs of atomic job ``job`` whose transaction was lost
    (``sql.atomic_runs.count_lost_runs``): retried after ``delay`` seconds, or failed for good
    with its dependents settled. None when nothing was lost (the claim had committed after
    all, or no run was recorded) or a claim of the job under way elsewhere counts them. Run in
    a transaction of its own."""
    ex = executor_for(db)
    params = {"job_id": job.id, "delay": delay, "error": error}
    rows = ex.rows(atomic_runs.count_lost_runs(), params)
    if not rows:
        return None
    ended = dependencies.ended_dependents(rows, 1)
    if ended:
        dependencies.settle(ex, ended)
    return JobState(rows[0][0])


def lock_claimed(db: SessionOrExecutor, job: ClaimedJob) -> bool:
    """Lock the row of ``job`` (claimed by ``data.claim.claim_atomic_controlled``) in the caller's
    transaction; False when its lease was lost."""
    params = {"job_id": job.id, "token": job.lease_token}
    return bool(executor_for(db).rows(atomic_runs.lock_claimed(), params))
