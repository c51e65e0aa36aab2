"""The records kept beside the queue: the worker registry (``WorkerRecord``), the audit of
operators' actions (``AuditRecord``), and the partitioned history of finished jobs (``JobHistory``, with
the per-minute counts its move keeps, ``FinishedMinute``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Text,
    Uuid,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from pgqueue.models._base import STATE_CHECK, Base, StoredJSON, job_state_type
from pgqueue.models._jobs import Job
from pgqueue.states import JobState

# --- operators' records (migration pgqueue_0007) ---------------------------------------------


class WorkerRecord(Base):
    """One running worker process, so operators can see who is alive and what each serves.

    Written when the worker starts, refreshed by its heartbeat, deleted when it stops cleanly.
    A worker killed without a clean stop leaves its row; once ``last_seen_at`` is older than the
    stale interval any worker's maintenance deletes it.
    """

    __tablename__ = "pgqueue_workers"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    """The worker id, the value its claims write to ``pgqueue_jobs.lease_owner``."""
    host: Mapped[str] = mapped_column(Text)
    """Host name of the machine it runs on."""
    pid: Mapped[int] = mapped_column(Integer)
    """Its operating-system process id on that host."""
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    """Queues it claims from."""
    concurrency: Mapped[int] = mapped_column(Integer)
    """How many jobs it runs at once."""
    version: Mapped[str] = mapped_column(Text)
    """The pgqueue version it runs."""
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When it started (database clock)."""
    last_seen_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """Its latest heartbeat (database clock)."""
    claim_error: Mapped[str | None] = mapped_column(Text)
    """The error of its latest claim while its claims fail; null while they work."""
    claim_failing_since: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When its claims began to fail (database clock); null while they work."""
    tasks: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    """Names of the tasks it registers (it claims only jobs of these); null for a worker of a
    pgqueue version that did not record them, taken to register every task."""
    pool: Mapped[str | None] = mapped_column(Text)
    """Where it runs sync handlers (``Settings.pool``): ``thread`` or ``process``; null for a
    worker of a pgqueue version that did not record it."""


class AuditRecord(Base):
    """One operator's action, written in the action's transaction: the record exists exactly
    when the action took effect. A bulk action (retry, cancel or delete by filter), or an
    action on one job or one schedule (``admin_records.AuditEntry`` lists them)."""

    __tablename__ = "pgqueue_audit"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    """Record id."""
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    """When the action was taken (database clock)."""
    actor: Mapped[str] = mapped_column(Text)
    """Who took it (the CLI's operating-system user and host, the dashboard's configured
    identity, or what an API caller passes)."""
    source: Mapped[str] = mapped_column(Text)
    """Where it was taken: ``cli``, ``dashboard`` or ``api``."""
    action: Mapped[str] = mapped_column(Text)
    """``retry``, ``cancel``, ``delete``, an action on one job or schedule (``signal``,
    ``reschedule``, ``run_now``, ``set_priority``, ``pause_schedule``, ``resume_schedule``,
    ``run_schedule``), or a queue's or keys' switch (``admin_records.SWITCH_ACTIONS``)."""
    filter: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """What the action was taken on: a bulk action's filter, as given; for one job, schedule,
    queue or key prefix, ``{"job_id": ...}``, ``{"schedule": ...}``, ``{"queue": ...}`` or
    ``{"key_prefix": ...}`` with the values the action wrote."""
    count: Mapped[int] = mapped_column(Integer)
    """How many jobs the action changed (1 for an action on one job, schedule, queue or key
    prefix)."""


# --- finished jobs' history, partitioned by day (migration pgqueue_0013) -----------------------

# Each day of history is one partition, named ``pgqueue_job_history_pYYYYMMDD`` (UTC days), plus
# the DEFAULT partition that catches a finished job whose day has no partition yet.
HISTORY_PARTITION_PREFIX = "pgqueue_job_history_p"
HISTORY_DEFAULT_PARTITION = "pgqueue_job_history_default"


class JobHistory(Base):
    """A finished job moved out of ``pgqueue_jobs`` (the opt-in ``history="partitioned"``
    layout): the same columns as ``Job``, each with the meaning ``Job`` documents, in a table
    partitioned by range of ``finished_at``, one partition per UTC day. Pruning drops a whole
    day's partition instead of deleting its rows, so it leaves no dead tuples, and the hot
    ``pgqueue_jobs`` table keeps only live and recently finished jobs.

    Rows arrive only through the maintenance move (``sql.history.move_finished``) and leave
    only with their partition: nothing updates them. A job's steps are not moved (the foreign
    key deletes them with the job's live row): they only serve the attempts of a live job.
    The primary key must contain the partition key, hence ``(id, finished_at)``; ids are unique
    anyway, since each came from ``pgqueue_jobs``' identity.
    """

    __tablename__ = "pgqueue_job_history"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    """``Job.id``."""
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    """``Job.finished_at``; never null here, and the partition key."""
    task_name: Mapped[str] = mapped_column(Text)
    """``Job.task_name``."""
    queue: Mapped[str] = mapped_column(Text)
    """``Job.queue``."""
    args: Mapped[list[Any]] = mapped_column(StoredJSON)
    """``Job.args``."""
    kwargs: Mapped[dict[str, Any]] = mapped_column(StoredJSON)
    """``Job.kwargs``."""
    state: Mapped[JobState] = mapped_column(job_state_type)
    """``Job.state``: a final state."""
    priority: Mapped[int] = mapped_column(SmallInteger)
    """``Job.priority``."""
    attempts: Mapped[int] = mapped_column(Integer)
    """``Job.attempts``."""
    max_attempts: Mapped[int] = mapped_column(Integer)
    """``Job.max_attempts``."""
    run_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    """``Job.run_at``."""
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    """``Job.created_at``."""
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """``Job.started_at``."""
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    """``Job.updated_at``."""
    last_error: Mapped[str | None] = mapped_column(Text)
    """``Job.last_error``."""
    errors: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    """``Job.errors``."""
    result: Mapped[Any | None] = mapped_column(StoredJSON)
    """``Job.result``."""
    lease_owner: Mapped[str | None] = mapped_column(Text)
    """``Job.lease_owner``."""
    lease_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    """``Job.lease_token``."""
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """``Job.lease_expires_at``."""
    unique_key: Mapped[str | None] = mapped_column(Text)
    """``Job.unique_key`` (no unique index here: a finished job holds no key)."""
    cancel_requested: Mapped[bool] = mapped_column(Boolean)
    """``Job.cancel_requested``."""
    atomic: Mapped[bool] = mapped_column(Boolean)
    """``Job.atomic``."""
    depends_on: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    """``Job.depends_on``."""
    dependents: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    """``Job.dependents``."""
    trace_context: Mapped[dict[str, Any] | None] = mapped_column(StoredJSON)
    """``Job.trace_context``."""
    awaited: Mapped[bool] = mapped_column(Boolean)
    """``Job.awaited``."""
    snoozes: Mapped[int] = mapped_column(Integer)
    """``Job.snoozes``."""
    progress: Mapped[float | None] = mapped_column(Float)
    """``Job.progress``."""
    progress_message: Mapped[str | None] = mapped_column(Text)
    """``Job.progress_message``."""
    progress_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """``Job.progress_at``."""
    concurrency_key: Mapped[str | None] = mapped_column(Text)
    """``Job.concurrency_key``."""
    workflow_id: Mapped[int | None] = mapped_column(BigInteger)
    """``Job.workflow_id``."""
    pending_dependencies: Mapped[int | None] = mapped_column(Integer)
    """``Job.pending_dependencies``."""
    workflow_role: Mapped[int | None] = mapped_column(SmallInteger)
    """``Job.workflow_role``."""

    __table_args__ = (
        CheckConstraint(STATE_CHECK, name="state_valid"),
        # The dashboard's filtered pages, as on ``pgqueue_jobs`` (partitioned indexes: one
        # per partition, dropped with it).
        Index("ix_pgqueue_job_history_queue_state_id", "queue", "state", "id"),
        Index("ix_pgqueue_job_history_task_name_state_id", "task_name", "state", "id"),
        # The dashboard's recent throughput reads the last minutes of today's partition.
        Index("ix_pgqueue_job_history_finished_at", "finished_at"),
        {"postgresql_partition_by": "RANGE (finished_at)"},
    )


class FinishedMinute(Base):
    """How many jobs of a queue finished in a state during one minute, counted as the
    partitioned history's move takes them out of ``pgqueue_jobs`` (in the same statement, so a
    job is counted here exactly when it left the live table). The dashboard's throughput chart
    reads these few rows for the moved part of the hour instead of the history's rows; jobs
    written into the history some other way are not counted. Rows older than the history's
    retention are deleted by ``pgqueue history maintain``."""

    __tablename__ = "pgqueue_finished_minutes"

    minute: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    """The start of the minute (whole minutes since the Unix epoch) the jobs finished in."""
    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    """The jobs' queue."""
    state: Mapped[JobState] = mapped_column(job_state_type, primary_key=True)
    """Their final state."""
    jobs: Mapped[int] = mapped_column(BigInteger)
    """How many."""

    __table_args__ = (
        CheckConstraint(STATE_CHECK, name="state_valid"),
        CheckConstraint("jobs >= 1", name="jobs_positive"),
    )


# The columns both tables share, in ``Job``'s order: what the move copies and what a read over
# both tables selects.
JOB_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in Job.__table__.columns)
