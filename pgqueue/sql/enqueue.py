"""Statements that add jobs: the batched ``INSERT`` over unnested arrays, the one-row insert,
the ``COPY`` of a large batch (ids allocated, tickets inserted and wake-up sent first by one
statement), the lookup of the jobs holding unique keys, and the bookkeeping of jobs that depend
on others.

Every insert gives each new runnable job its ticket and wakes idle workers in the same
statement (``common.tickets_for`` and ``common.woken``).

Bounded queues (``pgqueue_queues.max_depth``): every plain insert carries a guard that inserts
nothing when a queue of its jobs has a bound, so a bound set after a process last looked is
never missed. Jobs of bounded queues are inserted in two statements of one transaction instead:
``lock_bounded_queues`` takes each bounded queue's lock (held to the end of the transaction),
then the ``bounded`` insert counts the queue's waiting jobs, in a snapshot taken after the
lock, and inserts all of the batch or nothing. In one statement the count would be stale: a
statement that waits for a lock still reads the database as of its start.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Integer,
    Select,
    SmallInteger,
    Text,
    bindparam,
    case,
    cast,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import UNIQUE_KEY_HELD, Job, MessageQueue, QueueControl
from pgqueue.sql.common import (
    COPY_TICKET_COLUMNS,
    NOTIFY_CHANNEL,
    array_param,
    in_states,
    listed_by_state,
    seconds,
    tickets_for,
    trace_context_param,
    wake_payload,
    woken,
)
from pgqueue.sql.flow import key_rows, new_job_keys
from pgqueue.states import UNIQUE_KEY_STATES, JobState

# The job columns every enqueue path writes from the caller's values, in the order of its
# parameters.
JOB_FIELDS: Final = ("task_name", "queue", "args", "kwargs", "priority", "max_attempts")

# The states a bounded queue's depth counts: jobs not yet started (scheduled ones are QUEUED
# with a later run_at).
WAITING_STATES: Final = (JobState.QUEUED, JobState.RETRYING, JobState.WAITING)
# The first key of the two-key advisory locks that serialise a bounded queue's enqueuers ("pgqd");
# the second is the hash of the queue's name. Two-key locks never meet pgqueue's one-key
# maintenance locks, and two names with the same hash only share a lock.
QUEUE_LOCK_CLASS: Final = 0x70677164


def waiting_depth(queue: Any, cap: Any) -> ColumnElement[int]:
    """How many jobs of ``queue`` wait (``WAITING_STATES``), counted up to ``cap``: a bound is
    decided by its first ``max_depth`` jobs, however deep the queue. One equality range of the
    ``(queue, state, id)`` index per state: with both columns fixed the planner reads that index,
    while with ``state = ANY(...)`` and a queue it cannot see (a correlated one) it may pick a
    sequential scan over the whole history, and with an ``ORDER BY id`` the primary key."""
    per_state = []
    for state in WAITING_STATES:
        jobs = (
            select(Job.id)
            .where(Job.queue == queue, Job.state == state.value, listed_by_state())
            .limit(cap)
            .correlate(QueueControl)
            .subquery()
        )
        per_state.append(select(func.count()).select_from(jobs).scalar_subquery())
    return func.least(per_state[0] + per_state[1] + per_state[2], cap)


def _no_bound(queue_matches: ColumnElement[bool]) -> ColumnElement[bool]:
    """The guard of the plain inserts: no queue that ``queue_matches`` has a bound. Evaluated
    once per statement (uncorrelated), one probe of the small control table."""
    bounded = select(QueueControl.name).where(queue_matches, QueueControl.max_depth.is_not(None))
    return ~bounded.exists()


def _room_for(queues: ColumnElement[Any]) -> ColumnElement[bool]:
    """The guard of the ``bounded`` insert: every bounded queue among ``queues`` (the batch's,
    one entry per job) is locked by this transaction (named in the bind ``locked_queues``) and
    has room for the batch's jobs of it."""
    entries = func.unnest(queues).table_valued("queue").render_derived(name="asked")
    asked = (
        select(func.count())
        .select_from(entries)
        .where(entries.c.queue == QueueControl.name)
        .scalar_subquery()
    )
    depth = waiting_depth(QueueControl.name, QueueControl.max_depth)
    blocked = select(QueueControl.name).where(
        QueueControl.name == func.any(queues),
        QueueControl.max_depth.is_not(None),
        or_(
            QueueControl.name != func.all(array_param("locked_queues", Text)),
            depth + asked > QueueControl.max_depth,
        ),
    )
    return ~blocked.exists()


