"""The one way pgqueue's data layer reaches the database.

An ``Executor`` runs a statement of ``pgqueue.sql`` and gives its rows, or copies text rows
into a table. There are two implementations: ``ConnectionExecutor`` on a SQLAlchemy
``Connection`` (a caller's ``Session``, or a connection of pgqueue's own), and
``driver.DriverExecutor`` on the psycopg connection under it, which sends statements compiled
once. The data layer's operations (``pgqueue.data``) are written once, over ``Executor``. Each
executor also carries where jobs are (``tables``, a ``jobs.JobTables``: whether reads of jobs
cover the partitioned history), set by its maker from the settings of the queue or worker it
serves, so no data call takes it as an argument.

``Database`` is pgqueue's access to one engine: it opens a connection for one unit of work
(autocommit or one transaction) and hands the work the executor for it, with the tables its
owner's ``tables`` gives at that unit's start, keeps the compiled statements, and holds the
claimer's connection. Which executor a unit gets is decided here and nowhere else
(``uses_driver``): the driver's when the engine is psycopg and nothing watches its statements.
That is looked at when a unit begins, not once: tracing, logging and tests may add listeners to
an engine at any time, and must then see every statement.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable

from pgqueue import driver
from pgqueue.connections import is_dead, local_settings
from pgqueue.errors import ConfigurationError
from pgqueue.jobs import IN_PLACE, JobTables

T = TypeVar("T")


class Executor(Protocol):
    """Runs pgqueue's statements in the transaction its owner opened; never commits."""

    tables: JobTables
    """Where the data layer's reads of jobs look, as its maker's settings say."""

    def rows(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Sequence[Any]:
        """All rows of ``statement`` with ``params`` (positional rows; none for a statement
        that returns none)."""
        ...

    def timed_rows(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> tuple[Sequence[Any], float]:
        """``rows`` of ``statement``, and the monotonic time just before it went to the server
        (after compiling it and any connection set-up), which precedes the server's
        ``statement_timestamp()`` for it."""
        ...

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        """``COPY ... FROM STDIN`` (``statement``) fed with ``chunks`` of COPY text."""
        ...


class ConnectionExecutor:
    """``Executor`` on a SQLAlchemy ``Connection``: every statement goes through SQLAlchemy's
    execution layer (events, echo, error handlers, its statement cache)."""

    def __init__(self, connection: Connection, tables: JobTables = IN_PLACE) -> None:
        self.connection = connection
        self.tables = tables

    def rows(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Sequence[Any]:
        result = self.connection.execute(statement, dict(params or {}))
        return result.all() if result.returns_rows else ()

    def timed_rows(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> tuple[Sequence[Any], float]:
        # SQLAlchemy compiles inside execute: the reading comes before that, a few
        # milliseconds early on a statement's first run, never late.
        sent = time.monotonic()
        return self.rows(statement, params), sent

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        # COPY has no SQLAlchemy construct: it runs on the psycopg connection underneath, in
        # the same transaction. Enqueues choose it only on psycopg 3 (``Database.uses_driver``),
        # so another driver here is a caller's mistake, told in one line.
        raw: Any = self.connection.connection.driver_connection
        if not isinstance(raw, psycopg.Connection):
            raise ConfigurationError(
                "pgqueue's COPY needs the psycopg 3 driver, got driver "
                f"{self.connection.dialect.driver!r}: use a postgresql+psycopg:// URL"
            )
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            for chunk in chunks:
                copy.write(chunk)


_EXECUTORS = (
    ConnectionExecutor,
    driver.DriverExecutor,
    driver.HeldConnection,
    driver.AwaitedConnection,
)


def executor_for(db: Session | Executor, tables: JobTables = IN_PLACE) -> Executor:
    """The executor of a caller's session (its connection, its transaction; any object with
    the ``Session`` interface, such as a ``scoped_session``) reading jobs in ``tables``, or
    ``db`` itself (with its own tables) when it is an executor already."""
    if isinstance(db, _EXECUTORS):
        return db
    return ConnectionExecutor(cast(Session, db).connection(), tables)


def watches_statements(engine: Engine) -> bool:
    """Whether something watches ``engine``'s statements (``echo``, cursor or execute event
    listeners, error handlers): they would miss what bypasses SQLAlchemy's execution layer."""
    if engine.echo:
        return True
    dispatch = engine.dispatch
    return bool(
        dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or dispatch.before_execute
        or dispatch.after_execute
        or engine.dialect.dispatch.handle_error
    )


class Database:
    """pgqueue's access to ``engine``: units of work on the right executor, compiled statements,
    and the claimer's held connection. One per engine owner (``PgQueue``, ``WorkerStore``),
    whose ``tables`` says where jobs are: asked once per unit of work, so an owner whose
    settings are replaced is followed from its next unit on."""

    def __init__(
        self,
        engine: Engine,
        *,
        keeps_a_connection: bool = False,
        tables: Callable[[], JobTables] = lambda: IN_PLACE,
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.statements = driver.CompiledStatements(engine.dialect)
        self.local = local_settings(engine)
        self._kept = KeptConnection(self) if keeps_a_connection else None

    @property
    def uses_driver(self) -> bool:
        """Whether units of work go to the driver: only on psycopg, and only when nothing
        watches statements (``echo``, cursor or execute event listeners, error handlers), so
        tracing and logging see every statement they would see on SQLAlchemy."""
        engine = self.engine
        return engine.dialect.driver == "psycopg" and not watches_statements(engine)

    def run(self, work: Callable[[Executor], T], *, autocommit: bool) -> T:
        """``work(executor)`` once, on a pooled connection: in autocommit mode (each statement
        its own transaction), or in one transaction committed when ``work`` returns. Errors
        are SQLAlchemy's ``DBAPIError`` subclasses on either path; retries are ``uow``'s."""
        tables = self.tables()
        if self.uses_driver:
            return driver.run(
                self.engine, self.statements, self.local, work, autocommit=autocommit, tables=tables
            )
        if autocommit:
            with self.engine.connect() as connection:
                connection.execution_options(isolation_level="AUTOCOMMIT")
                return work(ConnectionExecutor(connection, tables))
        with self.engine.begin() as connection:
            return work(ConnectionExecutor(connection, tables))

    def run_single(self, work: Callable[[Executor], T]) -> T:
        """``work(executor)`` once in autocommit mode, on the connection kept for single
        statements when this database keeps one and the driver is used (``KeptConnection``),
        else as ``run(work, autocommit=True)``."""
        kept = self._kept
        if kept is None or not self.uses_driver:
            return self.run(work, autocommit=True)
        return kept.run(work, self.tables())

    def close(self) -> None:
        """Give the kept connection back to the pool (a later ``run_single`` keeps another)."""
        if self._kept is not None:
            self._kept.close()

    def held_connection(self) -> HeldConnection:
        """An executor for autocommit statements of a single user (the claimer) that keeps its
        connection checked out between calls where the driver is used; its tables are those of
        the moment it is made."""
        return HeldConnection(self)


class HeldConnection(driver.HeldConnection):
    """``Executor`` for autocommit statements of one user: on the driver, one connection kept
    checked out between calls (``driver.HeldConnection``); otherwise each statement runs on a
    pooled connection of its own. Not thread-safe; ``close`` gives the connection back."""

    def __init__(self, database: Database) -> None:
        super().__init__(database.engine, database.statements, database.local)
        self._database = database
        self.tables = database.tables()

    def rows(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Sequence[Any]:
        if self._database.uses_driver:
            return super().rows(statement, params)
        return self._database.run(lambda db: db.rows(statement, params), autocommit=True)

    def timed_rows(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> tuple[Sequence[Any], float]:
        if self._database.uses_driver:
            return super().timed_rows(statement, params)
        return self._database.run(lambda db: db.timed_rows(statement, params), autocommit=True)


class KeptConnection:
    """One pooled connection kept checked out, in autocommit, between single-statement units
    of work (``task.enqueue`` of one job outside a caller's transaction): back-to-back
    enqueues skip the pool's checkout and return (``benchmarks.enqueue_layers`` measures it).

    At most one is kept. A caller that finds none (another thread has it) uses a connection of
    its own, kept afterwards if none is by then, else given back. Before each reuse its socket
    is looked at as a pool checkout does (``connections.is_dead``), and a connection the server
    ended is dropped; its prepared statements' plans are refreshed as the claimer's are. A
    child process never touches its parent's connection. Only for an engine pgqueue made (a
    host's engine may have no connection to spare); ``close`` gives it back."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._idle: driver.HeldConnection | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        # In a forked child, the parent's kept connection: its socket, which the child must
        # neither use nor close (closing sends the server a goodbye for the parent's session,
        # as would the pool's clean-up of an object collected), so it is held unused.
        self._parents: list[driver.HeldConnection] = []

    def run(self, work: Callable[[Executor], T], tables: JobTables) -> T:
        if self._pid != os.getpid():
            if self._idle is not None:
                self._parents.append(self._idle)
            self._idle, self._pid, self._lock = None, os.getpid(), threading.Lock()
        with self._lock:
            held, self._idle = self._idle, None
        if held is None:
            # The driver's own: ``run_single`` chose the driver for this unit already.
            database = self._database
            held = driver.HeldConnection(database.engine, database.statements, database.local)
        else:
            connection = held.driver_connection
            if connection is not None and is_dead(connection):
                held.drop()
        held.tables = tables
        try:
            result = work(held)
        except BaseException:
            held.close()
            raise
        with self._lock:
            keep = self._idle is None
            if keep:
                self._idle = held
        if not keep:
            held.close()
        return result

    def close(self) -> None:
        idle, self._idle = self._idle, None
        if idle is not None and self._pid == os.getpid():
            idle.close()
