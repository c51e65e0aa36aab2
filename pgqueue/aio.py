"""asyncio access to the database: pgqueue's units of work on an ``AsyncEngine`` and in a
caller's ``AsyncSession``.

The operations are the data layer's own, written once over ``db.Executor`` and ``Session``.
Here they run through SQLAlchemy's greenlet bridge (``run_sync``): every statement is the same
``pgqueue.sql`` object the synchronous path sends, every wait on the database is an ``await``
on psycopg's asyncio connection, and the Python between two waits is the work the
synchronous path does too (no blocking call), so the event loop is never held. ``COPY``, which has no
SQLAlchemy construct, is awaited on the psycopg ``AsyncConnection`` under the adapter
(``BridgedExecutor``).

Retries are ``uow``'s policy (``uow.aretrying``): a unit of work of pgqueue's own runs again
after a deadlock or serialization failure (its pause awaited, not slept); work in a caller's
session is never retried or committed here, because only the caller knows whether its other
work may repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from sqlalchemy.util import greenlet_spawn

from pgqueue.connections import is_dead, local_settings
from pgqueue.db import ConnectionExecutor, Executor, watches_statements
from pgqueue.driver import AwaitedConnection, CompiledStatements, awaited_copy
from pgqueue.errors import ConfigurationError, ValidationError
from pgqueue.jobs import IN_PLACE, JobTables
from pgqueue.uow import DEFAULT_ATTEMPTS, aretrying

T = TypeVar("T")


def check_async_session(session: object) -> AsyncSession | None:
    """``session`` when it is an ``AsyncSession`` (or None); else a ValidationError."""
    if session is None or isinstance(session, AsyncSession):
        return session
    if isinstance(session, Session):
        raise ValidationError(
            "session is a synchronous Session: the asyncio calls need an AsyncSession "
            "(or call the synchronous enqueue)"
        )
    raise ValidationError(
        f"session must be a SQLAlchemy AsyncSession, got {type(session).__name__}"
    )


def check_async_engine(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` when it runs on psycopg's asyncio driver; else a ConfigurationError."""
    dialect = engine.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg" or not dialect.is_async:
        raise ConfigurationError(
            "pgqueue needs an AsyncEngine on psycopg's asyncio driver "
            f"(postgresql+psycopg_async://...), got {dialect.name}+{dialect.driver}"
        )
    return engine


class BridgedExecutor(ConnectionExecutor):
    """``db.Executor`` on the synchronous face of an ``AsyncConnection`` (inside ``run_sync``):
    statements go through SQLAlchemy as on ``ConnectionExecutor``; ``COPY`` is awaited on the
    psycopg ``AsyncConnection`` underneath, in the same transaction."""

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        adapted: Any = self.connection.connection.dbapi_connection
        adapted.run_async(lambda raw: awaited_copy(raw, statement, chunks))


class AsyncDatabase:
    """pgqueue's access to an ``AsyncEngine``: units of work of its own (retried on transient
    conflicts) and work in a caller's ``AsyncSession``.

    With ``keeps_a_connection`` (only for an engine pgqueue made: a host's engine may have no
    connection to spare), single-statement units (``run_single``) run on one connection kept
    between them (``driver.AwaitedConnection``), past SQLAlchemy's asyncio engine and its pool:
    their checkout, return and execution cost more than the statement's round trip. At most one
    is kept; a unit that finds it in use by another task runs on a pooled connection. Before
    each reuse its socket is looked at, as a pool checkout does (``connections.is_dead``);
    ``close`` ends it. ``tables`` says where jobs are, asked once per unit of work, as
    ``db.Database`` does."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        keeps_a_connection: bool = False,
        tables: Callable[[], JobTables] = lambda: IN_PLACE,
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._keeps_a_connection = keeps_a_connection
        self._statements = CompiledStatements(engine.dialect)
        self._local = local_settings(engine.sync_engine)
        self._kept: AwaitedConnection | None = None
        self._kept_in_use = False

    @property
    def may_copy(self) -> bool:
        """Whether ``COPY`` may carry an insert: only when nothing watches the engine's
        statements (COPY's rows would pass them by)."""
        return not watches_statements(self.engine.sync_engine)

    async def run(
        self,
        work: Callable[[Executor], T],
        *,
        autocommit: bool = False,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> T:
        """``work(executor)`` in one committed transaction (or in autocommit mode: each
        statement its own transaction), retrying transient conflicts."""
        return await aretrying(lambda: self._once(work, autocommit=autocommit), attempts)

    async def _once(self, work: Callable[[Executor], T], *, autocommit: bool) -> T:
        tables = self.tables()
        async with self.engine.connect() as connection:
            if autocommit:
                await connection.execution_options(isolation_level="AUTOCOMMIT")
                return await connection.run_sync(lambda sync: work(BridgedExecutor(sync, tables)))
            async with connection.begin():
                return await connection.run_sync(lambda sync: work(BridgedExecutor(sync, tables)))

    async def run_single(self, work: Callable[[Executor], T]) -> T:
        """``work(executor)`` in autocommit mode on the connection kept for single statements
        when this database keeps one and nothing watches the engine's statements, else as
        ``run(work, autocommit=True)``; transient conflicts retried."""
        if not self._keeps_a_connection or watches_statements(self.engine.sync_engine):
            return await self.run(work, autocommit=True)
        return await aretrying(lambda: self._on_kept(work))

    async def _on_kept(self, work: Callable[[Executor], T]) -> T:
        kept = self._kept
        if kept is None:
            kept = self._kept = AwaitedConnection(
                self.engine.sync_engine, self._statements, self._local
            )
        elif self._kept_in_use:
            return await self._once(work, autocommit=True)
        self._kept_in_use = True
        try:
            if kept.connection is not None and is_dead(kept.connection):
                kept.close()
            kept.tables = self.tables()
            return await greenlet_spawn(work, kept)
        except BaseException:
            kept.close()
            raise
        finally:
            self._kept_in_use = False

    def close(self) -> None:
        """End the kept connection (a later ``run_single`` makes another); nothing awaited, so
        also for a loop that has ended."""
        if self._kept is not None:
            self._kept.close()

    async def in_caller_or_own_session(
        self, session: AsyncSession | None, work: Callable[[Session], T]
    ) -> T:
        """``work(session)`` in the caller's session (no commit, no retry), or in a session of
        its own committed when ``work`` returns (retried on transient conflicts)."""
        if session is not None:
            return await session.run_sync(work)

        async def once() -> T:
            async with self.sessions() as own, own.begin():
                return await own.run_sync(work)

        return await aretrying(once, DEFAULT_ATTEMPTS)

    async def read(self, work: Callable[[Session], T]) -> T:
        """``work(session)`` in a session of its own, ended without a commit; sent again as
        ``aretrying`` decides (a read is safe to repeat)."""

        async def once() -> T:
            async with self.sessions() as own:
                return await own.run_sync(work)

        return await aretrying(once)
