"""The two tables the queue runs on, and the rows that belong to one job.

``pgqueue_jobs`` (``Job``) is the durable record: a job row lives for the job's whole life and
keeps its history until pruned. ``pgqueue_message_queue`` (``MessageQueue``) holds the ready
tickets: a ticket row exists only while one attempt of a job is waiting to be claimed, and
claiming deletes it, so the claim scans a table that holds waiting work only, however much
history accumulates. A job's saved durable steps (``JobStep``) are deleted with it.
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
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Text,
    Uuid,
    func,
    text,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship, synonym
from sqlalchemy.orm.exc import DetachedInstanceError

from pgqueue.models._base import STATE_CHECK, Base, StoredJSON, job_state_type
from pgqueue.states import JobState


def _loaded_steps(job: Job) -> list[JobStep]:
    """``Job.steps``: the loaded steps, loaded now in the job's session, or, for a job detached
    without them, SQLAlchemy's ``DetachedInstanceError`` with a message that says which job and
    where its steps are read."""
    state = sa_inspect(job)
    if state.detached and "_steps" in state.unloaded:
        job_id = state.identity[0] if state.identity else "(unsaved)"
        raise DetachedInstanceError(
            f"job {job_id}'s steps were not loaded with it and it is detached from its session: "
            f"read them with pgq.get_job({job_id}).steps (get_job and aget_job load them, "
            "list_jobs does not)"
        )
    return job._steps


# Which rows hold their unique key: every job that has not ended, a WAITING one too (a
# workflow member or dependent job holds its key from its enqueue on, so its release to QUEUED
# never meets another holder). Written out, not built from bound values: an ``ON CONFLICT``
# naming this index must repeat the predicate, and a generic plan of a prepared statement
# cannot prove that ``state IN ($1, $2, $3, $4)`` implies it.
UNIQUE_KEY_HELD = "unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying', 'waiting')"

# Which rows the dashboard's ``(queue, state, id)`` and ``(task_name, state, id)`` indexes hold:
# every job but a running one. A claim's update of the job row, which is never heap-only, then
# writes no entry into them, only the primary key's and the lease index's; the running jobs, as
# many as the workers' slots, are listed by the lease index. Written out for the same reason as
# ``UNIQUE_KEY_HELD``: a statement reads these indexes only when its text names this predicate.
LISTED_BY_STATE = "state <> 'running'"


class Job(Base):
    """The durable record of one unit of work."""

    __tablename__ = "pgqueue_jobs"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    """Job id, returned by ``enqueue``."""
    task_name: Mapped[str] = mapped_column(Text)
    """Registered name of the task to run (``module.qualname`` unless named)."""
    queue: Mapped[str] = mapped_column(Text, server_default="default")
    """Queue the job's tickets go to; workers subscribe to queues."""
    args: Mapped[list[Any]] = mapped_column(StoredJSON, server_default=text("'[]'::json"))
    """Positional arguments, stored as ``json`` so the text round-trips exactly. Read as a
    ``codec.UndecodableJSON`` when Python cannot decode them (see ``StoredJSON``)."""
    kwargs: Mapped[dict[str, Any]] = mapped_column(StoredJSON, server_default=text("'{}'::json"))
    """Keyword arguments."""
    state: Mapped[JobState] = mapped_column(job_state_type, server_default=JobState.QUEUED.value)
    """Current state; changed only through the transitions in ``pgqueue.states``."""
    priority: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    """Lower runs first (copied to the ticket)."""
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    """Attempts started so far (incremented by each claim)."""
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="3")
    """After this many failed attempts the job is FAILED for good."""
    run_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    """Earliest time (database clock) the next attempt may start."""
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When the job was enqueued (database clock)."""
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When the latest attempt was claimed."""
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When the job reached a final state."""
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """Last state change."""
    last_error: Mapped[str | None] = mapped_column(Text)
    """Error and traceback of the latest failed attempt (capped in size)."""
    errors: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    """One entry per failed attempt, the last ``sql.common.ERROR_HISTORY`` (10) kept:
    ``{"attempt", "at", "error"}`` (error text capped)."""
    result: Mapped[Any | None] = mapped_column(StoredJSON)
    """The handler's return value (JSON) once SUCCEEDED."""
    lease_owner: Mapped[str | None] = mapped_column(Text)
    """Worker id holding the job while RUNNING."""
    lease_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    """Fencing token, new at every claim; outcome writes must present it."""
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When the lease lapses unless heartbeated; the rescuer re-queues expired jobs."""
    unique_key: Mapped[str | None] = mapped_column(Text)
    """At most one queued/running job per key (see the partial unique index)."""
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Set on a running job by ``cancel_job``; the handler sees it via its context."""
    atomic: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Run inside the claim transaction (the task's ``atomic=True`` at enqueue time)."""
    depends_on: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    """Ids of the jobs this one waited for (``configure(depends_on=...)``); null for most jobs.
    This and ``dependents`` are stored uncompressed (``STORAGE EXTERNAL``, migration
    pgqueue_0024): compressing a large workflow's arrays would cost several times their write."""
    dependents: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    """Ids of WAITING jobs to settle when this one ends. On this row, not in an edge table, so the
    outcome's UPDATE (which waits for an enqueuing dependent's lock on this row, then re-reads
    the row's newest version) returns dependents added concurrently too."""
    trace_context: Mapped[dict[str, Any] | None] = mapped_column(StoredJSON)
    """The enqueuing code's trace context (W3C ``traceparent``/``tracestate``) when tracing is
    enabled, so the job's run joins that trace; null otherwise (migration pgqueue_0007)."""
    awaited: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Someone waits for this job to finish (``wait_for``/``await_job`` set it before waiting):
    only then does the statement that ends it announce it (``sql.common.announced``)."""
    snoozes: Mapped[int] = mapped_column(Integer, server_default="0")
    """Times a handler raised ``Snooze``: each re-scheduled the job without counting an attempt,
    up to the ``max_snoozes`` setting (past it a snooze counts as a failed attempt)."""
    progress: Mapped[float | None] = mapped_column(Float)
    """The fraction (0 to 1) the handler last reported with ``ctx.progress``; null if never."""
    progress_message: Mapped[str | None] = mapped_column(Text)
    """The message reported with ``progress`` (capped in size), if any."""
    progress_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    """When ``progress`` was written (by a heartbeat or with the attempt's outcome)."""
    _steps: Mapped[list[JobStep]] = relationship(
        viewonly=True, order_by=lambda: (JobStep.completed_at, JobStep.name)
    )
    steps: Mapped[list[JobStep]] = synonym("_steps", descriptor=property(_loaded_steps))
    """The job's completed durable steps (``ctx.step``), oldest first; read-only here (a worker
    saves them; deleting the job deletes them). ``get_job``/``aget_job`` load them with the job;
    a job of the caller's open session loads them on first read, as any relationship; on a
    detached job that was read without them (``list_jobs``, a closed session) reading them
    raises ``DetachedInstanceError`` naming the job and ``get_job``."""
    concurrency_key: Mapped[str | None] = mapped_column(Text)
    """Flow control: at most the key's limit of jobs with this key run at once, across all
    workers (``ConcurrencyKey``); null for most jobs."""
    workflow_id: Mapped[int | None] = mapped_column(BigInteger)
    """The workflow (``chain``/``group``/``chord``, ``Workflow``) the job belongs to; null for
    most jobs. No foreign key: a workflow's row outlives its pruned jobs, and a job is never
    moved to another workflow."""
    pending_dependencies: Mapped[int | None] = mapped_column(Integer)
    """A workflow job's count of dependencies that have not ended yet, decremented in the
    transaction that ends each one: the job is settled once, when it reaches 0, so a chord
    callback over n members costs O(n) in all. Null for jobs outside workflows (settled by
    reading all their dependencies' states each time one ends)."""
    workflow_role: Mapped[int | None] = mapped_column(SmallInteger)
    """What a workflow job receives and how it settles (``pgqueue.workflows.roles``): a plain
    member, one taking its parent's result or its parents' results as first argument, the
    workflow's closing marker, or its ``on_failure`` job. Null outside workflows."""

    __table_args__ = (
        CheckConstraint(STATE_CHECK, name="state_valid"),
        CheckConstraint("attempts >= 0", name="attempts_non_negative"),
        CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        # Rescue scans running jobs by lease expiry; partial, so it stays tiny.
        Index(
            "ix_pgqueue_jobs_lease_expires_at",
            "lease_expires_at",
            postgresql_where=text("state = 'running'"),
        ),
        # Pruning and the dashboard walk finished jobs by age.
        Index(
            "ix_pgqueue_jobs_finished_at",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
        ),
        # The dashboard's filters (and its queue list and capped counts): newest jobs of one
        # queue or one task in one state, read in id order however long the history
        # (migration pgqueue_0006); running jobs left out (``LISTED_BY_STATE``, pgqueue_0025).
        Index(
            "ix_pgqueue_jobs_queue_state_id",
            "queue",
            "state",
            "id",
            postgresql_where=text(LISTED_BY_STATE),
        ),
        Index(
            "ix_pgqueue_jobs_task_name_state_id",
            "task_name",
            "state",
            "id",
            postgresql_where=text(LISTED_BY_STATE),
        ),
        # Race-free unique jobs: the index, not a read-then-write, rejects the duplicate.
        Index(
            "uq_pgqueue_jobs_unique_key_active",
            "unique_key",
            unique=True,
            postgresql_where=text(UNIQUE_KEY_HELD),
        ),
        # Whether any job still has a key: maintenance deletes a key's row only when none has
        # (migration pgqueue_0017). Partial, so jobs without a key pay nothing for it.
        Index(
            "ix_pgqueue_jobs_concurrency_key",
            "concurrency_key",
            postgresql_where=text("concurrency_key IS NOT NULL"),
        ),
        # A workflow's jobs: listing them, cancelling those not started. On the workflow id
        # alone, a column no state change touches, so a job's updates never write it.
        Index(
            "ix_pgqueue_jobs_workflow_id",
            "workflow_id",
            postgresql_where=text("workflow_id IS NOT NULL"),
        ),
    )

    def __repr__(self) -> str:
        """``<Job 42 send_receipt queue=default state=failed attempt 3/5>``.

        Never the arguments or the result (they may be large or secret), and only what is
        loaded: a repr never runs SQL, nor fails on a detached or unsaved job.
        """
        loaded = self.__dict__
        state = loaded.get("state")
        attempts, max_attempts = loaded.get("attempts"), loaded.get("max_attempts")
        parts = [
            "Job",
            "(unsaved)" if loaded.get("id") is None else str(loaded["id"]),
            str(loaded.get("task_name", "?")),
            f"queue={loaded.get('queue', '?')}",
            f"state={state.value if isinstance(state, JobState) else state or '?'}",
        ]
        if isinstance(attempts, int) and isinstance(max_attempts, int):
            # A row can hold more attempts than its maximum (edited by hand, or re-run without
            # raising it); never shown as N/M with N > M.
            within = attempts <= max_attempts
            parts.append(
                f"attempt {attempts}/{max_attempts}"
                if within
                else f"attempt {attempts} (max {max_attempts})"
            )
        return f"<{' '.join(parts)}>"


class MessageQueue(Base):
    """A ticket: one runnable attempt of one job, deleted when claimed.

    The primary key is the job id, so a job can never have two tickets at once: a retry, a
    rescue and a manual re-run cannot race each other into a double run.

    No foreign key to ``pgqueue_jobs``: its per-row check would cost more than the ticket insert
    itself. The statements that delete jobs delete their tickets too,
    and the claim only moves jobs that exist and are waiting, so a ticket left without its job
    is deleted by the claim that picks it and runs nothing.
    """

    __tablename__ = "pgqueue_message_queue"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    """The job this ticket runs."""
    queue: Mapped[str] = mapped_column(Text)
    """Copied from the job so the claim never reads ``pgqueue_jobs``."""
    priority: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    """Copied from the job; lower first."""
    run_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    """Not claimable before this (database clock)."""
    atomic: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Copied from the job: atomic tickets are claimed one per open transaction."""
    key_hash: Mapped[int | None] = mapped_column(Integer)
    """A 32-bit hash of the job's concurrency key (``sql.common.key_hash``): keyed tickets are
    claimed per key, within the key's room, through their own partial index, each checked
    against its job's key. A hash, not the key's text: the planner sizes a table it has not
    analyzed by its declared row width, and a text column would change the claim's plans."""
    keyed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """Whether the job has a concurrency key: what the main scan filters on. A boolean compared
    with ``false`` is estimated at half the rows even before the table was analyzed, where
    ``IS NULL`` would be estimated at half a percent and turn the claim's index scan into a
    sequential scan and a sort."""

    __table_args__ = (
        # The claim's WHERE atomic = ? and ORDER BY in one index, with queue included so the scan
        # filters queues without visiting the heap.
        Index(
            "ix_pgqueue_message_queue_claim",
            "atomic",
            "priority",
            "run_at",
            "job_id",
            postgresql_include=["queue"],
        ),
        # The claim's per-key scans: the ready tickets of one key in claim order. Partial, so
        # queues without keys pay nothing for it.
        Index(
            "ix_pgqueue_message_queue_keyed",
            "key_hash",
            "atomic",
            "priority",
            "run_at",
            "job_id",
            postgresql_include=["queue"],
            postgresql_where=text("key_hash IS NOT NULL"),
        ),
    )


# --- durable steps -----------------------------------------------------------------------------


class JobStep(Base):
    """One completed durable step of a job (``ctx.step``): its saved result, which later
    attempts of the job return instead of running the step again.

    The foreign key deletes a job's steps with the job (pruning, ``delete_job``, bulk delete):
    jobs are deleted far less often than they run, and deleting a job without steps costs one
    probe of this table's primary key.
    """

    __tablename__ = "pgqueue_job_steps"

    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(Job.id, ondelete="CASCADE"), primary_key=True
    )
    """The job the step belongs to."""
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    """The step's name, unique per job (``ctx.step(name, ...)``)."""
    result: Mapped[Any] = mapped_column(StoredJSON, nullable=False)
    """The step function's return value (JSON), returned to later attempts."""
    completed_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When the step's result was saved (database clock)."""


# --- durable sleep and signals -----------------------------------------------------------------


class JobSignal(Base):
    """A signal sent to a job (``pgq.signal(job_id, name, payload)``): kept until the job is
    deleted, so a ``ctx.wait_for_signal(name)`` reached after the signal was sent returns it at
    once, and every later run of the handler gets the same payload back.

    One row per job and name: the first signal of a name is kept, a later one of the same name
    is refused (``signal`` returns False). The foreign key deletes a job's signals with the job.
    """

    __tablename__ = "pgqueue_job_signals"

    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(Job.id, ondelete="CASCADE"), primary_key=True
    )
    """The job the signal was sent to."""
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    """The signal's name (``wait_for_signal(name)`` waits for it)."""
    payload: Mapped[Any] = mapped_column(StoredJSON, nullable=False)
    """The JSON payload sent with it (JSON null when none was given)."""
    sent_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    """When the signal was stored (database clock)."""


class JobSuspension(Base):
    """What a job's handler last suspended it for (``ctx.sleep``, ``ctx.wait_for_signal``): the
    signal awaited (null for a sleep) and the wake time its ticket was given.

    Written by the ``suspend`` outcome, in the same statement that moves the job back to
    QUEUED, with ``suspended_at`` equal to the job's ``updated_at``: the row describes the job
    only while that still holds (any later change of the job's state moves ``updated_at``), so
    it is never deleted apart from its job. A signal reads it to know whether to wake the job;
    ``pgqueue explain`` reads it to say what the job waits for.
    """

    __tablename__ = "pgqueue_job_suspensions"

    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(Job.id, ondelete="CASCADE"), primary_key=True
    )
    """The suspended job."""
    signal: Mapped[str | None] = mapped_column(Text)
    """The signal name the job waits for; null when it sleeps."""
    wake_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    """When the job runs again by itself: the end of its sleep, or its wait's deadline."""
    suspended_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    """When it was suspended: the ``updated_at`` the suspension wrote on the job."""
