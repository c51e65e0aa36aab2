"""Every statement pgqueue runs, built with SQLAlchemy constructs; pure (no I/O here).

Each builder returns an executable statement whose bind parameters are documented in its
docstring; ``repository.py`` runs them. Batched statements take parallel arrays and ``unnest``
them, so a batch of any size is one round trip and one cached statement.

State changes follow ``pgqueue.states``: each transition is an ``UPDATE`` guarded by the
transition's source states (and the lease token when the worker holding the job writes), so a
worker whose lease was lost updates 0 rows instead of overwriting someone else's outcome.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Delete,
    Float,
    Integer,
    Select,
    SmallInteger,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.models import Job, MessageQueue
from pgqueue.states import (
    CANCEL,
    CANCELLED,
    CLAIM,
    COMPLETE,
    FAIL,
    RELEASE,
    RERUN,
    RESCUE,
    RESCUE_FAIL,
    RETRY,
    JobState,
    Transition,
)

NOTIFY_CHANNEL: Final = "pgqueue"

_ONE_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")
JOB_TABLE = Job.__table__
TICKET_TABLE = MessageQueue.__table__


def _seconds(value: ColumnElement[Any]) -> ColumnElement[Any]:
    return value * _ONE_SECOND


def _array(name: str, item_type: Any) -> ColumnElement[Any]:
    return bindparam(name, type_=ARRAY(item_type))


def _sources(transition: Transition) -> ColumnElement[bool]:
    return Job.state.in_([s.value for s in sorted(transition.sources)])


def _append_error(attempt: Any, error: ColumnElement[Any]) -> ColumnElement[Any]:
    """``errors || [{"attempt", "at", "error"}]``: the per-attempt error history."""
    entry = func.jsonb_build_array(
        func.jsonb_build_object("attempt", attempt, "at", func.now(), "error", error)
    )
    return Job.errors.op("||")(entry)


_CLEAR_LEASE: Final[dict[str, Any]] = {
    "lease_owner": null(),
    "lease_token": null(),
    "lease_expires_at": null(),
}

# Columns a worker needs to run a claimed job.
CLAIMED_COLUMNS: Final = (
    Job.id,
    Job.task_name,
    Job.queue,
    Job.args,
    Job.kwargs,
    Job.attempts,
    Job.max_attempts,
    Job.priority,
    Job.lease_token,
    Job.atomic,
    Job.cancel_requested,
)


# --- enqueue -------------------------------------------------------------------------------


@cache
def insert_jobs(with_unique_keys: bool) -> Select[Any]:
    """Insert N jobs and their tickets in one statement; returns ``(id, unique_key)`` rows.

    Binds parallel arrays: ``task_names``, ``queues``, ``args`` and ``kwargs`` (JSON text),
    ``priorities``, ``max_attempts``, ``delays`` (seconds from now(), may be null),
    ``run_ats`` (absolute, may be null), ``unique_keys`` (may be null), ``atomics``.
    Ids come back in input order (ordered by ordinality, assigned by the identity in that
    order). With unique keys, a row whose key is already held by an active job is skipped
    (``ON CONFLICT DO NOTHING`` on the partial unique index) and gets no ticket.
    """
    rows = (
        func.unnest(
            _array("task_names", Text),
            _array("queues", Text),
            _array("args", Text),
            _array("kwargs", Text),
            _array("priorities", SmallInteger),
            _array("max_attempts", Integer),
            _array("delays", Float),
            _array("run_ats", Text),
            _array("unique_keys", Text),
            _array("atomics", Boolean),
        )
        .table_valued(
            "task_name",
            "queue",
            "args",
            "kwargs",
            "priority",
            "max_attempts",
            "delay",
            "run_at",
            "unique_key",
            "atomic",
            with_ordinality="ord",
        )
        .render_derived(name="r")
    )
    run_at = func.coalesce(
        cast(rows.c.run_at, Job.run_at.type),
        func.now() + _seconds(func.coalesce(rows.c.delay, 0.0)),
    )
    source = select(
        rows.c.task_name,
        rows.c.queue,
        cast(rows.c.args, JSON),
        cast(rows.c.kwargs, JSON),
        rows.c.priority,
        rows.c.max_attempts,
        run_at,
        rows.c.unique_key,
        rows.c.atomic,
    ).order_by(rows.c.ord)
    columns = [
        "task_name",
        "queue",
        "args",
        "kwargs",
        "priority",
        "max_attempts",
        "run_at",
        "unique_key",
        "atomic",
    ]
    stmt = pg_insert(Job).from_select(columns, source)
    if with_unique_keys:
        stmt = stmt.on_conflict_do_nothing(
            index_elements=[Job.unique_key],
            index_where=and_(
                Job.unique_key.is_not(None),
                Job.state.in_(["queued", "running", "retrying"]),
            ),
        )
    jobs = stmt.returning(
        Job.id, Job.queue, Job.priority, Job.run_at, Job.unique_key, Job.atomic
    ).cte("new_jobs")
    tickets = (
        insert(MessageQueue)
        .from_select(
            ["job_id", "queue", "priority", "run_at", "atomic"],
            select(jobs.c.id, jobs.c.queue, jobs.c.priority, jobs.c.run_at, jobs.c.atomic),
        )
        .cte("new_tickets")
    )
    # Referencing the ticket CTE is not needed for it to run (data-modifying CTEs always run),
    # but keeping it in the FROM list documents the dependency and keeps SQLAlchemy rendering it.
    return select(jobs.c.id, jobs.c.unique_key).add_cte(tickets).order_by(jobs.c.id)


def active_job_ids_by_unique_key() -> Select[int, str | None]:
    """Ids of active jobs holding the given ``unique_keys`` (array)."""
    return select(Job.id, Job.unique_key).where(
        Job.unique_key == func.any(_array("unique_keys", Text)),
        Job.state.in_(["queued", "running", "retrying"]),
    )


# --- claim ---------------------------------------------------------------------------------


@cache
def claim(*, atomic: bool, filter_queues: bool) -> ReturningUpdate[Any]:
    """Claim up to ``limit`` ready tickets: lock them (SKIP LOCKED), delete them, and move their
    jobs to RUNNING with a fresh lease, in one statement.

    Binds: ``limit``, ``worker`` (lease owner id), ``lease_seconds`` (default lease),
    ``task_leases`` (JSON object task name -> lease seconds, for tasks with their own lease),
    and ``queues`` (array) when ``filter_queues``. Atomic claims (one per open transaction)
    set no lease expiry: if the transaction dies the claim itself rolls back.
    """
    picked = (
        select(MessageQueue.job_id)
        .where(
            MessageQueue.atomic == (true() if atomic else false()),
            MessageQueue.run_at <= func.now(),
        )
        .order_by(MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    if filter_queues:
        picked = picked.where(MessageQueue.queue == func.any(_array("queues", Text)))
    picked_cte = picked.cte("picked")
    deleted = (
        delete(MessageQueue)
        .where(MessageQueue.job_id == picked_cte.c.job_id)
        .returning(MessageQueue.job_id)
        .cte("claimed")
    )
    task_lease = cast(
        func.jsonb_extract_path_text(bindparam("task_leases", type_=JSONB), Job.task_name), Float
    )
    lease_expiry: ColumnElement[Any] = (
        null()
        if atomic
        else func.now()
        + _seconds(func.coalesce(task_lease, bindparam("lease_seconds", type_=Float)))
    )
    return (
        update(Job)
        .where(Job.id == deleted.c.job_id, _sources(CLAIM))
        .values(
            state=CLAIM.target,
            attempts=Job.attempts + 1,
            started_at=func.now(),
            updated_at=func.now(),
            lease_owner=bindparam("worker", type_=Text),
            lease_token=func.gen_random_uuid(),
            lease_expires_at=lease_expiry,
        )
        .returning(*CLAIMED_COLUMNS)
    )


# --- outcomes (batched; guarded by the lease token) ------------------------------------------


def _outcome_rows(*extra: tuple[str, Any]) -> Any:
    names = ["id", "token", *(n for n, _ in extra)]
    arrays = [
        _array("ids", BigInteger),
        _array("tokens", Uuid),
        *(_array(n + "s", t) for n, t in extra),
    ]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="v")


def _leased(transition: Transition, rows: Any) -> ColumnElement[bool]:
    return and_(Job.id == rows.c.id, _sources(transition), Job.lease_token == rows.c.token)


@cache
def complete() -> ReturningUpdate[int]:
    """RUNNING -> SUCCEEDED for many jobs. Binds ``ids``, ``tokens``, ``results`` (JSON text).

    Returns the ids actually updated; a missing id means that worker's lease was lost.
    """
    rows = _outcome_rows(("result", Text))
    return (
        update(Job)
        .where(_leased(COMPLETE, rows))
        .values(
            state=COMPLETE.target,
            result=cast(rows.c.result, JSON),
            finished_at=func.now(),
            updated_at=func.now(),
            **_CLEAR_LEASE,
        )
        .returning(Job.id)
    )


@cache
def retry() -> Select[int]:
    """RUNNING -> RETRYING for many jobs, each with a new ticket at ``now() + delay``.

    Binds ``ids``, ``tokens``, ``delays`` (seconds), ``errors`` (text). Returns updated ids.
    """
    rows = _outcome_rows(("delay", Float), ("error", Text))
    updated = (
        update(Job)
        .where(_leased(RETRY, rows))
        .values(
            state=RETRY.target,
            run_at=func.now() + _seconds(rows.c.delay),
            updated_at=func.now(),
            last_error=rows.c.error,
            errors=_append_error(Job.attempts, rows.c.error),
            **_CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("retried")
    )
    return _select_ids_with_tickets(updated)


def _select_ids_with_tickets(updated: Any) -> Select[int]:
    tickets = (
        insert(MessageQueue)
        .from_select(
            ["job_id", "queue", "priority", "run_at", "atomic"],
            select(
                updated.c.id,
                updated.c.queue,
                updated.c.priority,
                updated.c.run_at,
                updated.c.atomic,
            ),
        )
        .cte("requeued")
    )
    return select(updated.c.id).add_cte(tickets)


@cache
def fail() -> ReturningUpdate[int]:
    """RUNNING -> FAILED for many jobs. Binds ``ids``, ``tokens``, ``errors``."""
    rows = _outcome_rows(("error", Text))
    return (
        update(Job)
        .where(_leased(FAIL, rows))
        .values(
            state=FAIL.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=rows.c.error,
            errors=_append_error(Job.attempts, rows.c.error),
            **_CLEAR_LEASE,
        )
        .returning(Job.id)
    )


@cache
def mark_cancelled() -> ReturningUpdate[int]:
    """RUNNING -> CANCELLED for jobs whose handler stopped on a cancel request.

    Binds ``ids``, ``tokens``, ``errors`` (the reason)."""
    rows = _outcome_rows(("error", Text))
    return (
        update(Job)
        .where(_leased(CANCELLED, rows))
        .values(
            state=CANCELLED.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=rows.c.error,
            **_CLEAR_LEASE,
        )
        .returning(Job.id)
    )


@cache
def release() -> Select[int]:
    """RUNNING -> QUEUED at shutdown, ticket at now(); the interrupted attempt is not counted.

    Binds ``ids``, ``tokens``."""
    rows = _outcome_rows()
    updated = (
        update(Job)
        .where(_leased(RELEASE, rows))
        .values(
            state=RELEASE.target,
            attempts=Job.attempts - 1,
            run_at=func.now(),
            updated_at=func.now(),
            **_CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("released")
    )
    return _select_ids_with_tickets(updated)


@cache
def heartbeat() -> ReturningUpdate[int, bool]:
    """Extend the leases of running jobs. Binds ``ids``, ``tokens``, ``lease_secondss``.

    Returns ``(id, cancel_requested)`` for each lease still held, so cancel requests reach the
    worker within one heartbeat.
    """
    rows = _outcome_rows(("lease_seconds", Float))
    return (
        update(Job)
        .where(Job.id == rows.c.id, Job.state == JobState.RUNNING, Job.lease_token == rows.c.token)
        .values(lease_expires_at=func.now() + _seconds(rows.c.lease_seconds))
        .returning(Job.id, Job.cancel_requested)
    )


# --- maintenance ---------------------------------------------------------------------------


@cache
def rescue_expired() -> Select[int, str]:
    """Re-queue (``rescue``) or fail for good (``rescue_fail``) up to ``limit`` jobs whose lease
    expired by the database clock; rescued jobs get a ticket for now. A job whose cancellation
    was requested ends CANCELLED instead. Binds ``lock_key``, ``limit``, ``error``.
    Returns ``(id, new state)``; nothing when another session holds the maintenance lock.
    """
    # The advisory lock (held to the end of this one statement) elects a single rescuer per
    # database at a time; SKIP LOCKED would keep concurrent rescuers correct anyway.
    leader = select(
        func.pg_try_advisory_xact_lock(bindparam("lock_key", type_=BigInteger))
    ).scalar_subquery()
    expired = (
        select(Job.id)
        .where(leader, Job.state == JobState.RUNNING, Job.lease_expires_at < func.now())
        .order_by(Job.lease_expires_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    exhausted = Job.attempts >= Job.max_attempts
    new_state = case(
        (Job.cancel_requested, literal(JobState.CANCELLED.value)),
        (exhausted, literal(RESCUE_FAIL.target.value)),
        else_=literal(RESCUE.target.value),
    )
    error = bindparam("error", type_=Text)
    goes_final = or_(Job.cancel_requested, exhausted)
    updated = (
        update(Job)
        .where(Job.id == expired.c.id, _sources(RESCUE))
        .values(
            state=new_state,
            run_at=case((goes_final, Job.run_at), else_=func.now()),
            finished_at=case((goes_final, func.now()), else_=null()),
            updated_at=func.now(),
            last_error=error,
            errors=_append_error(Job.attempts, error),
            **_CLEAR_LEASE,
        )
        .returning(Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("rescued")
    )
    tickets = (
        insert(MessageQueue)
        .from_select(
            ["job_id", "queue", "priority", "run_at", "atomic"],
            select(
                updated.c.id,
                updated.c.queue,
                updated.c.priority,
                updated.c.run_at,
                updated.c.atomic,
            ).where(updated.c.state == RESCUE.target.value),
        )
        .cte("rescue_tickets")
    )
    return select(updated.c.id, updated.c.state).add_cte(tickets)


@cache
def prune_finished() -> Delete:
    """Delete up to ``limit`` finished jobs older than their retention.

    Binds ``succeeded_before``/``failed_before`` (seconds of age), ``limit``."""
    old = (
        select(Job.id)
        .where(
            Job.finished_at.is_not(None),
            or_(
                and_(
                    Job.state == JobState.SUCCEEDED,
                    Job.finished_at
                    < func.now() - _seconds(bindparam("succeeded_before", type_=Float)),
                ),
                and_(
                    Job.state.in_([JobState.FAILED.value, JobState.CANCELLED.value]),
                    Job.finished_at
                    < func.now() - _seconds(bindparam("failed_before", type_=Float)),
                ),
            ),
        )
        .order_by(Job.finished_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return delete(Job).where(Job.id.in_(old))


def try_maintenance_lock() -> Select[bool]:
    """Transaction-scoped advisory lock electing one maintenance leader per database."""
    return select(func.pg_try_advisory_xact_lock(bindparam("key", type_=BigInteger)))


# --- manual control ------------------------------------------------------------------------


@cache
def rerun() -> Select[int]:
    """FAILED/CANCELLED -> QUEUED with a ticket for now (``retry_job``). Binds ``job_id``."""
    updated = (
        update(Job)
        .where(Job.id == bindparam("job_id", type_=BigInteger), _sources(RERUN))
        .values(
            state=RERUN.target,
            run_at=func.now(),
            finished_at=null(),
            updated_at=func.now(),
            cancel_requested=False,
            **_CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("rerun")
    )
    return _select_ids_with_tickets(updated)


@cache
def cancel_waiting() -> Select[int]:
    """QUEUED/RETRYING -> CANCELLED, deleting the ticket. Binds ``job_id``, ``reason``."""
    gone = (
        delete(MessageQueue)
        .where(MessageQueue.job_id == bindparam("job_id", type_=BigInteger))
        .returning(MessageQueue.job_id)
        .cte("gone")
    )
    updated = (
        update(Job)
        .where(Job.id == gone.c.job_id, _sources(CANCEL))
        .values(
            state=CANCEL.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=bindparam("reason", type_=Text),
        )
        .returning(Job.id)
        .cte("cancelled")
    )
    return select(updated.c.id)


@cache
def request_cancel_running() -> ReturningUpdate[int]:
    """Flag a RUNNING job for cancellation; its worker sees it at the next heartbeat."""
    return (
        update(Job)
        .where(Job.id == bindparam("job_id", type_=BigInteger), Job.state == JobState.RUNNING)
        .values(cancel_requested=True, updated_at=func.now())
        .returning(Job.id)
    )


# --- reads ---------------------------------------------------------------------------------


def get_job() -> Select[Job]:
    """One job by ``job_id``."""
    return select(Job).where(Job.id == bindparam("job_id", type_=BigInteger))


def job_state_counts() -> Select[str, JobState, int]:
    """``(queue, state, count)`` over all jobs."""
    return select(Job.queue, Job.state, func.count()).group_by(Job.queue, Job.state)


def ready_ticket_exists(filter_queues: bool) -> Select[bool]:
    """Whether any ticket is claimable now (for ``drain``). Binds ``queues`` when filtering."""
    inner = select(literal(1)).where(MessageQueue.run_at <= func.now())
    if filter_queues:
        inner = inner.where(MessageQueue.queue == func.any(_array("queues", Text)))
    return select(inner.exists())


def next_ticket_run_at(filter_queues: bool) -> Select[Any]:
    """Earliest ``run_at`` among waiting tickets (None when there are none)."""
    stmt = select(func.min(MessageQueue.run_at))
    if filter_queues:
        stmt = stmt.where(MessageQueue.queue == func.any(_array("queues", Text)))
    return stmt


def active_job_exists(filter_queues: bool) -> Select[bool]:
    """Whether any job is waiting or running (used by ``drain`` to wait for in-flight work)."""
    inner = select(literal(1)).where(Job.state.in_(["queued", "retrying", "running"]))
    if filter_queues:
        inner = inner.where(Job.queue == func.any(_array("queues", Text)))
    return select(inner.exists())


def notify(queue: str) -> Any:
    """``pg_notify`` on pgqueue's channel (used where no ticket insert fires the trigger)."""
    return select(func.pg_notify(NOTIFY_CHANNEL, queue))


