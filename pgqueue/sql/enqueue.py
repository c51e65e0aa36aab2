"""Statements that add jobs: the plan's (ids drawn first, rows by one ``INSERT`` over unnested
arrays or by ``COPY`` and then the tickets of its roots, a workflow's row), the one-row insert,
the savepoint of a plan that refuses held unique keys and the lookup of the keys' holders, the
bookkeeping of jobs that depend on existing ones, and the bounded queues' locks and depths. A
plan with no parents, roles or dependencies draws its ids in the statement that inserts its
rows (``insert_rows`` ``drawn``), or, by ``COPY``, in the one that inserts its tickets
(``allocate_with_tickets``).

Every insert gives each new runnable job its ticket and wakes idle workers in the statement
that writes the ticket (``common.tickets_for`` and ``common.woken``).

Bounded queues (``pgqueue_queues.max_depth``): ``allocate`` says whether a queue of the plan has
a bound, and the writer then reserves room with ``sql.queue_bounds``'s statements before the rows
go in. The one-row insert and the plain plan's statements carry a guard instead (``_no_bound``):
they write nothing into a bounded queue, and those jobs then go the way of ``allocate``.
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
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import UNIQUE_KEY_HELD, Job, MessageQueue, QueueControl, Workflow
from pgqueue.sql.common import (
    COPY_TICKET_COLUMNS,
    NOTIFY_CHANNEL,
    array_param,
    in_states,
    seconds,
    tickets_for,
    trace_context_param,
    wake_payload,
    woken,
)
from pgqueue.sql.flow import key_rows, new_job_keys
from pgqueue.states import UNIQUE_KEY_STATES, JobState


def _no_bound(queue_matches: ColumnElement[bool]) -> ColumnElement[bool]:
    """The guard of the plain inserts: no queue that ``queue_matches`` has a bound. Evaluated
    once per statement (uncorrelated), one probe of the small control table."""
    bounded = select(QueueControl.name).where(queue_matches, QueueControl.max_depth.is_not(None))
    return ~bounded.exists()


def _requested_run_at() -> ColumnElement[Any]:
    """The bind ``run_at`` when given, else ``now()`` plus the bind ``delay`` seconds (or 0)."""
    return func.coalesce(
        bindparam("run_at", type_=Job.run_at.type),
        func.now() + seconds(func.coalesce(bindparam("delay", type_=Float), literal_column("0"))),
    )


# The columns every job row takes from its ``NewJob``, with the type each is bound as (JSON
# arguments as text). The one-row insert binds them as values, the plan insert as arrays, and
# COPY writes them (``data.enqueue.JOB_VALUES`` names the ``NewJob`` field of each).
JOB_COLUMNS: Final[dict[str, Any]] = {
    "task_name": Text,
    "queue": Text,
    "args": Text,
    "kwargs": Text,
    "priority": SmallInteger,
    "max_attempts": Integer,
    "atomic": Boolean,
}
# The columns a plan's rows may carry besides (``insert_rows``), with their bound types:
# ``delay`` and ``run_at`` (ISO text) make the row's ``run_at``; id arrays are literals.
PLAN_COLUMNS: Final[dict[str, Any]] = {
    "id": BigInteger,
    "delay": Float,
    "run_at": Text,
    "unique_key": Text,
    "state": Text,
    "depends_on": Text,
    "last_error": Text,
    "dependents": Text,
    "pending_dependencies": Integer,
    "workflow_role": SmallInteger,
}
_AS_COLUMN: Final[dict[str, Any]] = {
    "args": JSON,
    "kwargs": JSON,
    "depends_on": ARRAY(BigInteger),
    "dependents": ARRAY(BigInteger),
}


@cache
def allocate_with_tickets() -> Select[Any]:
    """``allocate``'s row for a plan with no parents, roles or dependencies that goes by
    ``COPY``, whose jobs all share queue ``queue``, ``priority`` and ``atomic``; the same
    statement inserts their tickets and sends the wake-up, so the plan costs this statement
    and its ``COPY``. A ticket is an id and those shared values, so it needs no second COPY
    stream; it precedes its job's row by a statement of the same transaction, and nothing
    outside that sees either before the commit. When ``queue`` has a bound nothing is drawn
    or inserted (the ids are an empty array), and the plan goes the way of ``allocate``.
    Binds ``n``, ``queue``, ``priority``, ``atomic``, ``run_at``, ``delay``."""
    series = (
        func.generate_series(1, bindparam("n", type_=Integer))
        .table_valued("i")
        .render_derived(name="series")
    )
    queue = bindparam("queue", type_=Text)
    unbounded = _no_bound(QueueControl.name == queue)
    run_at = _requested_run_at()
    # Read twice and volatile, hence materialised: each id is drawn once.
    ids = (
        select(func.nextval(_sequence(Job)).label("id"))
        .select_from(series)
        .where(unbounded)
        .order_by(series.c.i)
        .cte("new_ids")
    )
    shared = (
        queue,
        bindparam("priority", type_=SmallInteger),
        run_at,
        bindparam("atomic", type_=Boolean),
    )
    tickets = (
        insert(MessageQueue)
        .from_select(list(COPY_TICKET_COLUMNS), select(ids.c.id, *shared))
        .cte("new_tickets")
    )
    # One NOTIFY of the plan's queue and run_at, not ``woken``'s aggregate over the tickets:
    # they all share both. Nothing reads the insert: it runs anyway.
    woken_once = (
        select(func.count(func.pg_notify(NOTIFY_CHANNEL, wake_payload(queue, run_at))))
        .where(unbounded)
        .scalar_subquery()
    )
    return (
        select(
            func.array(select(ids.c.id).scalar_subquery()),
            null(),
            ~unbounded,
            run_at,
        )
        .add_cte(tickets)
        .where(woken_once >= 0)
    )


@cache
def allocate(workflow: bool = False) -> Select[Any]:
    """One row: ``n`` new job ids from the jobs' identity sequence (an array, ascending), a new
    workflow id when ``workflow`` (else null), whether a queue among ``queues`` (array) has a
    bound, and the run_at of jobs due ``run_at`` or ``delay`` seconds from now (what COPY
    writes). Binds ``n``, ``queues``, ``run_at``, ``delay``.

    The bound is read here, one probe of the small control table in a statement the plan runs
    anyway, so an unbounded queue costs nothing more. The sequences are looked up once, as a
    ``regclass`` (an InitPlan): as ``nextval``'s argument the lookup and the text-to-regclass
    cast would run per id and cost most of each id."""
    series = (
        func.generate_series(1, bindparam("n", type_=Integer))
        .table_valued("i")
        .render_derived(name="series")
    )
    ids = select(func.nextval(_sequence(Job))).select_from(series).order_by(series.c.i)
    bounded = select(QueueControl.name).where(
        QueueControl.name == func.any(array_param("queues", Text)),
        QueueControl.max_depth.is_not(None),
    )
    return select(
        func.array(ids.scalar_subquery()),
        func.nextval(_sequence(Workflow)) if workflow else null(),
        bounded.exists(),
        _requested_run_at(),
    )


def _sequence(model: Any) -> Any:
    """The identity sequence of ``model``'s ``id``, as a ``regclass``."""
    name = func.pg_get_serial_sequence(literal(model.__tablename__), literal("id"))
    return select(cast(name, REGCLASS)).scalar_subquery()


