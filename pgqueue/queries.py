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
    CompoundSelect,
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
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCLASS, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import aliased
from sqlalchemy.sql.dml import ReturningUpdate

from pgqueue.models import UNIQUE_KEY_HELD, Job, MessageQueue, PeriodicTick, QueueControl
from pgqueue.states import (
    ABANDON,
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
    UNBLOCK,
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


def _sources_fixed(transition: Transition) -> ColumnElement[bool]:
    """``_sources`` as ``state = a OR state = b``: plain binds, no expanding ``IN`` list that
    SQLAlchemy renders at execution time, so the statement's SQL text is final when compiled
    (the claim runs on the driver connection directly, see ``uow.driver_statement``)."""
    return or_(*(Job.state == s.value for s in sorted(transition.sources)))


# Entries kept in a job's ``errors`` history: the latest attempts' (``last_error`` holds the
# latest one's too). With ``max_error_bytes`` per entry, a row stays bounded however many
# attempts a job is allowed.
ERROR_HISTORY: Final = 10
_LAST_ENTRIES: Final[ColumnElement[Any]] = literal_column("'$[last - $keep + 1 to last]'::jsonpath")


def _append_error(attempt: Any, error: ColumnElement[Any]) -> ColumnElement[Any]:
    """``errors || [{"attempt", "at", "error"}]``, cut to its last ``ERROR_HISTORY`` entries:
    the per-attempt error history. (A lax JSON path: a history edited by hand into something
    other than an array is wrapped, not refused, so the outcome is still written.)"""
    entry = func.jsonb_build_array(
        func.jsonb_build_object("attempt", attempt, "at", func.now(), "error", error)
    )
    return func.jsonb_path_query_array(
        Job.errors.op("||")(entry),
        _LAST_ENTRIES,
        func.jsonb_build_object("keep", literal(ERROR_HISTORY, Integer)),
    )


_CLEAR_LEASE: Final[dict[str, Any]] = {
    "lease_owner": null(),
    "lease_token": null(),
    "lease_expires_at": null(),
}

# Columns a worker needs to run a claimed job. The arguments come back as their JSON text
# (free for ``json``, stored as text): the repository decodes each job's on its own, so a row
# Python cannot decode fails alone instead of the claim's whole answer.
CLAIMED_COLUMNS: Final[tuple[Any, ...]] = (
    Job.id,
    Job.task_name,
    Job.queue,
    cast(Job.args, Text).label("args"),
    cast(Job.kwargs, Text).label("kwargs"),
    Job.attempts,
    Job.max_attempts,
    Job.priority,
    Job.lease_token,
    Job.atomic,
    Job.cancel_requested,
)


# --- enqueue -------------------------------------------------------------------------------


@cache
def insert_jobs(with_unique_keys: bool, with_dependencies: bool = False) -> Select[Any]:
    """Insert N jobs and their tickets in one statement; returns ``(id, unique_key)`` rows.

    Binds parallel arrays: ``task_names``, ``queues``, ``args`` and ``kwargs`` (JSON text),
    ``priorities``, ``max_attempts``, ``delays`` (seconds from now(), may be null),
    ``run_ats`` (absolute, may be null), ``unique_keys`` (may be null), ``atomics``.
    Ids come back in input order (ordered by ordinality, assigned by the identity in that
    order). With unique keys, a row whose key is already held by an active job is skipped
    (``ON CONFLICT DO NOTHING`` on the partial unique index) and gets no ticket.

    ``with_dependencies`` also binds ``states`` (QUEUED, WAITING, or CANCELLED when a
    dependency already failed), ``depends_ons``
    (``'{1,2}'`` array literals or null) and ``reasons``; only QUEUED jobs get a ticket, and the
    rows also return ``(state, depends_on)`` so the caller can register the waiting ones with
    their dependencies (``add_dependents``).
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
    extra_columns: list[str] = []
    extra_values: list[Any] = []
    if with_dependencies:
        deps = (
            func.unnest(
                _array("states", Text),
                _array("depends_ons", Text),
                _array("reasons", Text),
            )
            .table_valued("state", "depends_on", "reason", with_ordinality="ord")
            .render_derived(name="d")
        )
        rows_deps: Any = deps
        extra_columns = [
            "state",
            "depends_on",
            "last_error",
            "finished_at",
        ]
        extra_values = [
            rows_deps.c.state,
            cast(rows_deps.c.depends_on, ARRAY(BigInteger)),
            rows_deps.c.reason,
            case((rows_deps.c.state == JobState.CANCELLED.value, func.now()), else_=null()),
        ]
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
        *extra_values,
    ).order_by(rows.c.ord)
    if with_dependencies:
        source = source.where(rows_deps.c.ord == rows.c.ord)
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
        *extra_columns,
    ]
    stmt = pg_insert(Job).from_select(columns, source)
    if with_unique_keys:
        stmt = stmt.on_conflict_do_nothing(
            index_elements=[Job.unique_key],
            index_where=text(UNIQUE_KEY_HELD),
        )
    jobs = stmt.returning(
        Job.id,
        Job.queue,
        Job.priority,
        Job.run_at,
        Job.unique_key,
        Job.atomic,
        Job.state,
        Job.depends_on,
    ).cte("new_jobs")
    only_queued = [jobs.c.state == JobState.QUEUED.value] if with_dependencies else []
    tickets = _tickets_for(jobs, "new_tickets", *only_queued)
    # Referencing the ticket CTE is not needed for it to run (data-modifying CTEs always run),
    # but keeping it in the FROM list documents the dependency and keeps SQLAlchemy rendering it.
    if with_dependencies:
        return (
            select(jobs.c.id, jobs.c.unique_key, jobs.c.state, jobs.c.depends_on)
            .add_cte(tickets)
            .where(_woken(tickets))
            .order_by(jobs.c.id)
        )
    return (
        select(jobs.c.id, jobs.c.unique_key)
        .add_cte(tickets)
        .where(_woken(tickets))
        .order_by(jobs.c.id)
    )


@cache
def insert_one_job() -> Select[int]:
    """Insert one job (no unique key, no dependencies) and its ticket; returns its id.

    The single-row form of ``insert_jobs``: plain ``VALUES`` binds instead of ``unnest`` over ten
    one-element arrays, for the common ``task.enqueue(...)`` outside any caller transaction.
    Binds ``task_name``, ``queue``, ``args`` and ``kwargs`` (JSON text), ``priority``,
    ``max_attempts``, ``delay`` (seconds from now(), may be null), ``run_at`` (absolute, may be
    null) and ``atomic``.
    """
    run_at = func.coalesce(
        bindparam("run_at", type_=Job.run_at.type),
        func.now() + _seconds(func.coalesce(bindparam("delay", type_=Float), literal_column("0"))),
    )
    job = (
        insert(Job)
        .values(
            task_name=bindparam("task_name", type_=Text),
            queue=bindparam("queue", type_=Text),
            args=cast(bindparam("args", type_=Text), JSON),
            kwargs=cast(bindparam("kwargs", type_=Text), JSON),
            priority=bindparam("priority", type_=SmallInteger),
            max_attempts=bindparam("max_attempts", type_=Integer),
            run_at=run_at,
            atomic=bindparam("atomic", type_=Boolean),
        )
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("new_job")
    )
    ticket = _tickets_for(job, "new_ticket")
    return select(job.c.id).add_cte(ticket).where(_woken(ticket))


@cache
def allocate_job_ids() -> Select[Any, Any]:
    """One row: an array of ``n`` new job ids from the jobs' identity sequence, ascending, and
    the batch's run_at (``run_at`` if given, else ``now()`` plus ``delay`` seconds, may be
    null): for ``COPY`` of a large batch, which cannot evaluate defaults per row. One array,
    not ``n`` rows: half the cost per job. Binds ``n``, ``run_at``, ``delay``.

    The sequence is looked up once, as a ``regclass`` (an InitPlan): as ``nextval``'s argument
    the lookup and the text-to-regclass cast would run per id and cost most of each id."""
    sequence = select(
        cast(func.pg_get_serial_sequence(literal(Job.__tablename__), literal("id")), REGCLASS)
    ).scalar_subquery()
    run_at = func.coalesce(
        bindparam("run_at", type_=Job.run_at.type),
        func.now() + _seconds(func.coalesce(bindparam("delay", type_=Float), literal_column("0"))),
    )
    series = (
        func.generate_series(1, bindparam("n", type_=Integer))
        .table_valued("i")
        .render_derived(name="series")
    )
    ids = func.array_agg(aggregate_order_by(func.nextval(sequence), series.c.i))
    return select(ids, run_at).select_from(series)


def copy_jobs() -> Any:
    """``COPY pgqueue_jobs (...) FROM STDIN`` for a batch with allocated ids (a psycopg
    ``sql.Composed``: COPY has no SQLAlchemy construct). Rows: ``COPY_JOB_COLUMNS``."""
    return _copy(Job.__tablename__, COPY_JOB_COLUMNS)


def copy_tickets() -> Any:
    """``COPY pgqueue_message_queue (...) FROM STDIN``; rows: ``COPY_TICKET_COLUMNS``. Sends
    no wake-up: follow it with ``notify_tickets`` in the same transaction."""
    return _copy(MessageQueue.__tablename__, COPY_TICKET_COLUMNS)


@cache
def notify_tickets() -> Select[Any]:
    """The wake-up for tickets inserted by COPY, which runs no pgqueue expression per row: one
    NOTIFY per queue of ``queues`` (array) with the batch's ``run_at``, the payload the INSERT
    paths send (``_woken``). Delivered at commit, so its place in the transaction is free."""
    queues = func.unnest(_array("queues", Text)).table_valued("queue").render_derived(name="q")
    run_at = bindparam("run_at", type_=MessageQueue.run_at.type)
    return select(func.count(func.pg_notify(NOTIFY_CHANNEL, _wake_payload(queues.c.queue, run_at))))


COPY_JOB_COLUMNS: Final = (
    "id",
    "task_name",
    "queue",
    "args",
    "kwargs",
    "priority",
    "max_attempts",
    "run_at",
    "atomic",
)
COPY_TICKET_COLUMNS: Final = ("job_id", "queue", "priority", "run_at", "atomic")


def _copy(table: str, columns: tuple[str, ...]) -> Any:
    from psycopg import sql  # only the COPY statements need psycopg's SQL composition

    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


def active_job_ids_by_unique_key() -> Select[int, str | None]:
    """Ids of active jobs holding the given ``unique_keys`` (array)."""
    return select(Job.id, Job.unique_key).where(
        Job.unique_key == func.any(_array("unique_keys", Text)),
        Job.state.in_(["queued", "running", "retrying"]),
    )


# --- claim ---------------------------------------------------------------------------------


def _among(column: Any, ids: Any) -> ColumnElement[bool]:
    """``column = ANY(ARRAY(SELECT ids))``: matches a CTE's ids by index probes whatever the
    planner believes about the CTE's size. A join (``USING``/``FROM`` the CTE) is planned from
    the ``LIMIT``'s estimate, and for a large ``LIMIT`` or a generic plan (where ``LIMIT $n``
    counts as 10 % of the table) that becomes a hash join over a sequential scan of the whole
    table, an order of magnitude slower than the probes for a few hundred tickets among tens of
    thousands."""
    matched: ColumnElement[bool] = column == func.any(func.array(select(ids).scalar_subquery()))
    return matched


@cache
def claim(
    *, atomic: bool, filter_queues: bool, limits: bool = True, task_leases: bool = True
) -> ReturningUpdate[Any]:
    """Claim up to ``limit`` ready tickets: lock them (SKIP LOCKED), delete them, and move their
    jobs to RUNNING with a fresh lease, in one statement.

    Binds: ``limit``, ``worker`` (lease owner id), ``lease_seconds`` (default lease),
    ``task_leases`` (JSON object task name -> lease seconds, for tasks with their own lease)
    unless ``task_leases=False`` (no task overrides its lease: every job gets the default,
    with no per-row JSON lookup), and ``queues`` (array) when ``filter_queues``. Atomic claims (one per open transaction)
    set no lease expiry: if the transaction dies the claim itself rolls back.

    Queues with a row in ``pgqueue_queues`` that is paused or limited are left out of the main
    index scan (a hashed anti-join on a usually empty set). Each limited queue that is not
    paused is claimed from separately, and first: its control row is locked (SKIP LOCKED: a
    queue another worker is claiming right now is skipped, not waited for) and at most
    ``limit - running`` of its tickets are taken; the row's ``running`` counter grows by what
    was claimed, in this same statement. Priority therefore orders tickets within the limited
    queues and within the rest, not across the two.

    ``limits=False`` builds the lean variant for when no queue has a limit (the common case):
    the main scan alone, still skipping paused and limited queues, so it can never break a limit
    that was set after the caller last looked, it only leaves that queue to the full variant.
    """
    ready = and_(
        MessageQueue.atomic == (true() if atomic else false()),
        MessageQueue.run_at <= func.now(),
    )
    queue_filter: ColumnElement[bool] = true()
    if filter_queues:
        queue_filter = MessageQueue.queue == func.any(_array("queues", Text))
    order = (MessageQueue.priority, MessageQueue.run_at, MessageQueue.job_id)
    controlled = select(QueueControl.name).where(
        or_(QueueControl.paused, QueueControl.concurrency_limit.is_not(None))
    )
    free = (
        select(MessageQueue.job_id, MessageQueue.priority, MessageQueue.run_at)
        .where(ready, queue_filter, MessageQueue.queue.not_in(controlled))
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    lease: ColumnElement[Any] = bindparam("lease_seconds", type_=Float)
    if task_leases:
        task_lease = cast(
            func.jsonb_extract_path_text(bindparam("task_leases", type_=JSONB), Job.task_name),
            Float,
        )
        lease = func.coalesce(task_lease, lease)
    lease_expiry: ColumnElement[Any] = null() if atomic else func.now() + _seconds(lease)
    claimed_values: dict[str, Any] = {
        "state": CLAIM.target,
        "attempts": Job.attempts + 1,
        "started_at": func.now(),
        "updated_at": func.now(),
        "lease_owner": bindparam("worker", type_=Text),
        "lease_token": func.gen_random_uuid(),
        "lease_expires_at": lease_expiry,
    }
    if not limits:
        lean_picked = free.cte("picked")
        lean_deleted = (
            delete(MessageQueue)
            .where(_among(MessageQueue.job_id, lean_picked.c.job_id))
            .returning(MessageQueue.job_id)
            .cte("claimed")
        )
        return (
            update(Job)
            .where(_among(Job.id, lean_deleted.c.job_id), _sources_fixed(CLAIM))
            .values(**claimed_values)
            .returning(*CLAIMED_COLUMNS)
        )
    limited_where: list[ColumnElement[bool]] = [
        QueueControl.concurrency_limit.is_not(None),
        QueueControl.paused.is_(False),
    ]
    if filter_queues:
        limited_where.append(QueueControl.name == func.any(_array("queues", Text)))
    limited = (
        select(
            QueueControl.name,
            (QueueControl.concurrency_limit - QueueControl.running).label("room"),
        )
        .where(*limited_where)
        .with_for_update(skip_locked=True)
        .cte("limited")
    )
    per_queue = (
        select(MessageQueue.job_id, MessageQueue.priority, MessageQueue.run_at)
        .where(ready, MessageQueue.queue == limited.c.name)
        .order_by(*order)
        .limit(func.least(func.greatest(limited.c.room, 0), bindparam("limit", type_=Integer)))
        .with_for_update(skip_locked=True)
        .lateral("per_queue")
    )
    capped = select(per_queue.c.job_id, per_queue.c.priority, per_queue.c.run_at).select_from(
        limited.join(per_queue, true())
    )
    # FOR UPDATE is not allowed in a UNION's branches; as CTEs each keeps its own locking scan.
    # Limited queues come first (each bounded by its room), the free scan fills the remaining
    # slots. No ORDER BY over the union: each branch already comes in index order, and a sort
    # here would sit on the hot path of every claim.
    free_cte = free.cte("free")
    capped_cte = capped.cte("capped")
    both = select(capped_cte.c.job_id).union_all(select(free_cte.c.job_id)).subquery("candidates")
    picked_cte = select(both.c.job_id).limit(bindparam("limit", type_=Integer)).cte("picked")
    deleted = (
        delete(MessageQueue)
        .where(_among(MessageQueue.job_id, picked_cte.c.job_id))
        .returning(MessageQueue.job_id, MessageQueue.queue)
        .cte("claimed")
    )
    # Count only tickets whose job this statement moves to RUNNING: a ticket whose job is gone
    # (tickets have no foreign key) or not waiting is deleted but runs nothing.
    moved = select(literal(1)).where(Job.id == deleted.c.job_id, _sources_fixed(CLAIM)).exists()
    # Per limited queue, not GROUP BY: grouping the claimed rows made the planner sort them.
    per_limited = (
        select(func.count())
        .select_from(deleted)
        .where(deleted.c.queue == limited.c.name, moved)
        .scalar_subquery()
    )
    taken = select(limited.c.name.label("queue"), per_limited.label("n")).subquery("taken")
    bump = (
        update(QueueControl)
        .where(QueueControl.name == taken.c.queue, taken.c.n > 0)
        .values(running=QueueControl.running + taken.c.n)
        .cte("bump")
    )
    return (
        update(Job)
        .where(_among(Job.id, deleted.c.job_id), _sources_fixed(CLAIM))
        .values(**claimed_values)
        .returning(*CLAIMED_COLUMNS)
        .add_cte(bump)
    )


@cache
@cache
def claimed_by() -> Select[Any]:
    """RUNNING jobs leased to ``worker``, claimed in the last ``within`` seconds, other than
    ``held`` (array of ids): what a claim whose answer never arrived (the connection broke after
    its commit) left to that worker. Binds ``worker``, ``held``, ``within``. Reads the partial
    index on running jobs."""
    return select(*CLAIMED_COLUMNS).where(
        Job.state == JobState.RUNNING,
        Job.lease_owner == bindparam("worker", type_=Text),
        Job.started_at >= func.now() - _seconds(bindparam("within", type_=Float)),
        Job.id != func.all(_array("held", BigInteger)),
    )


@cache
def any_queue_limit() -> Select[bool]:
    """Whether any queue has a concurrency limit (chooses the claim variant)."""
    return select(select(literal(1)).where(QueueControl.concurrency_limit.is_not(None)).exists())


# --- follow-ups shared by the outcome statements --------------------------------------------
# Every statement that moves jobs out of RUNNING gives back their queue slots in the same
# statement. Statements that end jobs return the ended jobs' ``dependents``; the repository then
# settles those (``settle_dependents``) in a follow-up statement. A follow-up and not a CTE: a
# dependent enqueued while the outcome statement waited for the dependency's row lock is
# invisible to that statement's snapshot, but visible to the next statement's.


def _tickets_for(jobs: Any, name: str, *where: ColumnElement[bool]) -> Any:
    """CTE named ``name``: a ticket for each row of ``jobs`` (a CTE returning the jobs' id,
    queue, priority, run_at and atomic) that matches ``where``. The statement must also
    include ``_woken`` of it, which sends the wake-up."""
    rows = select(jobs.c.id, jobs.c.queue, jobs.c.priority, jobs.c.run_at, jobs.c.atomic)
    return (
        insert(MessageQueue)
        .from_select(list(COPY_TICKET_COLUMNS), rows.where(*where))
        .returning(MessageQueue.queue, MessageQueue.run_at)
        .cte(name)
    )


def _wake_payload(queue: Any, first_run_at: Any) -> ColumnElement[str]:
    """What an idle worker is told: the queue, plus the epoch of the earliest new ticket when
    that is in the future (so it knows when to wake for a delayed job)."""
    epoch = cast(func.extract("epoch", first_run_at), Text)
    return case((first_run_at <= func.now(), queue), else_=queue + literal(" ") + epoch)


def _woken(tickets: Any) -> ColumnElement[bool]:
    """An always-true condition for the statement that inserts ``tickets`` (a ``_tickets_for``
    CTE): evaluating it sends one NOTIFY per queue of the new tickets (none when there are
    none), delivered at commit. In the statement and not a trigger on the ticket table: a
    statement-level trigger with a transition table costs more server time than the insert it
    follows. A condition because a CTE nothing reads is never evaluated; uncorrelated, it runs
    once."""
    first = (
        select(tickets.c.queue, func.min(tickets.c.run_at).label("first_run_at"))
        .group_by(tickets.c.queue)
        .subquery(f"{tickets.name}_queues")
    )
    sent = select(
        func.count(
            func.pg_notify(NOTIFY_CHANNEL, _wake_payload(first.c.queue, first.c.first_run_at))
        )
    ).scalar_subquery()
    return sent >= 0


def _free_slots(exited: Any) -> Any:
    """CTE: subtract jobs that left RUNNING (``exited`` has ``queue``) from limited queues."""
    gone = (
        select(exited.c.queue, func.count().label("n"))
        .group_by(exited.c.queue)
        .subquery("exited_per_queue")
    )
    return (
        update(QueueControl)
        .where(QueueControl.name == gone.c.queue, QueueControl.concurrency_limit.is_not(None))
        .values(running=func.greatest(QueueControl.running - gone.c.n, 0))
        .cte(f"slots_{exited.name}")
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
    # Fixed SQL text: the worker sends outcome statements on the driver connection.
    return and_(Job.id == rows.c.id, _sources_fixed(transition), Job.lease_token == rows.c.token)


@cache
def complete() -> Select[int, list[int] | None]:
    """RUNNING -> SUCCEEDED for many jobs. Binds ``ids``, ``tokens``, ``results`` (JSON text).

    Returns the ids actually updated; a missing id means that worker's lease was lost.
    """
    rows = _outcome_rows(("result", Text))
    completed = (
        update(Job)
        .where(_leased(COMPLETE, rows))
        .values(
            state=COMPLETE.target,
            result=cast(rows.c.result, JSON),
            finished_at=func.now(),
            updated_at=func.now(),
            **_CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.dependents)
        .cte("completed")
    )
    return select(completed.c.id, completed.c.dependents).add_cte(_free_slots(completed))


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
    return _select_ids_with_tickets(updated).add_cte(_free_slots(updated))


def _select_ids_with_tickets(updated: Any) -> Select[int]:
    tickets = _tickets_for(updated, "requeued")
    return select(updated.c.id).add_cte(tickets).where(_woken(tickets))


@cache
def fail() -> Select[int, list[int] | None]:
    """RUNNING -> FAILED for many jobs. Binds ``ids``, ``tokens``, ``errors``."""
    rows = _outcome_rows(("error", Text))
    failed = (
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
        .returning(Job.id, Job.queue, Job.state, Job.dependents)
        .cte("failed")
    )
    return select(failed.c.id, failed.c.dependents).add_cte(_free_slots(failed))


@cache
def mark_cancelled() -> Select[int, list[int] | None]:
    """RUNNING -> CANCELLED for jobs whose handler stopped on a cancel request.

    Binds ``ids``, ``tokens``, ``errors`` (the reason)."""
    rows = _outcome_rows(("error", Text))
    stopped = (
        update(Job)
        .where(_leased(CANCELLED, rows))
        .values(
            state=CANCELLED.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=rows.c.error,
            # Explicit, or SQLAlchemy would SET errors from the same-named ``errors`` bind.
            errors=Job.errors,
            **_CLEAR_LEASE,
        )
        .returning(Job.id, Job.queue, Job.state, Job.dependents)
        .cte("stopped")
    )
    return select(stopped.c.id, stopped.c.dependents).add_cte(_free_slots(stopped))


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
    return _select_ids_with_tickets(updated).add_cte(_free_slots(updated))


@cache
def heartbeat() -> ReturningUpdate[int, bool]:
    """Extend the leases of running jobs. Binds ``ids``, ``tokens``, ``lease_secondss``.

    Returns ``(id, cancel_requested)`` for each lease still held, so cancel requests reach the
    worker within one heartbeat.
    """
    rows = _outcome_rows(("lease_seconds", Float))
    return (
        update(Job)
        .where(
            Job.id == rows.c.id,
            Job.state == JobState.RUNNING,
            Job.lease_token == rows.c.token,
            Job.id.in_(_locked_in_id_order(Job.state == JobState.RUNNING)),
        )
        .values(lease_expires_at=func.now() + _seconds(rows.c.lease_seconds))
        .returning(Job.id, Job.cancel_requested)
    )


def _locked_in_id_order(*where: ColumnElement[bool]) -> Select[int]:
    """Rows of jobs ``ids`` (array), locked in id order.

    The writers that wait for the row locks of several RUNNING jobs (a heartbeat, a batch of
    outcomes written in one transaction: ``lock_jobs``) all take them in this one order, so two
    of them can never deadlock (a heartbeat covers attempts whose outcome is being written).
    """
    return (
        select(Job.id)
        .where(Job.id == func.any(_array("ids", BigInteger)), *where)
        .order_by(Job.id)
        .with_for_update()
    )


@cache
def lock_jobs() -> Select[int]:
    """Lock the rows of jobs ``ids`` (array) in id order, first thing in a transaction that
    then updates them in several statements (``record_outcomes``). Binds ``ids``."""
    return _locked_in_id_order()


# --- maintenance ---------------------------------------------------------------------------


@cache
def expired_lease_exists() -> Select[bool]:
    """Whether any RUNNING job's lease has expired (database clock): the rescue's cheap
    autocommit pre-check, so an idle worker's maintenance pass opens no transaction."""
    return select(
        select(literal(1))
        .where(Job.state == JobState.RUNNING.value, Job.lease_expires_at < func.now())
        .exists()
    )