def set_local_statement_timeout() -> Any:
    """``SET LOCAL statement_timeout`` for one pgqueue transaction (binds ``ms``)."""
    return select(
        func.set_config("statement_timeout", cast(bindparam("ms", type_=Integer), Text), True)
    )


# --- dashboard (pgqueue.contrib.flask.dashboard) ---------------------------------------------
# Read-mostly statements for the web dashboard: paged job lists, the oldest waiting ticket per
# queue, finished jobs per minute, and deleting one job. Kept apart from the worker's hot path.


@cache
def list_jobs(*, by_queue: bool, by_state: bool, by_task: bool, cursor: str | None) -> Select[Job]:
    """One page of jobs, newest first, optionally filtered.

    Binds ``limit``; ``queue``, ``state``, ``task_name`` for the enabled filters; ``cursor`` (a
    job id) when ``cursor`` is ``"before"`` (older jobs: ``id < cursor``, newest first) or
    ``"after"`` (newer jobs: ``id > cursor``, oldest first so the page nearest the cursor comes
    back; the caller reverses it). Keyset paging walks the primary key, so deep pages stay cheap.
    """
    stmt = select(Job)
    if by_queue:
        stmt = stmt.where(Job.queue == bindparam("queue", type_=Text))
    if by_state:
        stmt = stmt.where(Job.state == bindparam("state", type_=Text))
    if by_task:
        stmt = stmt.where(Job.task_name == bindparam("task_name", type_=Text))
    position = bindparam("cursor", type_=BigInteger)
    if cursor == "before":
        stmt = stmt.where(Job.id < position)
    elif cursor == "after":
        stmt = stmt.where(Job.id > position)
    order = Job.id.asc() if cursor == "after" else Job.id.desc()
    return stmt.order_by(order).limit(bindparam("limit", type_=Integer))


