"""Statements that insert a workflow (``chain``/``group``/``chord``): drawing the ids of its
jobs, inserting its jobs (with their edges, countdowns and roles, tickets for those with no
parent) in one statement or a ``COPY``, then its row; and the savepoint a workflow with unique
keys is inserted under. Closing, settling, reading and cancelling one: ``sql.workflows``.

A workflow's jobs are inserted knowing each other's ids (drawn first from the jobs' identity):
every edge is written on both rows at once (``depends_on``, ``dependents``), so no dependency
row is locked or updated after the insert, and only the jobs with no dependency get a ticket.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Integer,
    Select,
    SmallInteger,
    Text,
    bindparam,
    cast,
    func,
    insert,
    literal,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert

from pgqueue.models import UNIQUE_KEY_HELD, Job, MessageQueue, QueueControl, Workflow
from pgqueue.sql.common import (
    array_param,
    seconds,
    tickets_for,
    trace_context_param,
    woken,
)
from pgqueue.sql.flow import key_rows, new_job_keys
from pgqueue.states import JobState


@cache
def allocate_ids() -> Select[Any]:
    """One row: an array of ``n`` new job ids from the jobs' identity sequence, ascending, a
    new workflow id, whether a queue among ``queues`` (array) has a bound (a workflow does not
    go to bounded queues: then nothing else matters), and the run_at of jobs due ``run_at`` or
    ``delay`` seconds from now (for the ``COPY`` insert). Binds ``n``, ``queues``, ``run_at``,
    ``delay``."""
    sequence = select(
        cast(func.pg_get_serial_sequence(literal(Job.__tablename__), literal("id")), REGCLASS)
    ).scalar_subquery()
    workflow_sequence = select(
        cast(func.pg_get_serial_sequence(literal(Workflow.__tablename__), literal("id")), REGCLASS)
    ).scalar_subquery()
    series = (
        func.generate_series(1, bindparam("n", type_=Integer))
        .table_valued("i")
        .render_derived(name="series")
    )
    ids = select(func.nextval(sequence).label("id")).select_from(series).order_by(series.c.i)
    bounded = select(QueueControl.name).where(
        QueueControl.name == func.any(array_param("queues", Text)),
        QueueControl.max_depth.is_not(None),
    )
    run_at = func.coalesce(
        bindparam("run_at", type_=Job.run_at.type),
        func.now() + seconds(func.coalesce(bindparam("delay", type_=Float), literal(0.0))),
    )
    return select(
        func.array(ids.scalar_subquery()),
        func.nextval(workflow_sequence).label("workflow_id"),
        bounded.exists(),
        run_at,
    )


# The columns ``insert_jobs`` writes, in the order of its values.
_INSERT_JOB_COLUMNS = (
    "id",
    "task_name",
    "queue",
    "args",
    "kwargs",
    "priority",
    "max_attempts",
    "run_at",
    "atomic",
    "state",
    "depends_on",
    "dependents",
    "pending_dependencies",
    "workflow_role",
    "workflow_id",
)


# The columns of ``copy_jobs``' lines: those that differ from job to job first, so that a line
# is its job's own fields followed by a tail its workflow's jobs mostly share
# (``data.copy_rows.workflow_lines``).
COPY_JOB_COLUMNS = (
    "id",
    "args",
    "kwargs",
    "depends_on",
    "pending_dependencies",
    "dependents",
    "task_name",
    "queue",
    "priority",
    "max_attempts",
    "run_at",
    "atomic",
    "state",
    "workflow_role",
    "workflow_id",
)


def copy_jobs(traced: bool = False) -> Any:
    """``COPY pgqueue_jobs (COPY_JOB_COLUMNS) FROM STDIN``, for a large workflow whose jobs
    share their ``run_at`` (a psycopg ``sql.Composed``: COPY has no SQLAlchemy construct);
    ``traced`` adds a last column ``trace_context`` (JSON text)."""
    from psycopg import sql  # only the COPY statements need psycopg's SQL composition

    columns = COPY_JOB_COLUMNS + (("trace_context",) if traced else ())
    return sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(Job.__tablename__),
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
    )


@cache
def insert_tickets() -> Select[Any]:
    """Tickets for the jobs ``ids`` (array), all of queue ``queue``, ``priority``, ``run_at``
    and ``atomic``: the first jobs of a workflow written by ``copy_jobs``; sends the wake-up."""
    ids = func.unnest(array_param("ids", BigInteger)).table_valued("id").render_derived("r")
    tickets = (
        insert(MessageQueue)
        .from_select(
            ["job_id", "queue", "priority", "run_at", "atomic"],
            select(
                ids.c.id,
                bindparam("queue", type_=Text),
                bindparam("priority", type_=SmallInteger),
                bindparam("run_at", type_=Job.run_at.type),
                bindparam("atomic", type_=Boolean),
            ),
        )
        .returning(MessageQueue.queue, MessageQueue.run_at)
        .cte("root_tickets")
    )
    return select(func.count()).select_from(tickets).where(woken(tickets))


@cache
def insert_workflow() -> Any:  # a ReturningInsert
    """The workflow's row. Binds ``id``, ``final_job_ids`` (array), ``closing_job_id``,
    ``on_failure_job_id`` (may be null) and ``job_count``; returns its id."""
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


@cache
def insert_jobs(
    with_concurrency_keys: bool = False,
    room_reserved: bool = False,
    traced: bool = False,
    with_unique_keys: bool = False,
) -> Select[Any]:
    """Insert a workflow's jobs, with the ids ``allocate_ids`` drew, and tickets for those
    QUEUED; returns the inserted ids. Without ``room_reserved`` (the bounded queues' locks
    taken and their depths counted in this transaction), none when a queue of the batch has a
    bound: one set since ``allocate_ids`` looked.

    Binds parallel arrays ``ids``, ``task_names``, ``queues``, ``args`` and ``kwargs`` (JSON
    text), ``priorities``, ``max_attempts``, ``delays`` (seconds from now(), may be null),
    ``run_ats`` (absolute, may be null), ``atomics``, ``states`` (QUEUED or WAITING),
    ``depends_ons`` and ``dependents`` (``'{1,2}'`` array literals or null), ``pendings`` (the
    countdowns) and ``roles``; and ``workflow_id``. ``with_concurrency_keys`` also binds
    ``concurrency_keys`` and ``key_limits`` (see ``sql.enqueue.insert_jobs``); ``traced``
    ``trace_context`` (JSON text, the enqueuing span's, one value for every job).
    ``with_unique_keys`` also binds ``unique_keys`` (may be null): a job whose key is held by a
    job that has not ended is skipped (``ON CONFLICT DO NOTHING`` on the partial unique index)
    and gets no ticket, so fewer ids come back; the caller then rolls back to its savepoint.
    Keyed rows go in in key order, so two workflows sharing keys wait for each other on their
    first common key, never crosswise."""
    rows = (
        func.unnest(
            array_param("ids", BigInteger),
            array_param("task_names", Text),
            array_param("queues", Text),
            array_param("args", Text),
            array_param("kwargs", Text),
            array_param("priorities", SmallInteger),
            array_param("max_attempts", Integer),
            array_param("delays", Float),
            array_param("run_ats", Text),
            array_param("atomics", Boolean),
            array_param("states", Text),
            array_param("depends_ons", Text),
            array_param("dependents", Text),
            array_param("pendings", Integer),
            array_param("roles", SmallInteger),
        )
        .table_valued(
            "id",
            "task_name",
            "queue",
            "args",
            "kwargs",
            "priority",
            "max_attempts",
            "delay",
            "run_at",
            "atomic",
            "state",
            "depends_on",
            "dependents",
            "pending",
            "role",
            with_ordinality="ord",
        )
        .render_derived(name="r")
    )
    run_at = func.coalesce(
        cast(rows.c.run_at, Job.run_at.type),
        func.now() + seconds(func.coalesce(rows.c.delay, 0.0)),
    )
    columns = list(_INSERT_JOB_COLUMNS)
    values: list[Any] = [
        rows.c.id,
        rows.c.task_name,
        rows.c.queue,
        cast(rows.c.args, JSON),
        cast(rows.c.kwargs, JSON),
        rows.c.priority,
        rows.c.max_attempts,
        run_at,
        rows.c.atomic,
        rows.c.state,
        cast(rows.c.depends_on, ARRAY(BigInteger)),
        cast(rows.c.dependents, ARRAY(BigInteger)),
        rows.c.pending,
        rows.c.role,
        bindparam("workflow_id", type_=BigInteger),
    ]
    if traced:
        columns.append("trace_context")
        values.append(trace_context_param())
    keys: Any = None
    if with_concurrency_keys:
        keys = new_job_keys()
        columns.append("concurrency_key")
        values.append(keys.c.concurrency_key)
    unique: Any = None
    order: list[Any] = [rows.c.ord]
    if with_unique_keys:
        unique = (
            func.unnest(array_param("unique_keys", Text))
            .table_valued("unique_key", with_ordinality="ord")
            .render_derived(name="u")
        )
        columns.append("unique_key")
        values.append(unique.c.unique_key)
        order = [unique.c.unique_key.asc().nulls_last(), rows.c.ord]
    bounded = select(QueueControl.name).where(
        QueueControl.name == func.any(array_param("queues", Text)),
        QueueControl.max_depth.is_not(None),
    )
    source = select(*values).order_by(*order)
    if unique is not None:
        source = source.where(unique.c.ord == rows.c.ord)
    if not room_reserved:
        source = source.where(~bounded.exists())
    if keys is not None:
        source = source.where(keys.c.ord == rows.c.ord)
    returned = [Job.id, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.state]
    if keys is not None:
        returned.append(Job.concurrency_key)
    inserted = pg_insert(Job).from_select(columns, source)
    if with_unique_keys:
        inserted = inserted.on_conflict_do_nothing(
            index_elements=[Job.unique_key],
            # The index's own predicate, as text (see ``sql.enqueue.insert_jobs``).
            index_where=text(UNIQUE_KEY_HELD),
        )
    jobs = inserted.returning(*returned).cte("new_jobs")
    tickets = tickets_for(jobs, "new_tickets", jobs.c.state == JobState.QUEUED.value)
    also = [tickets]
    if keys is not None:
        also.extend(key_rows(select(keys.c.concurrency_key, keys.c.key_limit).subquery("keyed")))
    return select(jobs.c.id).add_cte(*also).where(woken(tickets))


# A savepoint (``pgqueue_workflow_keys``) around the insert of a workflow with unique keys:
# when a key is held the insert is undone whole, and the caller's transaction stays usable (no
# unique violation is ever raised).


@cache
def savepoint() -> Any:
    """``SAVEPOINT`` before the insert of a workflow with unique keys."""
    return text("SAVEPOINT pgqueue_workflow_keys")


@cache
def rollback_to_savepoint() -> Any:
    """Undo the insert since ``savepoint`` (a member's unique key was held); ``release_savepoint``
    then ends it."""
    return text("ROLLBACK TO SAVEPOINT pgqueue_workflow_keys")


@cache
def release_savepoint() -> Any:
    """End ``savepoint``, keeping what was written since (or nothing, after the rollback)."""
    return text("RELEASE SAVEPOINT pgqueue_workflow_keys")