@cache
def rescue_expired() -> Select[int, str, list[int] | None]:
    """Re-queue (``rescue``) or fail for good (``rescue_fail``) up to ``limit`` jobs whose lease
    expired by the database clock; rescued jobs get a ticket for now. A job whose cancellation
    was requested ends CANCELLED instead. Binds ``lock_key``, ``limit``, ``error``.
    Returns ``(id, new state)``; nothing when another session holds the maintenance lock.
    """
    # The advisory lock (held to the end of the transaction) elects a single rescuer per
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
        .returning(
            Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.dependents
        )
        .cte("rescued")
    )
    tickets = _tickets_for(updated, "rescue_tickets", updated.c.state == RESCUE.target.value)
    return (
        select(updated.c.id, updated.c.state, updated.c.dependents)
        .add_cte(tickets, _free_slots(updated))
        .where(_woken(tickets))
    )


@cache
def prune_finished() -> Select[int]:
    """Delete up to ``limit`` finished jobs older than their retention; returns their count.

    Binds ``succeeded_before``/``failed_before`` (seconds of age), ``limit``. A finished job
    has no ticket (the claim deleted it, a re-run gives a new one only to a job it moves out of
    the finished states, and this statement locks what it deletes); any ticket of a pruned job
    is deleted all the same, since no foreign key cascades the delete to tickets."""
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
    pruned = delete(Job).where(Job.id.in_(old)).returning(Job.id).cte("pruned")
    tickets = (
        delete(MessageQueue).where(_among(MessageQueue.job_id, pruned.c.id)).cte("pruned_tickets")
    )
    return select(func.count()).select_from(pruned).add_cte(tickets)


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


