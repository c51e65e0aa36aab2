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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql import Executable

from pgqueue.errors import ended_before_commit, is_transient_conflict

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

    def once() -> T:
        with sessions() as session, session.begin():
            return work(session)

    return _retrying(once, attempts)


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
    DB-API connection directly (``run_on_driver``): for a one-row enqueue, SQLAlchemy's
    per-execution work (and switching the pooled connection's isolation level back and forth)
    costs as much CPU as the whole round trip does on the client.
    """
    if not driver_usable(engine):
        return _retrying(lambda: _one_on_sqlalchemy(engine, statement, params), attempts)
    prepared = driver_statement(statement, engine)
    sql, values = prepared.sql, prepared.params(params)

    def work(driver: Any) -> Any:
        row = driver.execute(sql, values).fetchone()
        if row is None:  # pragma: no cover - the statements used here always return a row
            raise AssertionError("statement returned no row")
        return row[0]

    return run_on_driver(engine, work, autocommit=True, attempts=attempts)


def driver_usable(engine: Engine) -> bool:
    """Whether ``run_on_driver`` may bypass SQLAlchemy's execution layer for ``engine``: only
    psycopg, and only when nothing watches statements (``echo``, cursor or execute event
    listeners, error handlers), so tracing and logging see every statement they saw before."""
    if engine.dialect.driver != "psycopg" or engine.echo:
        return False
    dispatch = engine.dispatch
    return not (
        dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or dispatch.before_execute
        or dispatch.after_execute
        or engine.dialect.dispatch.handle_error
    )


class HeldConnection:
    """One pooled connection of ``engine`` kept checked out by a single user (the worker's
    claimer) in autocommit mode, for statements sent on the driver directly (only where
    ``driver_usable``). Against ``run_on_driver`` it saves, per statement, the pool checkout and
    return (with its reset) and two autocommit switches, which are a visible share of an idle
    worker's pick-up latency.

    Its prepared statements are dropped every ``plan_max_age`` seconds. PostgreSQL may keep one
    generic plan for a prepared statement for the connection's life, and a plan made while a
    table was tiny (a fresh install, an idle queue) scans it sequentially however large it grows;
    the next plan is made for the table as it is then. Behind a pooler nothing is prepared.

    Not thread-safe: its user serializes the calls. After any error the connection goes back to
    the pool (dropped when the error was a lost connection) and the next call checks out another,
    so a broken connection is never reused.
    """

    def __init__(self, engine: Engine, *, plan_max_age: float = 5.0) -> None:
        from pgqueue.connections import local_settings

        self.engine = engine
        self._local = local_settings(engine)
        self._plan_max_age = plan_max_age
        self._raw: Any = None
        self._plans_since = 0.0

    def rows(self, statement: Executable, params: dict[str, Any]) -> Sequence[Any]:
        """All rows of ``statement`` (a cached statement of ``queries``) run in autocommit."""
        import psycopg

        raw = self._raw
        if raw is None:
            raw = _checkout(self.engine)
            raw.driver_connection.autocommit = True
            self._raw = raw
            self._plans_since = time.monotonic()
        driver = raw.driver_connection
        prepared = driver_statement(statement, self.engine)
        try:
            if (
                driver.prepare_threshold is not None
                and time.monotonic() - self._plans_since > self._plan_max_age
            ):
                driver.execute("DEALLOCATE ALL")  # psycopg forgets its own prepared names too
                self._plans_since = time.monotonic()
            if self._local is None:
                rows: Sequence[Any] = driver.execute(
                    prepared.sql, prepared.params(params)
                ).fetchall()
            else:
                # Behind a pooler: pgqueue's timeout and no JIT, for this transaction only.
                with driver.transaction():
                    driver.execute(self._local.sql, self._local.params)
                    rows = driver.execute(prepared.sql, prepared.params(params)).fetchall()
        except psycopg.Error as exc:
            self._release(exc)
            raise DBAPIError.instance(None, None, exc, psycopg.Error) from exc
        return rows

    def close(self) -> None:
        """Give the connection back to the pool (a later ``rows`` checks out another)."""
        self._release(None)

    def _release(self, error: BaseException | None) -> None:
        import psycopg

        raw, self._raw = self._raw, None
        if raw is None:
            return
        driver = raw.driver_connection
        if error is not None and self.engine.dialect.is_disconnect(
            error,  # type: ignore[arg-type]
            raw.dbapi_connection,
            None,
        ):
            raw.invalidate(error)
        elif not driver.closed:
            try:
                driver.autocommit = False
            except psycopg.Error as exc:
                raw.invalidate(exc)
        raw.close()


def _checkout(engine: Engine) -> Any:
    """A pooled connection of ``engine``; a failure to connect is raised as SQLAlchemy's own
    checkout raises it (``DBAPIError``), so callers classify it the same way."""
    import psycopg

    try:
        return engine.raw_connection()
    except psycopg.Error as exc:
        raise DBAPIError.instance(None, None, exc, psycopg.Error) from exc


def _one_on_sqlalchemy(engine: Engine, statement: Executable, params: dict[str, Any]) -> Any:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        return connection.execute(statement, params).scalar_one()


def run_on_driver(
    engine: Engine,
    work: Callable[[Any], T],
    *,
    autocommit: bool,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """Run ``work(psycopg_connection)`` on a pooled connection of ``engine`` (only where
    ``driver_usable``):
    in autocommit mode, or in one transaction committed at the end. Transient conflicts are
    retried; errors are raised as SQLAlchemy's ``DBAPIError`` subclasses, as on any other path,
    and a lost connection is dropped from the pool."""
    import psycopg

    from pgqueue.connections import local_settings

    local = local_settings(engine)

    def once() -> T:
        raw = _checkout(engine)
        driver: Any = raw.driver_connection
        try:
            if autocommit:
                driver.autocommit = True
                try:
                    return work(driver)
                finally:
                    if not driver.closed:
                        driver.autocommit = False
            with driver.transaction():
                if local is not None:
                    driver.execute(local.sql, local.params)
                return work(driver)
        except psycopg.Error as exc:
            if engine.dialect.is_disconnect(exc, raw.dbapi_connection, None):  # type: ignore[arg-type]
                raw.invalidate(exc)
            raise DBAPIError.instance(None, None, exc, psycopg.Error) from exc
        finally:
            raw.close()

    return _retrying(once, attempts)


def _retrying(once: Callable[[], T], attempts: int) -> T:
    """``once()``, run again (with jittered backoff) on a deadlock or serialization failure, up
    to ``attempts`` times in all; and once more, at once, when the server ended the session
    before the work committed (``errors.ended_before_commit``), so a connection killed while it
    sat in the pool (restart, failover, ``pg_terminate_backend``) is not the caller's problem."""
    reconnected = False
    attempt = 1
    while True:
        try:
            return once()
        except DBAPIError as exc:
            if not reconnected and ended_before_commit(exc):
                reconnected = True
                log.info("connection ended by the server (%s); retrying once", exc.orig)
                continue
            if attempt >= attempts or not is_transient_conflict(exc):
                raise
            pause = min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.5)
            log.info("transient conflict (%s), retrying in %.3fs", exc.orig, pause)
            time.sleep(pause)
            attempt += 1


