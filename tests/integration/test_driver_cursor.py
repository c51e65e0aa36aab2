"""pgqueue's statements on the driver go through one cursor per pooled connection.

The cursor is kept with the pool's record of the connection, so it is made once per connection
and is never used on another one: when the server ends a connection, the pool replaces it and
the statements that follow go through a cursor of the new connection.
"""

from __future__ import annotations

from typing import Any

import pytest
from server_databases import count_on, wait_until_backend_gone
from sqlalchemy import func, select, text
from sqlalchemy.engine import URL

from pgqueue import PgQueue, uow
from pgqueue.db import Executor


def _backend_and_cursor(pgq: PgQueue, autocommit: bool) -> tuple[int, Any, Any]:
    """The backend pid a unit of work ran on (``uow.run``: a connection the server ended is
    replaced, before the statement or after it fails), the cursor it used, and the driver
    connection as the executor saw it."""

    def work(db: Executor) -> tuple[int, Any, Any]:
        pid = int(db.rows(select(func.pg_backend_pid()))[0][0])
        return pid, db.cursor, db.connection  # type: ignore[attr-defined]

    return uow.run(pgq.database, work, autocommit=autocommit)


@pytest.mark.parametrize("autocommit", [False, True])
def test_units_of_work_on_one_pooled_connection_share_its_cursor(
    pgq: PgQueue, autocommit: bool
) -> None:
    assert pgq.database.uses_driver
    first_pid, first_cursor, first_connection = _backend_and_cursor(pgq, autocommit)
    second_pid, second_cursor, second_connection = _backend_and_cursor(pgq, autocommit)

    assert second_pid == first_pid and second_connection is first_connection
    assert second_cursor is first_cursor
    assert first_cursor.connection is first_connection


def test_a_statement_with_no_rows_after_one_with_rows_returns_none(pgq: PgQueue) -> None:
    def work(db: Executor) -> tuple[Any, Any]:
        return db.rows(select(func.pg_backend_pid())), db.rows(text("SET LOCAL work_mem = '8MB'"))

    with_rows, without_rows = pgq.database.run(work, autocommit=False)
    assert len(with_rows) == 1
    assert list(without_rows) == []


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_connection_the_server_ended_is_replaced_with_a_cursor_of_its_own(
    pgq: PgQueue, database_url: URL, autocommit: bool
) -> None:
    old_pid, old_cursor, old_connection = _backend_and_cursor(pgq, autocommit)
    count_on(database_url, "SELECT count(pg_terminate_backend(:pid))", pid=old_pid)
    wait_until_backend_gone(database_url, old_pid)

    new_pid, new_cursor, new_connection = _backend_and_cursor(pgq, autocommit)

    assert new_pid != old_pid and new_connection is not old_connection
    assert new_cursor is not old_cursor
    assert new_cursor.connection is new_connection
    assert old_cursor.connection.closed