def oldest_waiting_per_queue() -> Select[str, int, Any, Any]:
    """``(queue, job_id, run_at, waiting_seconds)``: per queue, the ticket with the earliest
    ``run_at`` (``waiting_seconds`` is negative for a job scheduled in the future).

    Reads the ticket table, which holds waiting work only, so this stays small."""
    from sqlalchemy.dialects.postgresql import distinct_on  # only this dashboard query needs it

    return (
        select(
            MessageQueue.queue,
            MessageQueue.job_id,
            MessageQueue.run_at,
            func.extract("epoch", func.now() - MessageQueue.run_at).label("waiting_seconds"),
        )
        .ext(distinct_on(MessageQueue.queue))
        .order_by(MessageQueue.queue, MessageQueue.run_at, MessageQueue.job_id)
    )


def finished_per_minute() -> Select[str, JobState, int, int]:
    """``(queue, state, minutes_ago, count)`` for jobs finished in the last hour, bucketed by
    whole minutes before ``now()`` (0 = the current minute). Uses the ``finished_at`` index."""
    minutes_ago = cast(
        func.floor(func.extract("epoch", func.now() - Job.finished_at) / 60), Integer
    ).label("minutes_ago")
    return (
        select(Job.queue, Job.state, minutes_ago, func.count())
        .where(
            Job.finished_at.is_not(None),
            Job.finished_at > func.now() - _seconds(literal(3600.0)),
        )
        .group_by(Job.queue, Job.state, minutes_ago)
    )


@cache
def delete_job() -> Any:  # a ReturningDelete
    """Delete one job that is not RUNNING (its ticket goes with it by the foreign key's
    cascade). Binds ``job_id``; returns the id when deleted. A running job is left alone: its
    worker still holds it and would report an outcome for a missing row."""
    return (
        delete(Job)
        .where(Job.id == bindparam("job_id", type_=BigInteger), Job.state != JobState.RUNNING)
        .returning(Job.id)
    )