def _ticket_deleted(job_id: Any, name: str) -> Any:
    """CTE named ``name``: delete the ticket of job ``job_id`` (if any), returning its job id."""
    return (
        delete(MessageQueue)
        .where(MessageQueue.job_id == job_id)
        .returning(MessageQueue.job_id)
        .cte(name)
    )


@cache
def cancel_waiting() -> Select[int, list[int] | None]:
    """QUEUED/RETRYING -> CANCELLED, deleting the ticket. Binds ``job_id``, ``reason``."""
    job_id = bindparam("job_id", type_=BigInteger)
    gone = _ticket_deleted(job_id, "gone")
    # A WAITING job (blocked on dependencies) has no ticket to delete.
    has_ticket_or_blocked = or_(
        Job.id.in_(select(gone.c.job_id)), Job.state == JobState.WAITING.value
    )
    updated = (
        update(Job)
        .where(Job.id == job_id, has_ticket_or_blocked, _sources(CANCEL))
        .values(
            state=CANCEL.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=bindparam("reason", type_=Text),
        )
        .returning(Job.id, Job.dependents)
        .cte("cancelled")
    )
    return select(updated.c.id, updated.c.dependents)


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
    """Whether any ticket is claimable now (for ``drain``). Binds ``queues`` when filtering.

    Tickets of paused queues are not claimable, so they do not count."""
    paused = select(QueueControl.name).where(QueueControl.paused)
    inner = select(literal(1)).where(
        MessageQueue.run_at <= func.now(), MessageQueue.queue.not_in(paused)
    )
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
    """``pg_notify`` on pgqueue's channel for one queue, for a wake-up sent outside a statement
    that inserts tickets (those send their own, see ``_woken``)."""
    return select(func.pg_notify(NOTIFY_CHANNEL, queue))