class DriverStatement:
    """A statement of ``queries`` compiled once for the driver connection: its SQL text, the
    values of the binds it carries itself (literals) and SQLAlchemy's bind processors for the
    others, so ``params`` gives exactly what SQLAlchemy would send."""

    def __init__(self, statement: Executable, engine: Engine) -> None:
        dialect = engine.dialect
        compiled: Any = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        if compiled.positional or compiled.literal_execute_params or compiled.post_compile_params:
            raise AssertionError("a driver statement needs named, fully rendered parameters")
        self.statement = statement
        self.sql: str = str(compiled)
        self.defaults: dict[str, Any] = {}
        self.processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if bind.required:
                if process is not None:
                    self.processors[name] = process
            elif bind.value is not None:
                self.defaults[name] = process(bind.value) if process else bind.value

    def params(self, given: dict[str, Any]) -> dict[str, Any]:
        values = {**self.defaults, **given}
        for name, process in self.processors.items():
            if name in values:
                values[name] = process(values[name])
        return values


_driver_statements: dict[tuple[int, int], DriverStatement] = {}


def driver_statement(statement: Executable, engine: Engine) -> DriverStatement:
    """``DriverStatement`` for ``statement`` on ``engine``, cached (the statements of
    ``queries`` are cached too, so ``id`` identifies them; the entry keeps it alive)."""
    key = (id(statement), id(engine.dialect))
    found = _driver_statements.get(key)
    if found is None or found.statement is not statement:
        found = _driver_statements[key] = DriverStatement(statement, engine)
    return found


def in_caller_or_own_transaction(
    session: Session | None,
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
) -> T:
    """Run in the caller's session (no commit, no retry) or in an own transaction."""
    if session is not None:
        return work(session)
    return run_in_transaction(sessions, work)
