"""Statements of the partitioned history layout (``Settings.history = "partitioned"``): the
maintenance move of finished jobs from ``pgqueue_jobs`` into ``pgqueue_job_history``, the reads
of its partitions, and the DDL of ``pgqueue history maintain`` (create a day's partition, drop
one, adopt the rows the DEFAULT partition caught for a day).

The move is DML, run by workers as any role that may write the two tables. The DDL needs the
tables' owner. A partition's name and bounds come from a date, never from input, and are
compiled with the dialect's identifier preparer and literal rendering, as
``pgqueue.sql.server`` compiles ``CREATE DATABASE``.
"""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    DateTime,
    Float,
    Integer,
    Select,
    TableClause,
    and_,
    bindparam,
    cast,
    column,
    delete,
    func,
    insert,
    literal,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler

from pgqueue.models import (
    HISTORY_DEFAULT_PARTITION,
    HISTORY_PARTITION_PREFIX,
    JOB_COLUMN_NAMES,
    FinishedMinute,
    Job,
    JobHistory,
    MessageQueue,
)
from pgqueue.sql.common import (
    among,
    array_param,
    in_states,
    minute_of,
    outside_running_workflows,
    seconds,
)
from pgqueue.states import FINAL_STATES

HISTORY_TABLE = JobHistory.__tablename__

_pg_inherits = table("pg_inherits", column("inhrelid"), column("inhparent"), schema="pg_catalog")
_pg_class = table("pg_class", column("oid"), column("relname"), schema="pg_catalog")


def partition_name(day: dt.date) -> str:
    """The name of ``day``'s partition: ``pgqueue_job_history_pYYYYMMDD``."""
    return HISTORY_PARTITION_PREFIX + day.strftime("%Y%m%d")


def partition_day(name: str) -> dt.date | None:
    """The day a partition named by ``partition_name`` holds; None for another name (the
    DEFAULT partition)."""
    if not name.startswith(HISTORY_PARTITION_PREFIX):
        return None
    try:
        return dt.datetime.strptime(name[len(HISTORY_PARTITION_PREFIX) :], "%Y%m%d").date()
    except ValueError:
        return None


def day_start(day: dt.date) -> dt.datetime:
    """Midnight UTC starting ``day``: where its partition begins."""
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


def _inserted_into_history(rows: CTE, name: str) -> CTE:
    """A CTE inserting the job rows ``rows`` returned (a DELETE's RETURNING of every job
    column) into ``pgqueue_job_history``, returning their ids."""
    return (
        insert(JobHistory)
        .from_select(list(JOB_COLUMN_NAMES), select(*(rows.c[n] for n in JOB_COLUMN_NAMES)))
        .returning(JobHistory.id)
        .cte(name)
    )


