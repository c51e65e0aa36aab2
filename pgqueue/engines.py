"""Where a ``PgQueue``'s connections come from, in one object (``Engines``): the database it
resolves (a URL, an Engine, an AsyncEngine, ``$PGQUEUE_DATABASE_URL``, or, with a WARNING, the
embedded PostgreSQL server, started on first use), pgqueue's own engine and the handlers'
engine, the session factory and ``db.Database`` over them, one ``aio.AsyncDatabase`` per event
loop, the LISTEN connections, where jobs are (``tables``), and disposing of them all.

The engines are made on first use with the settings of that moment (``settings`` is read each
time), and made again after ``dispose``; an engine or AsyncEngine the application gave is
adapted once, used as it is, and never disposed here. Where jobs are (``tables``) is read from
the settings at each unit of work instead, so replaced settings move every read of jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

from pgqueue import connections
from pgqueue.aio import AsyncDatabase, check_async_engine
from pgqueue.config import Settings, embedded_database_name
from pgqueue.database_urls import normalize_database_url
from pgqueue.db import Database
from pgqueue.errors import ConfigurationError, pgqueue_logger
from pgqueue.jobs import JobTables
from pgqueue.sql.server import name_listener_session

logger = pgqueue_logger(__name__)


class Engines:
    """The engines, sessions and database access of one ``PgQueue`` (see the module)."""

    def __init__(
        self,
        database: str | URL | Engine | AsyncEngine | None,
        settings: Callable[[], Settings],
        *,
        session_factory: Callable[[], Session] | None = None,
        async_engine: AsyncEngine | None = None,
    ) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._handler_engine: Engine | None = None
        self._url: URL | None = None
        self._external_session_factory = session_factory
        # pgqueue's own AsyncEngines, one per event loop: an asyncio pool's connections and
        # waiters belong to the loop that made them (tests and threads run several loops).
        self._async_databases: dict[asyncio.AbstractEventLoop, AsyncDatabase] = {}
        self._given_async_engine: AsyncEngine | None = None
        if isinstance(database, AsyncEngine):
            async_engine = database
            database = normalize_database_url(async_engine.url)
        if async_engine is not None:
            connections.adapt_given_engine(check_async_engine(async_engine).sync_engine, settings())
            self._given_async_engine = async_engine
        if isinstance(database, Engine) and database.dialect.name != "postgresql":
            raise ConfigurationError(
                f"pgqueue needs a PostgreSQL engine, got dialect {database.dialect.name!r}"
            )
        if isinstance(database, Engine) and database.dialect.driver != "psycopg":
            # An application's engine on another driver (psycopg2, most Flask apps): its
            # sessions still take enqueues (pgqueue's statements through SQLAlchemy), but
            # pgqueue's own connections need psycopg 3, so they are made on its URL.
            _note_own_engines(database)
            database = database.url
        if isinstance(database, Engine):
            connections.adapt_given_engine(database, settings())
            self._engine = database
            self._handler_engine = database
        elif database is not None:
            self._url = normalize_database_url(database)
        elif (configured := settings().database_url) is not None:
            self._url = normalize_database_url(configured)
        else:
            _warn_embedded(settings())  # started on first use

    @property
    def url(self) -> URL:
        """The database URL (starts the embedded server if that is the database)."""
        if self._url is None:
            if self._engine is not None:
                return self._engine.url
            from pgqueue import embedded

            settings = self._settings()
            server = embedded.shared_server(
                settings.embedded_data_dir, bin_dir=settings.embedded_bin_dir
            )
            self._url = normalize_database_url(
                embedded.app_database(server, embedded_database_name(settings))
            )
        return self._url

    @property
    def engine(self) -> Engine:
        """Engine for pgqueue's own short transactions (statement timeout applied, no JIT)."""
        with self._lock:
            self._engine = self._made(self._engine, connections.create_queue_engine, 5, 10)
            return self._engine

    @property
    def handler_engine(self) -> Engine:
        """Engine for handlers' sessions: no pgqueue statement timeout on the app's queries."""
        with self._lock:
            self._handler_engine = self._made(
                self._handler_engine, connections.create_handler_engine, 10, 40
            )
            return self._handler_engine

    def _made(
        self, engine: Engine | None, create: Callable[..., Engine], size: int, overflow: int
    ) -> Engine:
        """``engine``, or one that ``create`` makes now (under ``_lock``) with a pool of
        ``size`` connections and ``overflow`` more, on ``url`` with the settings of this
        moment."""
        if engine is not None:
            return engine
        return create(self.url, self._settings(), pool_size=size, max_overflow=overflow)

    @property
    def sessions(self) -> sessionmaker[Session]:
        """The session factory of ``engine``."""
        factory = self._sessions
        if factory is None:
            factory = self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        return factory

    @functools.cached_property
    def database(self) -> Database:
        """pgqueue's access to ``engine`` for its own units of work (``db.Database``)."""
        engine = self.engine
        # A connection is kept for single enqueues only on an engine of pgqueue's own (5 + 10
        # overflow): a host's engine may be sized to its threads with none to spare.
        return Database(engine, keeps_a_connection=self._url is not None, tables=self.tables)

    def tables(self) -> JobTables:
        """Where jobs are (``jobs.JobTables``) under the settings of this moment: the tables
        every executor made for this queue reads jobs in."""
        return JobTables.of(self._settings())

    def handler_session(self) -> Session:
        """A new session for a handler (the host's factory when one was given)."""
        if self._external_session_factory is not None:
            return self._external_session_factory()
        return Session(self.handler_engine, expire_on_commit=False)

    @property
    def can_listen(self) -> bool:
        """Whether LISTEN works: not through a transaction pooler (a notification goes to the
        server session that listened, which such a pooler hands to other clients), unless
        ``listen_database_url`` names a way around it."""
        settings = self._settings()
        return settings.pooler != "transaction" or settings.listen_database_url is not None

    @contextlib.contextmanager
    def listen_connection(self) -> Iterator[Any]:
        """A new autocommit psycopg connection for LISTEN, made like every connection of
        ``engine`` (URL, ``connect_args``, ``creator`` and ``do_connect`` hooks, TLS), or to
        ``listen_database_url``; closed on exit, never returned to a pool."""
        listen_url = self._settings().listen_database_url
        if listen_url is not None:
            import psycopg

            with psycopg.connect(
                connections.conninfo(normalize_database_url(listen_url)),
                autocommit=True,
                application_name="pgqueue-listener",
            ) as direct:
                yield direct
            return
        raw = self.engine.raw_connection()
        connection = raw.driver_connection
        assert connection is not None
        # Out of the pool for good. ``raw`` is kept until the end (its garbage collection would
        # close the connection) and then dropped without the pool's reset, which would fail,
        # and log, on a connection the server ended.
        raw.detach()
        try:
            connection.autocommit = True
            # Its own session, never pooled: naming it cannot leak to another user.
            connection.execute(name_listener_session())
            yield connection
        finally:
            connection.close()
            raw.invalidate()

    def dispose(self) -> None:
        """Close the pooled connections of the engines pgqueue made (made again on next use)."""
        with self._lock:
            if "database" in self.__dict__:
                self.database.close()
            self._forget_ended_loops()
            for engine in {self._engine, self._handler_engine}:
                if engine is not None and self._url is not None:
                    engine.dispose()
            if self._url is not None:
                self._engine = None
                self._handler_engine = None
                self._sessions = None

    # -- asyncio -----------------------------------------------------------------------------

    @property
    def async_database(self) -> AsyncDatabase:
        """pgqueue's access to the AsyncEngine of the running loop: the one given, or one made
        for this loop on first use, with psycopg's asyncio driver and the settings of
        ``engine`` (timeouts, no JIT, pooler mode)."""
        loop = asyncio.get_running_loop()
        database = self._async_databases.get(loop)
        if database is None:
            with self._lock:
                self._forget_ended_loops()
                given = self._given_async_engine
                engine = given or connections.create_async_queue_engine(
                    self.url, self._settings(), pool_size=5, max_overflow=10
                )
                database = self._async_databases[loop] = AsyncDatabase(
                    engine, keeps_a_connection=given is None, tables=self.tables
                )
        return database

    def _forget_ended_loops(self) -> None:
        """Drop the asyncio databases of loops that have ended, ending their kept connections:
        nothing else would (a running loop's are ``adispose``'s). Called under ``_lock``."""
        for ended in [loop for loop in self._async_databases if loop.is_closed()]:
            self._async_databases.pop(ended).close()

    async def running_async_database(self) -> AsyncDatabase:
        """``async_database``; the URL looked up off the loop first when that may start the
        embedded server (seconds of subprocesses and waiting)."""
        database = self._async_databases.get(asyncio.get_running_loop())
        if database is not None:
            return database
        if self._url is None and self._engine is None and self._given_async_engine is None:
            await asyncio.to_thread(lambda: self.url)
        return self.async_database

    async def adispose(self) -> None:
        """Close the pooled connections of the AsyncEngine pgqueue made for the running loop
        (made again on next use); the synchronous engines are ``dispose``'s."""
        database = self._async_databases.pop(asyncio.get_running_loop(), None)
        if database is not None:
            database.close()
            if database.engine is not self._given_async_engine:
                await database.engine.dispose()


