"""Statements of workflows (``chain``/``group``/``chord``): drawing the ids of a workflow's
jobs, inserting its row and its jobs (with their edges, countdowns and roles) in two
statements, closing it when its last member ended, settling its ``on_failure`` job, reading
it, and cancelling it.

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
    CompoundSelect,
    Float,
    Integer,
    Select,
    SmallInteger,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCLASS, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import aliased

from pgqueue.models import UNIQUE_KEY_HELD, Job, MessageQueue, QueueControl, Workflow
from pgqueue.sql.common import (
    OUTCOME_AT,
    announced,
    array_param,
    cancel_flags,
    seconds,
    source_states,
    tickets_for,
    trace_context_param,
    woken,
)
from pgqueue.sql.flow import key_rows
from pgqueue.states import ABANDON, CANCEL, CLOSE, CLOSE_FAILED, UNBLOCK, JobState, WorkflowRole

_CLOSING = WorkflowRole.CLOSING.value
_ON_FAILURE = WorkflowRole.ON_FAILURE.value


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


COPY_JOB_COLUMNS = (
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
    columns = list(COPY_JOB_COLUMNS)
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
        keys = (
            func.unnest(array_param("concurrency_keys", Text), array_param("key_limits", Integer))
            .table_valued("concurrency_key", "key_limit", with_ordinality="ord")
            .render_derived(name="k")
        )
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


@cache
def close_workflows() -> Select[Any]:
    """Close the workflows whose closing marker is among the WAITING jobs ``ids`` (array) and
    counted down to 0: the marker moves to SUCCEEDED (``close``) when every member succeeded,
    else to FAILED (``close_failed``), and the workflow's row, still running, takes the same
    state and its end time, in this statement. Returns ``(id, new state, dependents)`` of the
    closed markers (their dependents: the ``on_failure`` job, to count down)."""
    member = aliased(Job, name="member")
    failed = (
        select(literal(1))
        .where(member.id == func.any(Job.depends_on), member.state != JobState.SUCCEEDED.value)
        .exists()
    )
    closed = (
        update(Job)
        .where(
            Job.id == func.any(array_param("ids", BigInteger)),
            source_states(CLOSE),
            Job.workflow_role == _CLOSING,
            Job.pending_dependencies <= 0,
        )
        .values(
            state=case((failed, CLOSE_FAILED.target.value), else_=CLOSE.target.value),
            last_error=case((failed, literal("a member failed or was cancelled")), else_=None),
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
        )
        .returning(Job.id, Job.state, Job.dependents, Job.awaited, Job.workflow_id)
        .cte("closed")
    )
    ended = (
        update(Workflow)
        .where(Workflow.id == closed.c.workflow_id, Workflow.state == "running")
        .values(state=closed.c.state, finished_at=OUTCOME_AT)
        .returning(Workflow.id)
        .cte("ended_workflows")
    )
    return (
        select(closed.c.id, closed.c.state, closed.c.dependents)
        .add_cte(ended)
        .where(announced(closed))
    )


@cache
def settle_on_failure() -> CompoundSelect[Any]:
    """Settle the ``on_failure`` jobs among the WAITING jobs ``ids`` (array) whose countdown
    reached 0 (their workflow closed): released when the workflow FAILED, with the list of its
    failed members (``{"id", "task", "error"}``, by id) as first argument, cancelled otherwise
    (it succeeded or was cancelled). Returns ``(id, new state)``."""
    workflow = aliased(Workflow, name="workflow")
    member = aliased(Job, name="member")
    workflow_failed = (
        select(literal(1))
        .where(workflow.id == Job.workflow_id, workflow.state == JobState.FAILED.value)
        .exists()
    )
    failures = select(
        func.coalesce(
            func.jsonb_agg(
                aggregate_order_by(
                    func.jsonb_build_object(
                        "id", member.id, "task", member.task_name, "error", member.last_error
                    ),
                    member.id,
                )
            ),
            cast(literal("[]"), JSONB),
        )
    ).where(
        member.workflow_id == Job.workflow_id,
        member.state == JobState.FAILED.value,
        or_(member.workflow_role.is_(None), member.workflow_role != _CLOSING),
    )
    arguments = cast(
        func.jsonb_build_array(failures.scalar_subquery()).op("||")(cast(Job.args, JSONB)), JSON
    )
    chosen = and_(
        Job.id == func.any(array_param("ids", BigInteger)),
        source_states(UNBLOCK),
        Job.workflow_role == _ON_FAILURE,
        Job.pending_dependencies <= 0,
    )
    released = (
        update(Job)
        .where(chosen, workflow_failed)
        .values(
            state=UNBLOCK.target,
            run_at=func.greatest(Job.run_at, OUTCOME_AT),
            updated_at=OUTCOME_AT,
            args=arguments,
        )
        .returning(
            Job.id, Job.state, Job.queue, Job.priority, Job.run_at, Job.atomic, Job.concurrency_key
        )
        .cte("released")
    )
    tickets = tickets_for(released, "on_failure_tickets")
    skipped = (
        update(Job)
        .where(chosen, ~workflow_failed)
        .values(
            state=ABANDON.target,
            finished_at=OUTCOME_AT,
            updated_at=OUTCOME_AT,
            last_error=literal("the workflow did not fail; not run"),
        )
        .returning(Job.id, Job.state, Job.awaited)
        .cte("skipped")
    )
    return (
        select(released.c.id, released.c.state)
        .where(woken(tickets))
        .union_all(select(skipped.c.id, skipped.c.state).where(announced(skipped)))
        .add_cte(tickets)
    )


@cache
def workflow_row() -> Select[str, Any, Any, list[int], int, int | None, int]:
    """``(state, created_at, finished_at, final_job_ids, closing_job_id, on_failure_job_id,
    job_count)`` of workflow ``workflow``."""
    return select(
        Workflow.state,
        Workflow.created_at,
        Workflow.finished_at,
        Workflow.final_job_ids,
        Workflow.closing_job_id,
        Workflow.on_failure_job_id,
        Workflow.job_count,
    ).where(Workflow.id == bindparam("workflow", type_=BigInteger))


@cache
def workflow_jobs() -> Select[int, str, JobState, int | None, list[int] | None]:
    """``(id, task_name, state, workflow_role, depends_on)`` of workflow ``workflow``'s jobs, by id."""
    return (
        select(Job.id, Job.task_name, Job.state, Job.workflow_role, Job.depends_on)
        .where(Job.workflow_id == bindparam("workflow", type_=BigInteger))
        .order_by(Job.id)
    )