def _requested_run_at() -> ColumnElement[Any]:
    """The bind ``run_at`` when given, else ``now()`` plus the bind ``delay`` seconds (or 0)."""
    return func.coalesce(
        bindparam("run_at", type_=Job.run_at.type),
        func.now() + seconds(func.coalesce(bindparam("delay", type_=Float), literal_column("0"))),
    )


@cache
def insert_jobs(
    with_unique_keys: bool,
    with_dependencies: bool = False,
    traced: bool = False,
    bounded: bool = False,
    with_concurrency_keys: bool = False,
) -> Select[Any]:
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

    ``traced`` also binds ``trace_context`` (JSON text, one value for every row: one enqueue
    call runs in one span); untraced jobs leave the column null.

    Without ``bounded`` nothing is inserted (no rows come back) when a queue of the batch has a
    bound. With ``bounded`` (after ``lock_bounded_queues``) it also binds ``locked_queues``
    (array): nothing is inserted unless every bounded queue of the batch is among them and has
    room for all of the batch's jobs of it.
    ``with_concurrency_keys`` also binds ``concurrency_keys`` (may be null) and ``key_limits``
    (the task's limit, may be null): keyed jobs and their tickets carry the key, and each new
    key gets its row (``sql.flow.key_rows``).
    """
    rows = (
        func.unnest(
            array_param("task_names", Text),
            array_param("queues", Text),
            array_param("args", Text),
            array_param("kwargs", Text),
            array_param("priorities", SmallInteger),
            array_param("max_attempts", Integer),
            array_param("delays", Float),
            array_param("run_ats", Text),
            array_param("unique_keys", Text),
            array_param("atomics", Boolean),
        )
        .table_valued(
            *JOB_FIELDS,
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
        func.now() + seconds(func.coalesce(rows.c.delay, 0.0)),
    )
    extra_columns: list[str] = []
    extra_values: list[Any] = []
    if with_dependencies:
        deps = (
            func.unnest(
                array_param("states", Text),
                array_param("depends_ons", Text),
                array_param("reasons", Text),
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
    if traced:
        extra_columns.append("trace_context")
        extra_values.append(trace_context_param())
    keys: Any = None
    if with_concurrency_keys:
        keys = new_job_keys()
        extra_columns.append("concurrency_key")
        extra_values.append(keys.c.concurrency_key)
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
    queues = array_param("queues", Text)
    if bounded:
        source = source.where(_room_for(queues))
    else:
        source = source.where(_no_bound(QueueControl.name == func.any(queues)))
    if with_dependencies:
        source = source.where(rows_deps.c.ord == rows.c.ord)
    if keys is not None:
        source = source.where(keys.c.ord == rows.c.ord)
    columns = [
        *JOB_FIELDS,
        "run_at",
        "unique_key",
        "atomic",
        *extra_columns,
    ]
    stmt = pg_insert(Job).from_select(columns, source)
    if with_unique_keys:
        stmt = stmt.on_conflict_do_nothing(
            index_elements=[Job.unique_key],
            # The index's own predicate, as text: a generic plan of the prepared insert cannot
            # infer the partial index from bound state values (42P10).
            index_where=text(UNIQUE_KEY_HELD),
        )
    returned = [
        Job.id,
        Job.queue,
        Job.priority,
        Job.run_at,
        Job.unique_key,
        Job.atomic,
        Job.state,
        Job.depends_on,
    ]
    if keys is not None:
        returned.append(Job.concurrency_key)
    jobs = stmt.returning(*returned).cte("new_jobs")
    only_queued = [jobs.c.state == JobState.QUEUED.value] if with_dependencies else []
    tickets = tickets_for(jobs, "new_tickets", *only_queued)
    also = [tickets]
    if keys is not None:
        also.extend(key_rows(select(keys.c.concurrency_key, keys.c.key_limit).subquery("keyed")))
    # Referencing the ticket CTE is not needed for it to run (data-modifying CTEs always run),
    # but keeping it in the FROM list documents the dependency and keeps SQLAlchemy rendering it.
    if with_dependencies:
        return (
            select(jobs.c.id, jobs.c.unique_key, jobs.c.state, jobs.c.depends_on)
            .add_cte(*also)
            .where(woken(tickets))
            .order_by(jobs.c.id)
        )
    return (
        select(jobs.c.id, jobs.c.unique_key)
        .add_cte(*also)
        .where(woken(tickets))
        .order_by(jobs.c.id)
    )


@cache
def insert_one_job(traced: bool = False) -> Select[int]:
    """Insert one job (no unique key, no dependencies) and its ticket; returns its id.

    The single-row form of ``insert_jobs``: plain ``VALUES`` binds instead of ``unnest`` over ten
    one-element arrays, for the common ``task.enqueue(...)`` outside any caller transaction.
    Binds ``task_name``, ``queue``, ``args`` and ``kwargs`` (JSON text), ``priority``,
    ``max_attempts``, ``delay`` (seconds from now(), may be null), ``run_at`` (absolute, may be
    null) and ``atomic``; ``traced`` also ``trace_context`` (JSON text). Inserts nothing, and
    returns no row, when the queue has a bound.
    """
    values: dict[str, Any] = {
        "task_name": bindparam("task_name", type_=Text),
        "queue": bindparam("queue", type_=Text),
        "args": cast(bindparam("args", type_=Text), JSON),
        "kwargs": cast(bindparam("kwargs", type_=Text), JSON),
        "priority": bindparam("priority", type_=SmallInteger),
        "max_attempts": bindparam("max_attempts", type_=Integer),
        "run_at": _requested_run_at(),
        "atomic": bindparam("atomic", type_=Boolean),
    }
    if traced:
        values["trace_context"] = trace_context_param()
    unbounded = _no_bound(QueueControl.name == bindparam("queue", type_=Text))
    job = (
        insert(Job)
        .from_select(list(values), select(*values.values()).where(unbounded))
        .returning(Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic)
        .cte("new_job")
    )
    ticket = tickets_for(job, "new_ticket")
    return select(job.c.id).add_cte(ticket).where(woken(ticket))


@cache
def allocate_jobs_with_tickets() -> Select[Any, Any]:
    """One row: an array of ``n`` new job ids from the jobs' identity sequence, ascending, and
    the batch's run_at (``run_at`` if given, else ``now()`` plus ``delay`` seconds); for
    ``COPY`` of a large batch of jobs that share their queue, priority and atomic flag (binds
    ``queue``, ``priority``, ``atomic``), which cannot evaluate defaults per row. The same
    statement inserts the batch's tickets from those ids and sends the wake-up (``woken``,
    delivered at commit): a ticket is only an id and the batch's shared values, so it needs no
    second COPY stream from the client. The tickets precede their jobs' rows by a statement of
    the same transaction; nothing outside it sees either before the commit. Binds ``n``,
    ``run_at``, ``delay``.

    The sequence is looked up once, as a ``regclass`` (an InitPlan): as ``nextval``'s argument
    the lookup and the text-to-regclass cast would run per id and cost most of each id.

    When ``queue`` has a bound nothing is allocated or inserted (the array is null), and the
    batch goes to the checked insert."""
    sequence = select(
        cast(func.pg_get_serial_sequence(literal(Job.__tablename__), literal("id")), REGCLASS)
    ).scalar_subquery()
    series = (
        func.generate_series(1, bindparam("n", type_=Integer))
        .table_valued("i")
        .render_derived(name="series")
    )
    queue = bindparam("queue", type_=Text)
    run_at = _requested_run_at()
    unbounded = _no_bound(QueueControl.name == queue)
    # Materialised (read twice, and volatile): each id is drawn once, in the series' order.
    ids = (
        select(func.nextval(sequence).label("id"))
        .select_from(series)
        .where(unbounded)
        .order_by(series.c.i)
        .cte("new_ids")
    )
    # Every ticket of the batch carries the same values but its id: they are binds, not columns
    # of the id rows, and the wake-up is one NOTIFY of the batch's queue and run_at, not an
    # aggregate over the new tickets (``woken``). Nothing reads the insert: it runs anyway.
    shared = (
        bindparam("priority", type_=SmallInteger),
        run_at,
        bindparam("atomic", type_=Boolean),
    )
    tickets = (
        insert(MessageQueue)
        .from_select(list(COPY_TICKET_COLUMNS), select(ids.c.id, queue, *shared))
        .cte("new_tickets")
    )
    woken_once = (
        select(func.count(func.pg_notify(NOTIFY_CHANNEL, wake_payload(queue, run_at))))
        .where(unbounded)
        .scalar_subquery()
    )
    # The ids in the order the CTE holds them, drawn ascending (the caller sorts to be sure:
    # an ORDER BY here would sort on the server).
    return select(func.array_agg(ids.c.id), run_at).add_cte(tickets).where(woken_once >= 0)


@cache
def copy_jobs(traced: bool = False) -> Any:
    """``COPY pgqueue_jobs (...) FROM STDIN`` for a batch with allocated ids (a psycopg
    ``sql.Composed``: COPY has no SQLAlchemy construct). Rows: ``COPY_JOB_COLUMNS``, and with
    ``traced`` a last column ``trace_context`` (JSON text)."""
    return _copy(Job.__tablename__, COPY_JOB_COLUMNS + (("trace_context",) if traced else ()))


COPY_JOB_COLUMNS: Final = ("id", *JOB_FIELDS, "run_at", "atomic")


def _copy(table: str, columns: tuple[str, ...]) -> Any:
    """``COPY table (columns) FROM STDIN``, composed by psycopg (identifiers quoted)."""
    from psycopg import sql  # only the COPY statements need psycopg's SQL composition

    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


@cache
def active_job_ids_by_unique_key() -> Select[int, str | None, int | None]:
    """``(id, unique_key, workflow_id)`` of the jobs holding the given ``unique_keys`` (array):
    those not ended (``states.UNIQUE_KEY_STATES``, the unique index's predicate)."""
    return select(Job.id, Job.unique_key, Job.workflow_id).where(
        Job.unique_key == func.any(array_param("unique_keys", Text)),
        in_states(Job.state, UNIQUE_KEY_STATES),
    )


@cache
def lock_dependencies() -> Select[int, str]:
    """``(id, state)`` of the jobs ``ids`` (array), locked until the enqueuing transaction ends.

    The lock makes a dependency's outcome statement wait for the new dependent to commit; that
    statement then re-reads the row's newest version, ``dependents`` included, so a dependency
    finishing during the enqueue still releases (or cancels) the new job.
    """
    return (
        select(Job.id, Job.state)
        .where(Job.id == func.any(array_param("ids", BigInteger)))
        .order_by(Job.id)
        .with_for_update(key_share=True)
    )


@cache
def add_dependents() -> Any:
    """Append dependents to their dependencies' ``dependents`` arrays. Binds parallel arrays
    ``dependency_ids`` and ``dependent_ids`` (one pair per edge)."""
    edges = (
        func.unnest(
            array_param("dependency_ids", BigInteger), array_param("dependent_ids", BigInteger)
        )
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


# --- bounded queues ---------------------------------------------------------------------------


@cache
def lock_bounded_queues() -> Select[Any]:
    """``(name, max_depth, transaction isolation)`` of each bounded queue among ``queues``
    (array), by name, each queue's advisory lock taken in that order (held until the
    transaction ends; the lock is evaluated after the sort, so two batches never wait for each
    other's queues crosswise). An advisory lock, not the control row's: the claim and the
    outcomes write that row of a limited queue, and must not wait for a caller's transaction."""
    lock = func.pg_advisory_xact_lock(
        literal(QUEUE_LOCK_CLASS, Integer), func.hashtext(QueueControl.name)
    )
    return (
        select(
            QueueControl.name,
            QueueControl.max_depth,
            func.current_setting(literal("transaction_isolation")),
            lock,
        )
        .where(
            QueueControl.name == func.any(array_param("queues", Text)),
            QueueControl.max_depth.is_not(None),
        )
        .order_by(QueueControl.name)
    )


@cache
def queue_depths() -> Select[str, int | None, int]:
    """``(name, max_depth, depth)`` of each bounded queue among ``queues`` (array), by name;
    ``depth`` counts its waiting jobs up to one more than ``max_depth``."""
    return (
        select(
            QueueControl.name,
            QueueControl.max_depth,
            waiting_depth(QueueControl.name, QueueControl.max_depth + 1),
        )
        .where(
            QueueControl.name == func.any(array_param("queues", Text)),
            QueueControl.max_depth.is_not(None),
        )
        .order_by(QueueControl.name)
    )


@cache
def any_bound() -> Select[bool]:
    """Whether any queue among ``queues`` (array) has a bound."""
    return select(~_no_bound(QueueControl.name == func.any(array_param("queues", Text))))


@cache
def set_max_depth() -> Any:
    """Create or update a queue's control row with its bound. Binds ``name`` and ``max_depth``
    (null removes the bound)."""
    stmt = pg_insert(QueueControl).values(
        name=bindparam("name", type_=Text),
        max_depth=bindparam("max_depth", type_=Integer),
        updated_at=func.now(),
    )
    return stmt.on_conflict_do_update(
        index_elements=[QueueControl.name],
        set_={"max_depth": stmt.excluded.max_depth, "updated_at": stmt.excluded.updated_at},
    )
