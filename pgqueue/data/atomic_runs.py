"""The lock an atomic job's transaction takes on the job's row first (``sql.atomic_runs``), over
``db.Executor``, never committing.
"""

from __future__ import annotations

from pgqueue.db import Executor
from pgqueue.jobs import ClaimedJob
from pgqueue.sql import atomic_runs


def lock_claimed(db: Executor, job: ClaimedJob) -> bool:
    """Lock the row of atomic job ``job``, claimed by a committed ``data.claim.claim``, in the
    caller's transaction; False when its lease was lost (the job was rescued meanwhile)."""
    params = {"job_id": job.id, "token": job.lease_token}
    return bool(db.rows(atomic_runs.lock_claimed(), params))