@cache
def set_local_settings() -> Select[Any]:
    """pgqueue's timeouts and ``jit = off`` for the current transaction only (used behind a
    pooler, where a session setting would reach other clients). Binds ``statement_timeout`` and
    ``idle_timeout`` (milliseconds, as text)."""
    return select(
        func.set_config("statement_timeout", bindparam("statement_timeout", type_=Text), True),
        func.set_config(
            "idle_in_transaction_session_timeout", bindparam("idle_timeout", type_=Text), True
        ),
        func.set_config("jit", "off", True),
    )


# --- dashboard (pgqueue.contrib.flask.dashboard) ---------------------------------------------
# Read-mostly statements for the web dashboard: paged job lists, the oldest waiting ticket per
# queue, finished jobs per minute, and deleting one job. Kept apart from the worker's hot path.


_MAX_ID: Final = 2**63 - 1


def _one_state(value: ColumnElement[Any]) -> ColumnElement[bool]:
    """``state = value``, written as a range of one value so the planner reads the newest ids of
    a ``(queue, state)`` or ``(task_name, state)`` pair off its index.

    Compared to a value it cannot see (an outer column of a lateral walk, or a generic plan's
    parameter), ``state = x`` is estimated at the average frequency of a state; the planner
    then walks the primary key backwards filtering rows, expecting a match every few rows, and
    for a rare pair reads the whole history. With a range, ``ORDER BY state, id`` is an order
    only the composite index gives, and any other plan must sort every match first."""
    return and_(Job.state >= value, Job.state <= value)