def _note_own_engines(given: Engine) -> None:
    # Only the URL carries over: what the application gave its engine besides (connect_args,
    # a creator) is not seen by pgqueue's connections, which this line tells.
    logger.info(
        "the engine given to pgqueue uses driver %s: pgqueue's own connections use psycopg 3 "
        "on the same URL (postgresql+psycopg://), and enqueues in the application's sessions "
        "go through SQLAlchemy on %s",
        given.dialect.driver,
        given.dialect.driver,
    )


# Marks the log record of the fallback, for the CLI: it shows the WARNING where a process runs
# (a worker), and at INFO for a command that only reads or sets something.
EMBEDDED_FALLBACK: Final = "pgqueue_embedded_fallback"


def _warn_embedded(settings: Settings) -> None:
    # Silently falling back would give every production host its own private queue, gone when
    # the process that started the server exits; this line is how such a deployment notices.
    from pgqueue import embedded

    data_dir = settings.embedded_data_dir or str(embedded.default_data_dir())
    database = embedded_database_name(settings)
    named = (
        "as embedded_database says"
        if settings.embedded_database
        else "named after the current directory; PGQUEUE_EMBEDDED_DATABASE names another"
    )
    logger.warning(
        "no database configured: pgqueue uses database %s (%s) "
        "of its embedded PostgreSQL server in %s, which is for development, "
        "demos and tests only (one per host, stopped when the process that started it exits). "
        "For a real server pass a URL or Engine to PgQueue, or set PGQUEUE_DATABASE_URL.",
        database,
        named,
        data_dir,
        extra={EMBEDDED_FALLBACK: True},
    )
