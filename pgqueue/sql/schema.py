"""Statements the migrations run around the revisions themselves: their timeouts, the sessions
that block them, the checks of what a downgrade would destroy, and the read of the revisions a
version table records. Pure builders, like the rest of ``pgqueue.sql``.

A table or column name reaches these statements as an identifier construct (``table()``,
``column()``), quoted by the dialect, never pasted into text.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    ColumnClause,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    column,
    exists,
    func,
    literal,
    literal_column,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import ARRAY

_activity = table(
    "pg_stat_activity",
    column("pid", Integer),
    column("application_name", Text),
    column("state", Text),
    column("xact_start"),
    column("state_change"),
    column("query", Text),
)


# The advisory lock (two-key form) that lets one of pgqueue's own migration runs go at a time.
# Its first key is not the one the queue bounds' lock uses (revision 0020), so no queue's name
# can collide with it.
MIGRATION_LOCK_KEYS: Final = (1885827429, 1)


@cache
def try_migration_lock() -> Select[Any]:
    """Whether the lock of pgqueue's migration runs was free; if it was, it is held now until
    the transaction ends.

    A try, not a wait: a session waiting in a statement holds that statement's snapshot, and
    an index build ``CONCURRENTLY`` of the run holding the lock would wait for it. The keys are
    written into the statement, not bound: the server keeps the snapshot of a statement that
    had parameters with its portal until the next statement, and the transaction holding this
    lock stays idle while the builds wait for every snapshot older than theirs."""
    first, second = MIGRATION_LOCK_KEYS
    return select(
        func.pg_try_advisory_xact_lock(literal_column(str(first)), literal_column(str(second)))
    )


@cache
def current_timeouts() -> Select[Any]:
    """``(statement_timeout, lock_timeout)`` of the current transaction, as text."""
    return select(
        func.current_setting(literal("statement_timeout")),
        func.current_setting(literal("lock_timeout")),
    )


@cache
def set_timeouts() -> Select[Any]:
    """Set ``statement_timeout`` and ``lock_timeout`` for the current transaction only (as
    ``SET LOCAL``, so a pooler's next client never sees them). Binds ``statement_timeout`` and
    ``lock_timeout`` (text: milliseconds, or a value as ``current_setting`` shows it)."""
    return select(
        func.set_config(
            literal("statement_timeout"), bindparam("statement_timeout", type_=Text), True
        ),
        func.set_config(literal("lock_timeout"), bindparam("lock_timeout", type_=Text), True),
    )


@cache
def backend_pid() -> Select[Any]:
    """The server process id of the current session."""
    return select(func.pg_backend_pid())


@cache
def end_backend() -> Select[Any]:
    """End the server process ``pid`` (``pg_terminate_backend``: its open transaction rolls
    back); whether it was signalled. A role may end its own sessions."""
    return select(func.pg_terminate_backend(bindparam("pid", type_=Integer)))


@cache
def blocking_sessions() -> Select[Any]:
    """``(pid, application_name, state, seconds in transaction, seconds in state, query)`` of
    each session that blocks session ``pid`` from the lock it waits for, by pid."""
    a = _activity.c
    return (
        select(
            a.pid,
            a.application_name,
            a.state,
            func.extract("epoch", func.now() - a.xact_start),
            func.extract("epoch", func.now() - a.state_change),
            func.left(a.query, 200),
        )
        .where(
            a.pid
            == func.any(func.pg_blocking_pids(bindparam("pid", type_=Integer)).cast(ARRAY(Integer)))
        )
        .order_by(a.pid)
    )


@cache
def table_exists() -> Select[Any]:
    """Whether a table named ``name`` (bind, text) exists in the search path."""
    return select(func.to_regclass(bindparam("name", type_=Text)).is_not(None))


@cache
def recorded_revisions(name: str) -> Select[Any]:
    """The revision ids in Alembic's version table ``name`` (its ``version_num`` column), the
    statement Alembic reads them with."""
    return select(table(name, column("version_num", Text)).c.version_num)


@cache
def table_has_rows(name: str) -> Select[Any]:
    """Whether table ``name`` (a partitioned one: any of its partitions) holds a row."""
    return select(exists(select(literal(1)).select_from(table(name))))


@cache
def column_holds_values(name: str, column_name: str, default: Any) -> Select[Any]:
    """Whether some row of table ``name`` holds a value in ``column_name`` other than NULL
    and ``default`` (None: no default to discount)."""
    value: ColumnClause[Any] = column(column_name)
    condition: ColumnElement[bool] = value.is_not(None)
    if default is not None:
        condition = and_(condition, value != literal(default))
    return select(exists(select(literal(1)).select_from(table(name, value)).where(condition)))


@cache
def rows_where_equal(name: str, column_name: str, value: Any) -> Select[Any]:
    """Whether some row of table ``name`` has ``column_name`` equal to ``value``."""
    target: ColumnClause[Any] = column(column_name)
    return select(
        exists(select(literal(1)).select_from(table(name, target)).where(target == literal(value)))
    )
