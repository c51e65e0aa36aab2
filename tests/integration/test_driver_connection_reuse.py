"""A pooled connection that an error left in the middle of a command is dropped, not reset.

When a connection's socket closes under a statement, psycopg raises before libpq marks the
connection bad, so SQLAlchemy's disconnect test passes it; the connection still has a command
in flight. Given back to the pool, the pool's reset (a ROLLBACK) fails on it ("another command
is already in progress") and SQLAlchemy logs the failure with a traceback, in the log of a
worker whose connections the server terminates. The state is made here on a real
connection the way the socket leaves it (a query sent, its answer never read) and the error the
driver then raises is raised in its place.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from pgqueue import driver


def _backend_pid(engine: Engine) -> int:
    raw = engine.raw_connection()
    try:
        return int(raw.driver_connection.info.backend_pid)  # type: ignore[union-attr]
    finally:
        raw.close()


@pytest.mark.parametrize("autocommit", [False, True])
def test_a_connection_left_mid_command_is_dropped_without_a_reset_traceback(
    engine: Engine, caplog: pytest.LogCaptureFixture, autocommit: bool
) -> None:
    statements = driver.CompiledStatements(engine.dialect)
    before = _backend_pid(engine)

    def work(executor: Any) -> None:
        connection: psycopg.Connection[Any] = executor.connection
        connection.pgconn.send_query(b"SELECT 1")
        raise psycopg.OperationalError("connection socket closed")

    with (
        caplog.at_level(logging.WARNING, logger="sqlalchemy.pool"),
        pytest.raises(OperationalError, match="connection socket closed"),
    ):
        driver.run(engine, statements, None, work, autocommit=autocommit)

    pool_errors = [r for r in caplog.records if r.name.startswith("sqlalchemy.pool")]
    assert pool_errors == []
    # The pool dropped that connection: the next checkout opens another backend, which works.
    assert _backend_pid(engine) != before
    assert driver.run(engine, statements, None, lambda executor: 1, autocommit=autocommit) == 1