def _distinct_queues() -> Any:  # a CTE
    """The queue names present in ``pgqueue_jobs``, by a loose index scan: one index probe per
    queue on the ``(queue, state, id)`` index (``min(queue) WHERE queue > previous``), never a
    pass over the history."""
    smallest = select(func.min(Job.queue).label("queue")).cte("job_queues", recursive=True)
    following = (
        select(
            select(func.min(Job.queue))
            .where(Job.queue > smallest.c.queue)
            .scalar_subquery()
            .label("queue")
        )
        .select_from(smallest)
        .where(smallest.c.queue.is_not(None))
    )
    return smallest.union_all(following)


@cache
def job_queues() -> Select[str]:
    """Names of the queues that have jobs, sorted (the dashboard's queue filter)."""
    queues = _distinct_queues()
    return select(queues.c.queue).where(queues.c.queue.is_not(None)).order_by(queues.c.queue)


@cache
def capped_state_counts() -> Select[str, str, int]:
    """``(queue, state, count)`` for every queue with jobs and every state in ``states`` (an
    array), each count stopping at ``cap``: a count of ``cap`` means "at least ``cap``".

    Each count reads at most ``cap`` entries of the ``(queue, state, id)`` index, so the
    overview costs the same with a long history as with a short one. The state is bounded as
    a row range, ``(state, id)`` from ``(s, 0)`` to ``(s, max)``, and read in that order: the
    planner estimates such a range at a good share of the queue, so it stops a walk of the
    index at the cap instead of collecting every match of the pair (a bitmap scan) or sorting
    the primary key's walk (see ``_one_state`` for why plain equality does not do)."""
    queues = _distinct_queues()
    states = func.unnest(_array("states", Text)).table_valued("state").render_derived(name="states")
    hits = (
        select(literal(1).label("hit"))
        .where(
            Job.queue == queues.c.queue,
            tuple_(Job.state, Job.id) >= tuple_(states.c.state, literal(0, BigInteger)),
            tuple_(Job.state, Job.id) <= tuple_(states.c.state, literal(_MAX_ID, BigInteger)),
        )
        .order_by(Job.state, Job.id)
        .limit(bindparam("cap", type_=Integer))
        .correlate(queues, states)
        .subquery("hits")
    )
    counted = select(func.count()).select_from(hits).scalar_subquery()
    return (
        select(queues.c.queue, states.c.state, counted.label("count"))
        .select_from(queues)
        .join(states, true())
        .where(queues.c.queue.is_not(None))
    )


