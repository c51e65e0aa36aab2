"""The statement an atomic job's transaction begins with: the lock on the job's row, which its
committed claim moved to RUNNING.

Holding the row for the whole run keeps the rescue (which skips locked rows) and every other
writer away while the handler runs, so the lease needs no heartbeat; once that transaction ends
without an outcome (its worker died), the lease runs out and the job is rescued. The job's
outcome is written in the same transaction, guarded by the lease's token.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import BigInteger, Select, Uuid, bindparam, select

from pgqueue.models import Job
from pgqueue.states import JobState


@cache
def lock_claimed() -> Select[int]:
    """Lock the row of RUNNING job ``job_id`` whose lease token is ``token`` (its id, or
    nothing when the lease was lost or the job moved on): held by the handler's transaction so
    that no rescue can take the job while the handler runs. NO KEY UPDATE, the lock an update
    of the job takes: it keeps every writer and the rescue out, but not the rows that only
    refer to the job (their foreign keys take KEY SHARE on its row)."""
    return (
        select(Job.id)
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            Job.state == JobState.RUNNING,
            Job.lease_token == bindparam("token", type_=Uuid),
        )
        .with_for_update(key_share=True)
    )
