"""Transaction scope for pgqueue's own writes, with a bounded retry on transient conflicts.

``run_one_statement`` is the scope for work that is one statement: it runs alone in autocommit
mode (the statement is its own transaction), so there is no ``BEGIN``/``COMMIT`` round trip.

``run_in_transaction`` opens a session, runs the function in one transaction and commits it. If
PostgreSQL reports a deadlock (40P01) or serialization failure (40001) the whole function runs
again in a fresh transaction, a few times at most. Work done in a caller's own session is never
retried or committed here: ``in_caller_or_own_transaction`` just runs it in the caller's
transaction, because only the caller knows whether its other work may be repeated.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable

from pgqueue.errors import is_transient_conflict

T = TypeVar("T")

log = logging.getLogger("pgqueue.uow")

DEFAULT_ATTEMPTS = 5


def run_in_transaction(
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """Run ``work(session)`` in its own committed transaction, retrying transient conflicts."""
    for attempt in range(1, attempts + 1):
        try:
            with sessions() as session, session.begin():
                return work(session)
        except DBAPIError as exc:
            if attempt >= attempts or not is_transient_conflict(exc):
                raise
            pause = min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.5)
            log.info("transient conflict (%s), retrying in %.3fs", exc.orig, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def run_one_statement(
    engine: Engine,
    statement: Executable,
    params: dict[str, Any],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
) -> Any:
    """Run one statement in its own transaction (autocommit); return its first row's first
    column. Transient conflicts are retried like ``run_in_transaction``.

    On psycopg the statement (built in ``queries``) is compiled once and sent on the pooled
    DB-API connection directly: for a one-row enqueue, SQLAlchemy's per-execution work (and
    switching the pooled connection's isolation level back and forth) costs as much CPU as the
    whole round trip does on the client. Errors are raised as SQLAlchemy's ``DBAPIError``
    subclasses, as on any other path, and a lost connection is dropped from the pool.
    """
    for attempt in range(1, attempts + 1):
        try:
            if engine.dialect.driver == "psycopg":
                return _run_on_driver(engine, statement, params)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                return connection.execute(statement, params).scalar_one()
        except DBAPIError as exc:
            if attempt >= attempts or not is_transient_conflict(exc):
                raise
            pause = min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.5)
            log.info("transient conflict (%s), retrying in %.3fs", exc.orig, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


_compiled: dict[tuple[int, int], tuple[Executable, str]] = {}


def _run_on_driver(engine: Engine, statement: Executable, params: dict[str, Any]) -> Any:
    import psycopg

    dialect = engine.dialect
    key = (id(statement), id(dialect))
    cached = _compiled.get(key)
    if cached is None or cached[0] is not statement:
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        if compiled.positional or compiled.literal_execute_params or compiled.post_compile_params:
            raise AssertionError("run_one_statement needs named, fully rendered parameters")
        cached = _compiled[key] = (statement, str(compiled))
    sql = cached[1]
    raw = engine.raw_connection()
    driver: Any = raw.driver_connection
    try:
        driver.autocommit = True
        try:
            row = driver.execute(sql, params).fetchone()
        finally:
            if not driver.closed:
                driver.autocommit = False
    except psycopg.Error as exc:
        if dialect.is_disconnect(exc, raw.dbapi_connection, None):  # type: ignore[arg-type]
            raw.invalidate(exc)
        raise DBAPIError.instance(sql, params, exc, psycopg.Error) from exc
    finally:
        raw.close()
    if row is None:  # pragma: no cover - the statements used here always return a row
        raise AssertionError("statement returned no row")
    return row[0]


def in_caller_or_own_transaction(
    session: Session | None,
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
) -> T:
    """Run in the caller's session (no commit, no retry) or in an own transaction."""
    if session is not None:
        return work(session)
    return run_in_transaction(sessions, work)