@cache
def insert_rows(
    columns: tuple[str, ...],
    traced: bool = False,
    workflow: bool = False,
    with_concurrency_keys: bool = False,
    drawn: bool = False,
) -> Select[Any]:
    """Insert a plan's rows, with the ids ``allocate`` drew, and the tickets of those QUEUED
    (their wake-up sent); returns the inserted ids.

    ``drawn``, for a plan with no parents, roles or dependencies (``columns`` without ``id``):
    the statement draws the ids itself, one per row in the rows' order, and carries the bound
    queues' guard (``_no_bound``): when a queue of the plan has a bound it draws and inserts
    nothing. One row then comes back: the drawn ids (an array, empty when the guard stopped
    it), and with ``unique_key`` the inserted ones (an array). The plan thus costs one
    statement, and a bounded queue is still never written past its bound: its plan goes the
    way of ``allocate``.

    Binds one array per name of ``columns`` (``JOB_COLUMNS``, then those of ``PLAN_COLUMNS``
    the plan fills), one entry per row. With ``state``, a CANCELLED row is finished now. With
    ``unique_key``, a row whose key is held by a job that has not ended is skipped (``ON
    CONFLICT DO NOTHING`` on the partial unique index) and gets no ticket, so its id does not
    come back; keyed rows go in in key order, so two plans sharing keys wait for each other on
    their first common key, never crosswise. ``traced`` binds ``trace_context`` (JSON text, the
    enqueuing span's, one value for every row); ``workflow`` binds ``workflow_id``;
    ``with_concurrency_keys`` binds ``concurrency_keys`` and ``key_limits`` (the task's limit,
    may be null): keyed rows and their tickets carry the key, and each new key gets its row
    (``sql.flow.key_rows``)."""
    arrays = {c: array_param(c, _BOUND[c]) for c in columns}
    rows: Any = (
        func.unnest(*arrays.values())
        .table_valued(*columns, with_ordinality="ord")
        .render_derived(name="r")
    )
    names: list[str] = []
    values: list[Any] = []
    if drawn:
        # A CTE (volatile, so materialised): each row's id is drawn once, as the unnest yields
        # the rows, so the ids ascend in the plan's order whatever order the rows go in.
        unbounded = _no_bound(QueueControl.name == func.any(arrays["queue"]))
        rows = (
            select(*rows.c, func.nextval(_sequence(Job)).label("id"))
            .where(unbounded)
            .cte("plan_rows")
        )
        names.append("id")
        values.append(rows.c.id)
    for name in columns:
        if name == "delay":
            continue
        value: Any = rows.c[name]
        if name == "run_at":
            value = func.coalesce(
                cast(value, Job.run_at.type),
                func.now() + seconds(func.coalesce(rows.c.delay, literal_column("0"))),
            )
        elif name in _AS_COLUMN:
            value = cast(value, _AS_COLUMN[name])
        names.append(name)
        values.append(value)
    if "state" in columns:
        names.append("finished_at")
        values.append(case((rows.c.state == JobState.CANCELLED.value, func.now()), else_=null()))
    if workflow:
        names.append("workflow_id")
        values.append(bindparam("workflow_id", type_=BigInteger))
    if traced:
        names.append("trace_context")
        values.append(trace_context_param())
    source = select(*values)
    keys: Any = None
    if with_concurrency_keys:
        keys = new_job_keys()
        names.append("concurrency_key")
        source = source.add_columns(keys.c.concurrency_key).where(keys.c.ord == rows.c.ord)
    if "unique_key" in columns:
        source = source.order_by(rows.c.unique_key.asc().nulls_last(), rows.c.ord)
    inserted = pg_insert(Job).from_select(names, source)
    if "unique_key" in columns:
        inserted = inserted.on_conflict_do_nothing(
            index_elements=[Job.unique_key],
            # The index's own predicate, as text: a generic plan of the prepared insert cannot
            # infer the partial index from bound state values (42P10).
            index_where=text(UNIQUE_KEY_HELD),
        )
    returned = [Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.state]
    if keys is not None:
        returned.append(Job.concurrency_key)
    jobs = inserted.returning(*returned).cte("new_jobs")
    tickets = tickets_for(jobs, "new_tickets", jobs.c.state == JobState.QUEUED.value)
    also = [tickets]
    if keys is not None:
        also.extend(key_rows(select(keys.c.concurrency_key, keys.c.key_limit).subquery("keyed")))
    # Data-modifying CTEs run whether read or not; ``woken`` reads the tickets' (see there).
    if not drawn:
        return select(jobs.c.id).add_cte(*also).where(woken(tickets))
    answer = [func.array(select(rows.c.id).scalar_subquery())]
    if "unique_key" in columns:
        answer.append(func.array(select(jobs.c.id).scalar_subquery()))
    return select(*answer).add_cte(*also).where(woken(tickets))