@cache
def list_jobs(*, by_queue: bool, by_state: bool, by_task: bool, cursor: str | None) -> Select[Job]:
    """One page of jobs, newest first, optionally filtered.

    Binds ``limit``; ``cursor`` (a job id) when ``cursor`` is ``"before"`` (older jobs:
    ``id < cursor``, newest first) or ``"after"`` (newer jobs: ``id > cursor``, oldest first so
    the page nearest the cursor comes back; the caller reverses it). Keyset paging walks an
    index in id order, so deep pages stay cheap.

    Unfiltered, the page walks the primary key. Filtered, it is the merge of one short walk per
    ``(queue, state)`` pair (``queues`` and ``states`` arrays: the chosen ones, or all of them)
    on the ``(queue, state, id)`` index, or per state on ``(task_name, state, id)`` when a task
    is chosen (binds ``task_name``, and ``queue`` with it). Each walk stops after ``limit`` ids,
    so a filter matching few of many finished jobs never scans the history for them.
    """
    position = bindparam("cursor", type_=BigInteger)
    newer = cursor == "after"
    order = Job.id.asc() if newer else Job.id.desc()
    limit = bindparam("limit", type_=Integer)

    def paged(stmt: Select[Any], *keys: Any) -> Select[Any]:
        if cursor == "before":
            stmt = stmt.where(Job.id < position)
        elif cursor == "after":
            stmt = stmt.where(Job.id > position)
        order_by = [k.asc() if newer else k.desc() for k in keys]
        return stmt.order_by(*order_by, order).limit(limit)

    if not (by_queue or by_state or by_task):
        return paged(select(Job))
    states = func.unnest(_array("states", Text)).table_valued("state").render_derived(name="states")
    if by_task:
        walk = select(Job.id).where(
            Job.task_name == bindparam("task_name", type_=Text), _one_state(states.c.state)
        )
        if by_queue:
            # ``queue || ''``: the same test, but not one the ``(queue, state, id)`` index can
            # serve, so a generic plan cannot walk a busy queue's whole index looking for a
            # rare task; it walks the task's index and checks the queue of each match.
            walk = walk.where(Job.queue.concat("") == bindparam("queue", type_=Text))
        ids = paged(walk, Job.state).lateral("walk")
        merged = select(ids.c.id).select_from(states).join(ids, true())
    else:
        queues = (
            func.unnest(_array("queues", Text)).table_valued("queue").render_derived(name="queues")
        )
        walk = select(Job.id).where(Job.queue == queues.c.queue, _one_state(states.c.state))
        ids = paged(walk, Job.state).lateral("walk")
        merged = select(ids.c.id).select_from(queues).join(states, true()).join(ids, true())
    merged_order = ids.c.id.asc() if cursor == "after" else ids.c.id.desc()
    page = merged.order_by(merged_order).limit(limit).subquery("page")
    return select(Job).join(page, Job.id == page.c.id).order_by(order)


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
    """Delete one job that is not RUNNING, and its ticket. Binds ``job_id``; returns the id when
    deleted. A running job is left alone: its worker still holds it and would report an outcome
    for a missing row (and it has no ticket: the claim deleted it).

    The ticket goes first, in the claim's lock order (ticket, then job), so this statement and
    a claim of the same job cannot deadlock: whichever locks the ticket first wins, and the
    other finds it gone (the claim then skips it, or this sees the job RUNNING and stops)."""
    job_id = bindparam("job_id", type_=BigInteger)
    ticket = _ticket_deleted(job_id, "gone_ticket")
    ticket_first = select(func.count()).select_from(ticket).scalar_subquery() >= 0
    return (
        delete(Job)
        .where(Job.id == job_id, Job.state != JobState.RUNNING, ticket_first)
        .returning(Job.id)
    )


