"""The migrations' own reads and settings (``sql.schema``): a transaction's timeouts, the lock
of migration runs, the sessions that block a migration, whether what a downgrade would destroy
holds data, and the revisions the version tables record; over ``db.Executor``, never
committing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue.db import Executor
from pgqueue.sql import schema as schema_sql


def current_timeouts(db: Executor) -> tuple[str, str]:
    """``(statement_timeout, lock_timeout)`` of the current transaction, as text."""
    statement_timeout, lock_timeout = db.rows(schema_sql.current_timeouts())[0]
    return str(statement_timeout), str(lock_timeout)


def set_timeouts(db: Executor, statement_timeout: str, lock_timeout: str) -> None:
    """Set ``statement_timeout`` and ``lock_timeout`` (text, as ``current_timeouts`` gives
    them or milliseconds) for the rest of the current transaction only."""
    params = {"statement_timeout": statement_timeout, "lock_timeout": lock_timeout}
    db.rows(schema_sql.set_timeouts(), params)


def try_migration_lock(db: Executor) -> bool:
    """Take the lock of pgqueue's migration runs until the current transaction ends, if no
    other run holds it; whether it was taken."""
    return bool(db.rows(schema_sql.try_migration_lock())[0][0])


def backend_pid(db: Executor) -> int:
    """The server process id of the session."""
    return int(db.rows(schema_sql.backend_pid())[0][0])


def end_backend(db: Executor, pid: int) -> bool:
    """End server process ``pid``, rolling back its transaction; whether it was signalled."""
    return bool(db.rows(schema_sql.end_backend(), {"pid": pid})[0][0])


def blocking_sessions(db: Executor, pid: int) -> Sequence[Any]:
    """``(pid, application_name, state, seconds in transaction, seconds in state, query)`` of
    each session that blocks session ``pid`` from the lock it waits for, by pid."""
    return db.rows(schema_sql.blocking_sessions(), {"pid": pid})


def table_exists(db: Executor, table: str) -> bool:
    """Whether a table named ``table`` exists (in the search path)."""
    return bool(db.rows(schema_sql.table_exists(), {"name": table})[0][0])


def recorded_revisions(db: Executor, version_table: str) -> list[str]:
    """The revision ids Alembic's version table ``version_table`` holds, none when there is no
    such table (as Alembic reads them, without Alembic)."""
    executor = db
    if not table_exists(executor, version_table):
        return []
    return [str(row[0]) for row in executor.rows(schema_sql.recorded_revisions(version_table))]


def table_has_rows(db: Executor, table: str) -> bool:
    """Whether ``table`` (a partitioned one: any of its partitions) holds a row."""
    return bool(db.rows(schema_sql.table_has_rows(table))[0][0])


def column_holds_values(db: Executor, table: str, column: str, default: Any) -> bool:
    """Whether some row of ``table`` holds a value in ``column`` other than NULL and
    ``default`` (None: no default to discount)."""
    statement = schema_sql.column_holds_values(table, column, default)
    return bool(db.rows(statement)[0][0])


def rows_where_equal(db: Executor, table: str, column: str, value: Any) -> bool:
    """Whether some row of ``table`` has ``column`` equal to ``value``."""
    statement = schema_sql.rows_where_equal(table, column, value)
    return bool(db.rows(statement)[0][0])