@cache
def results_of() -> Select[Any]:
    """``(id, state, result)`` of jobs ``ids`` (array)."""
    return select(Job.id, Job.state, Job.result).where(
        Job.id == func.any(array_param("ids", BigInteger))
    )


@cache
def mark_cancelled() -> Select[Any]:
    """Workflow ``workflow``, still running -> cancelled, locked by this update until the transaction
    ends; returns its id (none when it was not running)."""
    cancelled = (
        update(Workflow)
        .where(Workflow.id == bindparam("workflow", type_=BigInteger), Workflow.state == "running")
        .values(state="cancelled", finished_at=func.now())
        .returning(Workflow.id)
        .cte("cancelled_workflow")
    )
    return select(cancelled.c.id)


@cache
def cancel_waiting_jobs() -> Select[Any]:
    """Workflow ``workflow``'s QUEUED/RETRYING/WAITING jobs -> CANCELLED (``cancel``), tickets
    deleted first, the closing marker left to close when its count reaches 0; returns the
    dependents of the cancelled jobs, one entry per edge, to count down."""
    in_workflow = Job.workflow_id == bindparam("workflow", type_=BigInteger)
    gone = (
        delete(MessageQueue)
        .where(MessageQueue.job_id.in_(select(Job.id).where(in_workflow)))
        .returning(MessageQueue.job_id)
        .cte("gone")
    )
    has_ticket_or_blocked = or_(
        Job.id.in_(select(gone.c.job_id)), Job.state == JobState.WAITING.value
    )
    cancelled = (
        update(Job)
        .where(
            in_workflow,
            has_ticket_or_blocked,
            source_states(CANCEL),
            Job.workflow_role != _CLOSING,
        )
        .values(
            state=CANCEL.target,
            finished_at=func.now(),
            updated_at=func.now(),
            last_error=literal("workflow cancelled"),
        )
        .returning(Job.id, Job.dependents, Job.awaited)
        .cte("cancelled_jobs")
    )
    dependents = func.array(select(func.unnest(cancelled.c.dependents)).scalar_subquery())
    return select(dependents).where(announced(cancelled))


@cache
def flag_running_jobs() -> Select[int]:
    """Flag workflow ``workflow``'s RUNNING jobs for cancellation (their handlers see it and stop,
    cooperatively); the rows locked in id order first, as ``sql.bulk.flag_running`` does."""
    return cancel_flags(Job.workflow_id == bindparam("workflow", type_=BigInteger))


@cache
def state_counts() -> Select[str, int]:
    """``(state, count)`` of the workflows in each state of ``states`` (array), each count
    stopping at ``cap``: the metrics' reading, whatever the table's size."""
    states = func.unnest(array_param("states", Text)).table_valued("state").render_derived()
    capped = (
        select(literal(1).label("hit"))
        .where(Workflow.state == states.c.state)
        .limit(bindparam("cap", type_=Integer))
        .correlate(states)
        .lateral("capped")
    )
    return (
        select(states.c.state, func.count(capped.c.hit))
        .select_from(states)
        .outerjoin(capped, literal(True))
        .group_by(states.c.state)
    )