# --- scheduling and job control (periodic ticks, queue switches, dependencies) ---------------


def lock_dependencies() -> Select[int, str]:
    """``(id, state)`` of the jobs ``ids`` (array), locked until the enqueuing transaction ends.

    The lock makes a dependency's outcome statement wait for the new dependent to commit; that
    statement then re-reads the row's newest version, ``dependents`` included, so a dependency
    finishing during the enqueue still releases (or cancels) the new job.
    """
    return (
        select(Job.id, Job.state)
        .where(Job.id == func.any(_array("ids", BigInteger)))
        .order_by(Job.id)
        .with_for_update(key_share=True)
    )


@cache
def add_dependents() -> Any:
    """Append dependents to their dependencies' ``dependents`` arrays. Binds parallel arrays
    ``dependency_ids`` and ``dependent_ids`` (one pair per edge)."""
    edges = (
        func.unnest(_array("dependency_ids", BigInteger), _array("dependent_ids", BigInteger))
        .table_valued("dependency", "dependent")
        .render_derived(name="e")
    )
    grouped = (
        select(edges.c.dependency, func.array_agg(edges.c.dependent).label("ids"))
        .group_by(edges.c.dependency)
        .subquery("grouped")
    )
    return (
        update(Job)
        .where(Job.id == grouped.c.dependency)
        .values(
            dependents=func.array_cat(
                func.coalesce(Job.dependents, cast(literal("{}"), ARRAY(BigInteger))),
                grouped.c.ids,
            )
        )
    )


@cache
def set_queue_control(*, paused: bool, limit: bool) -> Any:
    """Create or update a queue's control row. Binds ``name`` and ``paused`` and/or
    ``concurrency_limit`` (null removes the limit). Setting a limit starts the ``running``
    counter from the queue's RUNNING jobs, so jobs already running count against it."""
    name = bindparam("name", type_=Text)
    values: dict[str, Any] = {"name": name, "updated_at": func.now()}
    if paused:
        values["paused"] = bindparam("paused", type_=Boolean)
    if limit:
        values["concurrency_limit"] = bindparam("concurrency_limit", type_=Integer)
        values["running"] = (
            select(func.count())
            .select_from(Job)
            .where(Job.queue == name, Job.state == JobState.RUNNING.value)
            .scalar_subquery()
        )
    stmt = pg_insert(QueueControl).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=[QueueControl.name],
        set_={k: stmt.excluded[k] for k in values if k != "name"},
    )


