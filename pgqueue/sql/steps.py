"""Statements of durable steps (``pgqueue_job_steps``): read a job's saved steps, and save one
completed step under the job's lease.

Only a handler that calls ``ctx.step`` runs them; nothing on the claim or outcome path reads or
writes this table (deleting a job deletes its steps through the foreign key).
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import JSON, BigInteger, Select, Text, Uuid, bindparam, cast, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert

from pgqueue.models import Job, JobStep
from pgqueue.states import JobState


@cache
def saved_steps() -> Select[str, str]:
    """``(name, result as JSON text)`` of every saved step of job ``job_id``."""
    return select(JobStep.name, cast(JobStep.result, Text)).where(
        JobStep.job_id == bindparam("job_id", type_=BigInteger)
    )


@cache
def save_step() -> ReturningInsert[str]:
    """Save step ``name`` of job ``job_id`` with ``result`` (JSON text), fenced: only while the
    job is RUNNING under the lease ``token``. Returns the name; no row when that lease is gone.

    The job's row is locked ``FOR SHARE`` until the transaction ends, so a rescue or a new
    claim (which update the row) cannot slip between the lease check and the insert: a step is
    saved only by the worker holding the job at that moment. ``completed_at`` is the clock's
    time, not the transaction's: an atomic job's steps share one transaction.
    """
    holder = (
        select(
            Job.id,
            bindparam("name", type_=Text),
            cast(bindparam("result", type_=Text), JSON),
            func.clock_timestamp(),
        )
        .where(
            Job.id == bindparam("job_id", type_=BigInteger),
            Job.state == JobState.RUNNING.value,
            Job.lease_token == bindparam("token", type_=Uuid),
        )
        .with_for_update(read=True)
    )
    return (
        insert(JobStep)
        .from_select([JobStep.job_id, JobStep.name, JobStep.result, JobStep.completed_at], holder)
        .on_conflict_do_nothing(index_elements=[JobStep.job_id, JobStep.name])
        .returning(JobStep.name)
    )