@cache
def move_finished() -> Select[int]:
    """Move up to ``limit`` jobs that finished more than ``age`` seconds ago (database clock)
    from ``pgqueue_jobs`` into ``pgqueue_job_history``, oldest first; returns how many.

    One statement: the DELETE's RETURNING feeds the INSERT, so a job is in exactly one of the
    two tables at every instant any snapshot can see. The rows are locked SKIP LOCKED, so a
    re-run or a delete of a job in the same instant wins and the move takes the next one. Any
    ticket of a moved job is deleted too, as pruning does; its steps go with its row (foreign
    key). The moved jobs are counted into ``pgqueue_finished_minutes`` by the same statement,
    so the count and the move commit together."""
    old = (
        select(Job.id)
        .where(
            Job.finished_at.is_not(None),
            Job.finished_at < func.now() - seconds(bindparam("age", type_=Float)),
            in_states(Job.state, FINAL_STATES),
            outside_running_workflows(),
        )
        .order_by(Job.finished_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    jobs = Job.__table__
    moved = (
        delete(Job)
        .where(Job.id.in_(old))
        .returning(*(jobs.c[name] for name in JOB_COLUMN_NAMES))
        .cte("moved")
    )
    stored = _inserted_into_history(moved, "stored")
    tickets = (
        delete(MessageQueue).where(among(MessageQueue.job_id, moved.c.id)).cte("moved_tickets")
    )
    return select(func.count()).select_from(stored).add_cte(tickets, _counted_by_minute(moved))


def _counted_by_minute(moved: CTE) -> CTE:
    """A CTE adding the moved jobs to ``pgqueue_finished_minutes``: one row per minute, queue
    and final state, inserted or added to."""
    minute = minute_of(moved.c.finished_at).label("minute")
    counts = select(minute, moved.c.queue, moved.c.state, func.count()).group_by(
        minute, moved.c.queue, moved.c.state
    )
    upsert = pg_insert(FinishedMinute).from_select(["minute", "queue", "state", "jobs"], counts)
    return upsert.on_conflict_do_update(
        index_elements=[FinishedMinute.minute, FinishedMinute.queue, FinishedMinute.state],
        set_={"jobs": FinishedMinute.jobs + upsert.excluded.jobs},
    ).cte("counted")


@cache
def moved_states() -> Select[int, str]:
    """``(id, state)`` of those of the jobs ``ids`` (array) in ``pgqueue_job_history`` (each
    partition's primary key probed by id). No lock: a moved job never changes."""
    return select(JobHistory.id, JobHistory.state).where(
        JobHistory.id == func.any(array_param("ids", BigInteger))
    )


@cache
def delete_finished_minutes() -> Any:  # a Delete
    """Delete the per-minute counts of minutes before ``before``."""
    return delete(FinishedMinute).where(
        FinishedMinute.minute < bindparam("before", type_=DateTime(timezone=True))
    )


@cache
def utc_today() -> Select[dt.date]:
    """Today's date in UTC by the database's clock: the day the partitions are counted from."""
    return select(func.date(func.timezone("UTC", func.now())))


@cache
def partitions() -> Select[str]:
    """The names of ``pgqueue_job_history``'s partitions (the days' and the DEFAULT one)."""
    return (
        select(_pg_class.c.relname)
        .select_from(_pg_inherits.join(_pg_class, _pg_class.c.oid == _pg_inherits.c.inhrelid))
        .where(_pg_inherits.c.inhparent == cast(literal(HISTORY_TABLE), REGCLASS))
        .order_by(_pg_class.c.relname)
    )


def _default_partition() -> TableClause:
    return table(HISTORY_DEFAULT_PARTITION, *(column(name) for name in JOB_COLUMN_NAMES))


@cache
def default_partition_days() -> Select[Any, int]:
    """``(UTC day, count)`` of the rows the DEFAULT partition holds: finished jobs whose day had
    no partition when they were moved."""
    default = _default_partition()
    day = func.date(func.timezone("UTC", default.c.finished_at))
    return select(day, func.count()).group_by(day).order_by(day)


def move_out_of_default(day: dt.date) -> Select[int]:
    """Move the DEFAULT partition's rows of ``day`` into ``pgqueue_job_history`` (run while the
    DEFAULT partition is detached and ``day``'s partition exists, so they land there); returns
    how many."""
    default = _default_partition()
    finished_at = default.c.finished_at
    taken = (
        delete(default)
        .where(
            and_(
                finished_at >= bindparam("start", day_start(day), type_=DateTime(timezone=True)),
                finished_at
                < bindparam("end", day_start(day + dt.timedelta(days=1)), DateTime(True)),
            )
        )
        .returning(*(default.c[name] for name in JOB_COLUMN_NAMES))
        .cte("taken")
    )
    stored = _inserted_into_history(taken, "adopted")
    return select(func.count()).select_from(stored)


@cache
def delete_expired_from_default() -> Any:  # a Delete
    """Delete the DEFAULT partition's rows that finished before ``before``."""
    default = _default_partition()
    return delete(default).where(
        default.c.finished_at < bindparam("before", type_=DateTime(timezone=True))
    )


# --- DDL ---------------------------------------------------------------------------------------


class _PartitionStatement(ExecutableDDLElement):
    """A statement on one partition, whose text depends on its name: not cached."""

    inherit_cache = False

    def __init__(self, name: str, day: dt.date | None = None) -> None:
        self.name = name
        self.day = day


class _CreateDayPartition(_PartitionStatement):
    """``CREATE TABLE name PARTITION OF pgqueue_job_history FOR VALUES FROM (day) TO (day+1)``."""


class _DropPartition(_PartitionStatement):
    """``DROP TABLE IF EXISTS name``."""


class _DetachDefault(_PartitionStatement):
    """``ALTER TABLE pgqueue_job_history DETACH PARTITION pgqueue_job_history_default``."""


class _AttachDefault(_PartitionStatement):
    """``ALTER TABLE pgqueue_job_history ATTACH PARTITION pgqueue_job_history_default DEFAULT``."""


def _literal_start(compiler: DDLCompiler, day: dt.date) -> str:
    return str(compiler.sql_compiler.render_literal_value(day_start(day), DateTime(True)))


@compiles(_CreateDayPartition)
def _compile_create(element: _CreateDayPartition, compiler: DDLCompiler, **kw: Any) -> str:
    assert element.day is not None
    return " ".join(
        [
            "CREATE TABLE IF NOT EXISTS",
            compiler.preparer.quote(element.name),
            "PARTITION OF",
            compiler.preparer.quote(HISTORY_TABLE),
            "FOR VALUES FROM (",
            _literal_start(compiler, element.day),
            ") TO (",
            _literal_start(compiler, element.day + dt.timedelta(days=1)),
            ")",
        ]
    )


@compiles(_DropPartition)
def _compile_drop(element: _DropPartition, compiler: DDLCompiler, **kw: Any) -> str:
    return "DROP TABLE IF EXISTS " + compiler.preparer.quote(element.name)


@compiles(_DetachDefault)
def _compile_detach(element: _DetachDefault, compiler: DDLCompiler, **kw: Any) -> str:
    return " ".join(
        [
            "ALTER TABLE",
            compiler.preparer.quote(HISTORY_TABLE),
            "DETACH PARTITION",
            compiler.preparer.quote(element.name),
        ]
    )


@compiles(_AttachDefault)
def _compile_attach(element: _AttachDefault, compiler: DDLCompiler, **kw: Any) -> str:
    return " ".join(
        [
            "ALTER TABLE",
            compiler.preparer.quote(HISTORY_TABLE),
            "ATTACH PARTITION",
            compiler.preparer.quote(element.name),
            "DEFAULT",
        ]
    )


def create_day_partition(day: dt.date) -> ExecutableDDLElement:
    """Create ``day``'s partition (UTC midnight to midnight) unless it exists."""
    return _CreateDayPartition(partition_name(day), day)


def drop_partition(name: str) -> ExecutableDDLElement:
    """Drop one partition: its rows go with its files, leaving no dead tuples behind."""
    return _DropPartition(name)


def detach_default() -> ExecutableDDLElement:
    """Detach the DEFAULT partition (to create a day's partition its rows overlap)."""
    return _DetachDefault(HISTORY_DEFAULT_PARTITION)


def attach_default() -> ExecutableDDLElement:
    """Attach the DEFAULT partition again."""
    return _AttachDefault(HISTORY_DEFAULT_PARTITION)