def lock_limited_queues() -> Select[str]:
    """Names of limited queues, their control rows locked (SKIP LOCKED) until the transaction
    ends: the first half of ``recount_running``."""
    return (
        select(QueueControl.name)
        .where(QueueControl.concurrency_limit.is_not(None))
        .order_by(QueueControl.name)
        .with_for_update(skip_locked=True)
    )


@cache
def recount_running() -> Any:  # a ReturningUpdate
    """Reset the ``running`` counter of the queues ``names`` (array) to their RUNNING jobs,
    where it drifted. Returns ``(name, running)`` for the corrected queues.

    Run in the transaction that locked those rows (``lock_limited_queues``), as a later
    statement: its snapshot then holds every claim that counted against the queue (claims take
    the row lock), and a job leaving RUNNING right now still counts as running here, because
    its statement also updates the locked row and so waits to commit until after this one.
    """
    running_jobs = (
        select(func.count())
        .select_from(Job)
        .where(Job.queue == QueueControl.name, Job.state == JobState.RUNNING.value)
        .scalar_subquery()
    )
    return (
        update(QueueControl)
        .where(
            QueueControl.name == func.any(_array("names", Text)),
            QueueControl.running != running_jobs,
        )
        .values(running=running_jobs)
        .returning(QueueControl.name, QueueControl.running)
    )


def queue_controls() -> Select[QueueControl]:
    """All queue control rows, by name."""
    return select(QueueControl).order_by(QueueControl.name)


@cache
def record_tick() -> Any:
    """Claim one tick of a schedule; binds ``tick_name``, ``tick_at``. Returns a row
    only for the one caller that inserted it (``ON CONFLICT DO NOTHING`` on the primary key),
    which then enqueues the job in the same transaction."""
    return (
        pg_insert(PeriodicTick)
        .values(
            schedule_name=bindparam("tick_name", type_=Text),
            scheduled_at=bindparam("tick_at", type_=PeriodicTick.scheduled_at.type),
        )
        .on_conflict_do_nothing(
            index_elements=[PeriodicTick.schedule_name, PeriodicTick.scheduled_at]
        )
        .returning(PeriodicTick.scheduled_at)
    )


@cache
def set_tick_job() -> Any:
    """Record the job enqueued for a tick. Binds ``tick_name``, ``tick_at``, ``tick_job``."""
    return (
        update(PeriodicTick)
        .where(
            PeriodicTick.schedule_name == bindparam("tick_name", type_=Text),
            PeriodicTick.scheduled_at == bindparam("tick_at", type_=PeriodicTick.scheduled_at.type),
        )
        .values(job_id=bindparam("tick_job", type_=BigInteger))
    )


def last_ticks() -> Select[str, Any]:
    """``(schedule_name, latest scheduled_at)`` for the schedules ``names`` (array)."""
    return (
        select(PeriodicTick.schedule_name, func.max(PeriodicTick.scheduled_at))
        .where(PeriodicTick.schedule_name == func.any(_array("names", Text)))
        .group_by(PeriodicTick.schedule_name)
    )


def database_now() -> Select[Any]:
    """The database clock."""
    return select(func.now())


@cache
def settle_dependents() -> CompoundSelect[Any]:
    """Release or cancel the WAITING jobs ``ids`` (array) from their dependencies' states.

    A job all of whose ``depends_on`` SUCCEEDED gets its ticket (``unblock``); a job with a
    dependency FAILED or CANCELLED is cancelled (``abandon``) with the reason, and so is every
    WAITING job depending on it, transitively. Others stay WAITING. Idempotent: the state guard
    makes a second run (or a concurrent one) change nothing, so each job is queued at most once.
    Returns ``(id, new state)``.
    """
    dependency = aliased(Job, name="dependency")
    candidates = (
        select(Job.id, Job.depends_on)
        .where(Job.id == func.any(_array("ids", BigInteger)), _sources(UNBLOCK))
        .cte("candidates")
    )
    dead = (
        select(dependency.id, dependency.state)
        .where(
            dependency.id == func.any(candidates.c.depends_on),
            dependency.state.in_([JobState.FAILED.value, JobState.CANCELLED.value]),
        )
        .order_by(dependency.id)
        .limit(1)
        .lateral("dead")
    )
    unfinished = (
        select(literal(1))
        .where(
            dependency.id == func.any(candidates.c.depends_on),
            dependency.state != JobState.SUCCEEDED.value,
        )
        .exists()
    )
    seeds = (
        select(
            candidates.c.id.label("id"),
            dead.c.id.label("root"),
            dead.c.state.label("root_state"),
        )
        .select_from(candidates.join(dead, true()))
        .cte("doomed", recursive=True)
    )
    deeper = select(
        func.unnest(Job.dependents).label("id"), seeds.c.root, seeds.c.root_state
    ).where(Job.id == seeds.c.id, Job.dependents.is_not(None))
    doomed = seeds.union(deeper)
    reason = func.concat("dependency ", doomed.c.root, " ended ", doomed.c.root_state, "; not run")
    abandoned = (
        update(Job)
        .where(Job.id == doomed.c.id, _sources(ABANDON))
        .values(
            state=ABANDON.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=reason,
        )
        .returning(Job.id, Job.state)
        .cte("abandoned")
    )
    ready = select(candidates.c.id).where(~unfinished)
    unblocked = (
        update(Job)
        .where(Job.id.in_(ready), _sources(UNBLOCK))
        .values(
            state=UNBLOCK.target,
            run_at=func.greatest(Job.run_at, func.now()),
            updated_at=func.now(),
        )
        .returning(Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("unblocked")
    )
    tickets = _tickets_for(unblocked, "unblocked_tickets")
    return (
        select(abandoned.c.id, abandoned.c.state)
        .union_all(select(unblocked.c.id, unblocked.c.state).where(_woken(tickets)))
        .add_cte(tickets)
    )