_BOUND: Final[dict[str, Any]] = {**JOB_COLUMNS, **PLAN_COLUMNS}


def copy_jobs(columns: tuple[str, ...]) -> Any:
    """``COPY pgqueue_jobs (columns) FROM STDIN`` (a psycopg ``sql.Composed``: COPY has no
    SQLAlchemy construct), for a plan whose rows ``data.copy_rows.lines`` formats."""
    from psycopg import sql  # only the COPY statement needs psycopg's SQL composition

    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(Job.__tablename__), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )


@cache
def insert_tickets() -> Select[Any]:
    """Tickets for the jobs ``ids`` (array), all of queue ``queue``, ``priority``, ``run_at``
    and ``atomic``: the plan's jobs with no parent after their ``COPY``; sends the wake-up. A
    ticket is an id and values the plan's roots share, so no second COPY stream is needed."""
    ids = func.unnest(array_param("ids", BigInteger)).table_valued("id").render_derived("r")
    shared = (
        bindparam("queue", type_=Text),
        bindparam("priority", type_=SmallInteger),
        bindparam("run_at", type_=Job.run_at.type),
        bindparam("atomic", type_=Boolean),
    )
    tickets = (
        insert(MessageQueue)
        .from_select(list(COPY_TICKET_COLUMNS), select(ids.c.id, *shared))
        .returning(MessageQueue.queue, MessageQueue.run_at)
        .cte("root_tickets")
    )
    return select(func.count()).select_from(tickets).where(woken(tickets))


