"""The two tables: ``pgqueue_jobs`` (durable history) and ``pgqueue_message_queue`` (ready tickets).

A job row lives for the job's whole life and keeps its history until pruned. A ticket row exists
only while one attempt of a job is waiting to be claimed; claiming deletes it. The claim
therefore scans a table that holds waiting work only, however much history accumulates.

Both models use their own ``MetaData`` with a naming convention so constraint names are
deterministic and the shipped migrations match the models exactly (a test compares them).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Text,
    TypeDecorator,
    Uuid,
    cast,
    func,
    text,
    type_coerce,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, synonym
from sqlalchemy.orm.exc import DetachedInstanceError
from sqlalchemy.sql.elements import ColumnElement

from pgqueue import validation
from pgqueue.states import JobState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

TABLE_PREFIX = "pgqueue_"

# Values of JobState stored as text with a CHECK constraint rather than a native enum type: new
# states can be added by a migration without ALTER TYPE, and text compares as fast here.
job_state_type = Enum(
    JobState,
    name="job_state",
    native_enum=False,
    create_constraint=False,  # STATE_CHECK instead
    length=16,
    values_callable=lambda states: [s.value for s in states],
    validate_strings=True,
)

# The states as one array constant, not the IN list of seven that the Enum would generate:
# PostgreSQL prepares a table's CHECK expressions again for every statement that writes it,
# and an IN list costs more than twice the array form there. A unit test keeps it equal to
# JobState.
STATE_CHECK = (
    "state::text = ANY ('{queued,waiting,running,retrying,succeeded,failed,cancelled}'::text[])"
)


class StoredJSON(TypeDecorator[Any]):
    """``json`` that reading a job never fails on: selected as its text and decoded here, one
    value at a time, so a value Python cannot decode (nesting deeper than the recursion limit,
    an integer longer than ``sys.get_int_max_str_digits()``, written by another client or by
    hand) reads as a ``validation.UndecodableJSON`` instead of raising. The driver would
    otherwise decode it during the fetch, with the engine's loader (a host's own engine's, under
    Flask), and fail every row of the answer with it. Binds, and the column type the migrations
    see, are plain ``JSON``'s."""

    impl = JSON
    cache_ok = True
    # As JSON's (``none_as_null=False``): the ORM binds a Python None as JSON null.
    should_evaluate_none = True

    def column_expression(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        # The coercion keeps this type on the fetched column, so process_result_value decodes.
        return type_coerce(cast(column, Text), self)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else validation.load_stored_json(value)


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


class Base(DeclarativeBase):
    """Declarative base bound to pgqueue's own MetaData (never the host application's)."""

    metadata = metadata


# Which rows hold their unique key. Written out, not built from bound values: an
# ``ON CONFLICT`` naming this index must repeat the predicate, and a generic plan of a prepared
# statement cannot prove that ``state IN ($1, $2, $3)`` implies it.
UNIQUE_KEY_HELD = "unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying')"

# A concurrency key's 32-bit hash, as ``sql.common.key_hash`` renders it for a key row: the
# expression of the index that leads from tickets' ``key_hash`` to key rows.
KEY_HASH_OF_KEY = "(CAST(CAST('x' || substr(md5(key), 1, 8) AS BIT(32)) AS INTEGER))"


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
    ``validation.UndecodableJSON`` when Python cannot decode them (see ``StoredJSON``)."""
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
    """Ids of the jobs this one waited for (``configure(depends_on=...)``); null for most jobs."""
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
        # (migration pgqueue_0006).
        Index("ix_pgqueue_jobs_queue_state_id", "queue", "state", "id"),
        Index("ix_pgqueue_jobs_task_name_state_id", "task_name", "state", "id"),
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


# --- scheduling and queue control (migration pgqueue_0002) -----------------------------------


class QueueControl(Base):
    """Per-queue switches: paused, and a concurrency limit across all workers.

    A queue without a row is running and unlimited, so the common case costs the claim nothing
    but an anti-join against an empty set.
    """

    __tablename__ = "pgqueue_queues"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    """Queue name."""
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    """While true no worker claims this queue's tickets (running jobs finish normally)."""
    concurrency_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many jobs of the queue RUNNING at once, across all workers; null = no limit."""
    running: Mapped[int] = mapped_column(Integer, server_default="0")
    """Jobs of the queue counted as RUNNING, maintained only while a limit is set: the claim adds
    what it claims and every exit from RUNNING subtracts, in the same statements. A counter on
    the locked row, not a count(*), because a claim waiting for this row's lock sees the row's
    newest version but only an older snapshot of ``pgqueue_jobs``."""
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """Last change of the switches."""
    max_depth: Mapped[int | None] = mapped_column(Integer)
    """Bounded queue: an enqueue that would take the queue above this many waiting jobs
    (queued, retrying or waiting on dependencies) raises ``QueueFull``; null = unbounded."""
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many jobs of the queue start in any window of ``rate_per`` seconds, across
    all workers; null = no rate limit."""
    rate_per: Mapped[float | None] = mapped_column(Float)
    """The rate limit's window in seconds."""
    recent_starts: Mapped[list[dt.datetime] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    """The latest starts of the queue's jobs (at most ``rate_limit``), written by the claim on
    this locked row: the sliding window the rate limit is checked against."""

    __table_args__ = (
        CheckConstraint(
            "concurrency_limit IS NULL OR concurrency_limit >= 1", name="limit_positive"
        ),
        CheckConstraint("max_depth IS NULL OR max_depth >= 1", name="max_depth_positive"),
        CheckConstraint(
            "(rate_limit IS NULL AND rate_per IS NULL) OR (rate_limit >= 1 AND rate_per > 0)",
            name="rate_valid",
        ),
    )


# --- flow control: per-key concurrency and rate limits (migration pgqueue_0012) -------------


class ConcurrencyKey(Base):
    """One concurrency key: its RUNNING count and recent starts, on one row the claim locks.

    Written by the enqueue of the key's first job; an enqueue holds a ``FOR KEY SHARE`` lock on
    it until its transaction ends (which no claim or outcome waits for). The claim reaches the
    rows of the keys its ready tickets carry (through the hash index), never the others, and
    maintenance deletes the row of a key no job has any more (``sql.maintenance``).
    """

    __tablename__ = "pgqueue_concurrency_keys"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    """The key (``concurrency_key`` of its jobs)."""
    key_limit: Mapped[int | None] = mapped_column(Integer)
    """The limit the key's task declared (``key_limit=``), written by enqueue; a
    ``KeyLimit`` override wins over it; null = no limit."""
    running: Mapped[int] = mapped_column(Integer, server_default="0")
    """The key's jobs counted as RUNNING: the claim adds what it claims and every exit from
    RUNNING subtracts, in the same statements (a counter on the locked row, for the reason
    ``QueueControl.running`` gives)."""
    recent_starts: Mapped[list[dt.datetime] | None] = mapped_column(ARRAY(DateTime(timezone=True)))
    """The key's latest starts, kept while a rate limit applies to it."""

    __table_args__ = (
        CheckConstraint("key_limit IS NULL OR key_limit >= 1", name="limit_positive"),
        # From a ready ticket's ``key_hash`` to the key rows of that hash (migration
        # pgqueue_0017). The expression must stay ``sql.common.key_hash`` as it renders.
        Index("ix_pgqueue_concurrency_keys_key_hash", text(KEY_HASH_OF_KEY)),
    )


class KeyLimit(Base):
    """An operator's override for every key starting with ``prefix`` (``set_key_limit``,
    ``set_rate_limit(key=...)``); the longest matching prefix wins, each key counted alone."""

    __tablename__ = "pgqueue_key_limits"

    prefix: Mapped[str] = mapped_column(Text, primary_key=True)
    """A key, or the start of keys (``"account:"``)."""
    key_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many RUNNING jobs per matching key; null = the task's ``key_limit``."""
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    """At most this many starts per matching key in any window of ``rate_per`` seconds."""
    rate_per: Mapped[float | None] = mapped_column(Float)
    """The rate limit's window in seconds."""
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """Last change."""

    __table_args__ = (
        CheckConstraint("key_limit IS NULL OR key_limit >= 1", name="limit_positive"),
        CheckConstraint(
            "(rate_limit IS NULL AND rate_per IS NULL) OR (rate_limit >= 1 AND rate_per > 0)",
            name="rate_valid",
        ),
    )


class PeriodicTick(Base):
    """One enqueued tick of a periodic schedule. The primary key makes each tick happen once,
    however many schedulers race for it (insert ``ON CONFLICT DO NOTHING``)."""

    __tablename__ = "pgqueue_periodic_ticks"

    schedule_name: Mapped[str] = mapped_column(Text, primary_key=True)
    """The schedule's name (``periodic(name=...)``, default the task name)."""
    scheduled_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    """The cron instant this tick stands for (UTC), not when it was enqueued."""
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    """The job enqueued for the tick (no foreign key: pruning jobs keeps the tick history)."""
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When a scheduler enqueued it (database clock)."""


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


class AuditRecord(Base):
    """One bulk action (retry, cancel or delete by filter), written in the action's transaction:
    the record exists exactly when the action took effect."""

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
    """``retry``, ``cancel`` or ``delete``."""
    filter: Mapped[dict[str, Any]] = mapped_column(JSONB)
    """The filter that chose the jobs, as given."""
    count: Mapped[int] = mapped_column(Integer)
    """How many jobs the action changed."""


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


# --- atomic runs ------------------------------------------------------------------------------


class AtomicRun(Base):
    """One started run of an atomic job's handler, committed on a connection of its own before
    the handler runs, and deleted by the run's own transaction when it commits.

    The run's claim (its ``attempts + 1``) commits or rolls back with the handler's
    transaction, so a transaction lost for any reason leaves no trace on the job: this row is
    that trace. A row whose ``attempt`` is above the job's attempt count is a run whose
    transaction was lost; it is counted as a failed attempt before the handler may run again
    (``sql.atomic_runs``), so an atomic handler runs at most ``max_attempts`` times whatever
    happens to its transactions and connections.
    """

    __tablename__ = "pgqueue_atomic_runs"

    job_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(Job.id, ondelete="CASCADE"), primary_key=True
    )
    """The job whose handler ran."""
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    """The attempt number the run's claim gave the job."""
    worker: Mapped[str] = mapped_column(Text)
    """The worker that ran it (named in the lost attempt's error)."""
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    """When the run was recorded, just before its handler started (database clock)."""


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