@cache
def insert_workflow() -> Any:  # a ReturningInsert
    """A workflow's row, after its jobs. Binds ``id``, ``final_job_ids`` (array),
    ``closing_job_id``, ``on_failure_job_id`` (may be null) and ``job_count``."""
    return (
        insert(Workflow)
        .values(
            id=bindparam("id", type_=BigInteger),
            final_job_ids=array_param("final_job_ids", BigInteger),
            closing_job_id=bindparam("closing_job_id", type_=BigInteger),
            on_failure_job_id=bindparam("on_failure_job_id", type_=BigInteger),
            job_count=bindparam("job_count", type_=Integer),
        )
        .returning(Workflow.id)
    )


# The savepoint around a plan that refuses held unique keys: when a key is held the insert is
# undone whole, and the caller's transaction stays usable (no unique violation is raised).


@cache
def savepoint() -> Any:
    """``SAVEPOINT`` before the insert of a plan that refuses held keys."""
    return text("SAVEPOINT pgqueue_plan_keys")


@cache
def rollback_to_savepoint() -> Any:
    """Undo the insert since ``savepoint``; ``release_savepoint`` then ends it."""
    return text("ROLLBACK TO SAVEPOINT pgqueue_plan_keys")


@cache
def release_savepoint() -> Any:
    """End ``savepoint``, keeping what was written since (or nothing, after the rollback)."""
    return text("RELEASE SAVEPOINT pgqueue_plan_keys")


@cache
def insert_one_job(traced: bool = False) -> Select[int]:
    """Insert one job (no unique key, no dependencies) and its ticket; returns its id.

    The one insert outside the plan's statements: plain ``VALUES`` binds and no ids drawn
    first, one round trip for the common ``task.enqueue(...)``. Binds ``JOB_COLUMNS``, ``delay``
    (seconds from now(), may be null) and ``run_at`` (absolute, may be null); ``traced`` also
    ``trace_context`` (JSON text). Inserts nothing, and returns no row, when the queue has a
    bound: that job then goes in as a plan.
    """
    values: dict[str, Any] = {
        name: bindparam(name, type_=bound) for name, bound in JOB_COLUMNS.items()
    }
    values.update((name, cast(values[name], JSON)) for name in ("args", "kwargs"))
    values["run_at"] = _requested_run_at()
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
