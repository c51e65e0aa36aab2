"""``PgQueue``: the object an application creates once; it owns engines, tasks and job control.

It resolves where the database is (a URL, an Engine, ``$PGQUEUE_DATABASE_URL``, or, with a
WARNING, the embedded PostgreSQL server for development, started lazily on first use), registers
tasks, inserts jobs for them, and
runs workers. ``pgq.admin`` (``pgqueue.admin.Admin``) is the job and queue control API; the
job-control methods here (``get_job``, ``retry_job``, ``cancel_job`` ...) are shortcuts to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session, sessionmaker

from pgqueue import connections, history, uow
from pgqueue.admin import Admin, KeyOverride, check_job_id
from pgqueue.aio import AsyncDatabase, check_async_engine, check_async_session
from pgqueue.config import Settings, normalize_database_url
from pgqueue.data import admin as admin_data
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import maintenance as maintenance_data
from pgqueue.data.history import JobTables
from pgqueue.data.insert_choice import COPY_THRESHOLD, BoundedQueuesSeen, insert_path
from pgqueue.db import Database
from pgqueue.errors import ConfigurationError, ValidationError, pgqueue_logger
from pgqueue.explain import JobExplanation
from pgqueue.jobs import NewJob
from pgqueue.models import Job
from pgqueue.scheduler import Schedule, Scheduler
from pgqueue.sql.server import name_listener_session
from pgqueue.states import JobState
from pgqueue.tasks import Task, TaskOptions, TaskRegistry, task_name_for
from pgqueue.tracing import Tracing, tracing_for
from pgqueue.waiting import JobWaiter

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["COPY_THRESHOLD", "PgQueue"]

logger = pgqueue_logger(__name__)


class PgQueue:
    """A job queue in a PostgreSQL database.

    ``database`` is a SQLAlchemy URL (``postgresql+psycopg://...``), an ``Engine``, or None for
    ``$PGQUEUE_DATABASE_URL`` and, failing that, the embedded PostgreSQL server (for development,
    demos and tests; one WARNING says so). URLs are checked here, before anything connects.

    The asyncio calls (``aenqueue``, ``aget_job`` ...) use ``async_engine`` when given, else
    one made on first use from the same URL with psycopg's asyncio driver and the settings of
    ``engine``. ``database`` may also be an ``AsyncEngine``: the asyncio calls use it, and the
    synchronous ones (and workers) engines made from its URL.
    """

    def __init__(
        self,
        database: str | URL | Engine | AsyncEngine | None = None,
        *,
        settings: Settings | None = None,
        session_factory: Callable[[], Session] | None = None,
        async_engine: AsyncEngine | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        # None when tracing is off: each enqueue then tests this once and nothing more.
        self.tracing: Tracing | None = tracing_for(self.settings)
        self.registry = TaskRegistry()
        self.schedules: dict[str, Schedule] = {}
        self._scheduler: Scheduler | None = None
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
        # The queues this object's enqueues believe bounded (``insert_choice``): a shortcut to
        # their checked insert, corrected by the database on every enqueue into them, and told
        # of the bounds ``admin`` sets.
        self._bounded_queues = BoundedQueuesSeen()
        if isinstance(database, AsyncEngine):
            async_engine = database
            database = normalize_database_url(async_engine.url)
        if async_engine is not None:
            connections.adapt_given_engine(
                check_async_engine(async_engine).sync_engine, self.settings
            )
            self._given_async_engine = async_engine
        self.admin = Admin(
            lambda: self.sessions,
            stale_seconds=lambda: self.settings.worker_stale_seconds,
            partitioned_history=lambda: self.settings.partitioned_history,
            bounded_queues=self._bounded_queues,
        )
        # ``get_job`` looked up on each read, so that a wrapper set on the instance sees them.
        self._job_waiter = JobWaiter(
            lambda job_id: self.get_job(job_id),
            lambda job_id: uow.run(
                self.database, lambda db: admin_data.mark_awaited(db, job_id), autocommit=True
            ),
            self.listen_connection,
            lambda: self.can_listen,
        )
        if isinstance(database, Engine):
            if database.dialect.name != "postgresql":
                raise ConfigurationError(
                    f"pgqueue needs a PostgreSQL engine, got dialect {database.dialect.name!r}"
                )
            connections.adapt_given_engine(database, self.settings)
            self._engine = database
            self._handler_engine = database
        elif database is not None:
            self._url = normalize_database_url(database)
        elif self.settings.database_url is not None:
            self._url = normalize_database_url(self.settings.database_url)
        else:
            _warn_embedded(self.settings)  # started on first use

    # -- engines -----------------------------------------------------------------------------

    @property
    def url(self) -> URL:
        """The database URL (starts the embedded server if that is the database)."""
        if self._url is None:
            if self._engine is not None:
                return self._engine.url
            from pgqueue import embedded

            self._url = normalize_database_url(
                embedded.shared_server(
                    self.settings.embedded_data_dir, bin_dir=self.settings.embedded_bin_dir
                )
            )
        return self._url

    @property
    def engine(self) -> Engine:
        """Engine for pgqueue's own short transactions (statement timeout applied, no JIT)."""
        with self._lock:
            if self._engine is None:
                self._engine = connections.create_queue_engine(
                    self.url, self.settings, pool_size=5, max_overflow=10
                )
            return self._engine

    @property
    def handler_engine(self) -> Engine:
        """Engine for handlers' sessions: no pgqueue statement timeout on the app's queries."""
        with self._lock:
            if self._handler_engine is None:
                self._handler_engine = connections.create_handler_engine(
                    self.url, self.settings, pool_size=10, max_overflow=40
                )
            return self._handler_engine

    @property
    def can_listen(self) -> bool:
        """Whether workers can LISTEN: not through a transaction pooler (a notification goes to
        the server session that listened, which such a pooler hands to other clients), unless
        ``listen_database_url`` names a way around it."""
        settings = self.settings
        return settings.pooler != "transaction" or settings.listen_database_url is not None

    @contextlib.contextmanager
    def listen_connection(self) -> Iterator[Any]:
        """A new autocommit psycopg connection for LISTEN, made like every connection of
        ``engine`` (URL, ``connect_args``, ``creator`` and ``do_connect`` hooks, TLS), or to
        ``listen_database_url``; closed on exit, never returned to a pool."""
        listen_url = self.settings.listen_database_url
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

    @property
    def sessions(self) -> sessionmaker[Session]:
        factory = self._sessions
        if factory is None:
            factory = self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        return factory

    def handler_session(self) -> Session:
        """A new session for a handler (the host's factory when one was given)."""
        if self._external_session_factory is not None:
            return self._external_session_factory()
        return Session(self.handler_engine, expire_on_commit=False)

    def dispose(self) -> None:
        """Close pooled connections and the wait listener (both are recreated on next use)."""
        self._job_waiter.close()
        with self._lock:
            for engine in {self._engine, self._handler_engine}:
                if engine is not None and self._url is not None:
                    engine.dispose()
            if self._url is not None:
                self._engine = None
                self._handler_engine = None
                self._sessions = None

    # -- schema ------------------------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Upgrade pgqueue's own tables (its Alembic lineage) to ``revision``."""
        from pgqueue import migrations

        with self.engine.begin() as connection:
            migrations.upgrade(
                connection, revision, lock_timeout=self.settings.migration_lock_timeout
            )

    # -- tasks -------------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, **options: Unpack[TaskOptions]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function as a task (usable bare, ``@pgq.task``, or with the options of
        ``pgqueue.tasks.TaskOptions``)."""

        def register(function: Callable[P, R]) -> Task[P, R]:
            task = Task(function, sink=self, name=task_name_for(function, name), **options)
            self.registry.add(task)
            return task

        return register(fn) if fn is not None else register

    @functools.cached_property
    def database(self) -> Database:
        """pgqueue's access to ``engine`` for its own units of work (``db.Database``)."""
        return Database(self.engine)

    def insert_jobs(self, session: Session | None, jobs: Sequence[NewJob]) -> list[int]:
        """Insert validated jobs in ``session``'s transaction, or in an own one (in an enqueue
        span that they carry the context of, when tracing is on)."""
        tracing = self.tracing
        if tracing is not None and jobs:
            return tracing.enqueue(jobs, lambda context: self._insert(session, jobs, context))
        return self._insert(session, jobs, None)

    def _insert(
        self, session: Session | None, jobs: Sequence[NewJob], trace_context: str | None
    ) -> list[int]:
        bounded = self._bounded_queues
        path = insert_path(session is not None, jobs, lambda: self.database.uses_driver, bounded)
        if path == "one":
            job = jobs[0]
            job_id = uow.run(
                self.database,
                lambda db: enqueue_data.insert_one_job(db, job, trace_context),
                autocommit=True,
            )
            if job_id is not None:
                return [job_id]
            bounded.suspect([job.queue])
        elif path == "copy":
            if trace_context is None:
                ids = uow.run(self.database, lambda db: enqueue_data.copy_jobs(db, jobs))
            else:
                ids = uow.run(
                    self.database, lambda db: enqueue_data.copy_jobs(db, jobs, trace_context)
                )
            if ids is not None:
                return ids
            bounded.suspect({job.queue for job in jobs})
        # A queue with a bound stopped the plain insert (which wrote nothing): the checked one.
        return uow.in_caller_or_own_transaction(
            session,
            self.sessions,
            lambda s: enqueue_data.insert_jobs(s, jobs, trace_context, bounded),
        )

    # -- job control (shortcuts to ``self.admin``) ------------------------------------------

    def get_job(self, job_id: int) -> Job:
        """A snapshot of one job (detached from any session). Raises JobNotFound."""
        return self.admin.get_job(job_id)

    def explain_job(self, job_id: int) -> JobExplanation:
        """Why job ``job_id`` is not running: see ``Admin.explain_job``."""
        return self.admin.explain_job(job_id)

    def retry_job(self, job_id: int, *, session: Session | None = None) -> None:
        """Make a FAILED or CANCELLED job run again now, whatever its attempt count."""
        self.admin.retry_job(job_id, session=session)

    def cancel_job(self, job_id: int, *, session: Session | None = None) -> JobState:
        """Cancel a waiting job (it never runs) or ask a running one to stop.

        Returns CANCELLED for a waiting job, RUNNING when the running job was flagged (its
        handler sees ``ctx.cancel_requested``; it ends CANCELLED, not retried).
        """
        return self.admin.cancel_job(job_id, session=session)

    # -- waiting for a job to finish (``pgqueue.waiting``) -----------------------------------

    def wait_for(self, job_id: int, *, timeout: float | None = None) -> Job:
        """Block until job ``job_id`` is finished (SUCCEEDED, FAILED or CANCELLED) and return
        it as ``get_job`` does: a failed job is returned, not raised. Woken by the announcement
        of its end, not by polling. ``timeout`` seconds (None: no limit); JobWaitTimeout names
        the job, its state and the timeout. JobNotFound if there is no such job."""
        return self._job_waiter.wait(job_id, timeout)

    async def await_job(self, job_id: int, *, timeout: float | None = None) -> Job:
        """``wait_for`` in an event loop, without blocking it."""
        return await self._job_waiter.await_job(job_id, timeout)

    def counts(self) -> dict[str, dict[JobState, int]]:
        """``{queue: {state: count}}`` over all jobs."""
        return self.admin.counts()

    def prune(self, *, batch_size: int = 10_000) -> int:
        """Delete finished jobs past their retention (see Settings); returns how many."""
        total = 0
        while True:
            deleted = uow.run_in_transaction(
                self.sessions,
                lambda s: maintenance_data.prune_finished(
                    s,
                    succeeded_before=self.settings.succeeded_retention,
                    failed_before=self.settings.failed_retention,
                    limit=batch_size,
                ),
            )
            total += deleted
            if deleted < batch_size:
                return total

    def maintain_history(
        self, *, days_ahead: int = 7, retention_days: int | None = None
    ) -> history.HistoryMaintenance:
        """Keep the partitioned history's partitions (``history="partitioned"``): create the
        partitions of today and the next ``days_ahead`` days, drop the days older than
        ``retention_days`` (default ``Settings.history_retention_days``), and move the rows
        the DEFAULT partition caught into their day's partition. DDL: run it as the owner of
        pgqueue's tables (daily, e.g. from cron); raises ``NotSchemaOwner`` otherwise."""
        retention = (
            self.settings.history_retention_days if retention_days is None else retention_days
        )
        with self.engine.begin() as connection:
            return history.maintain(connection, days_ahead=days_ahead, retention_days=retention)

    # -- workers -----------------------------------------------------------------------------

    def run_worker(
        self,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        drain: bool = False,
        **options: Any,
    ) -> Any:
        """Run a worker in this thread until stopped (or, with ``drain``, until idle).

        Returns the worker's stats. Other options: see ``pgqueue.worker.Worker``.
        """
        from pgqueue.worker import Worker

        worker = Worker(self, queues=queues, concurrency=concurrency, **options)
        return worker.run(drain=drain)

    # -- asyncio -----------------------------------------------------------------------------

    @property
    def async_engine(self) -> AsyncEngine:
        """The AsyncEngine of the asyncio calls on the running event loop: the one given, or
        one pgqueue made for this loop on first use, with psycopg's asyncio driver and the
        settings of ``engine`` (timeouts, no JIT, pooler mode)."""
        return self.async_database.engine

    @property
    def async_database(self) -> AsyncDatabase:
        """pgqueue's access to ``async_engine`` (``aio.AsyncDatabase``) on the running loop."""
        loop = asyncio.get_running_loop()
        database = self._async_databases.get(loop)
        if database is None:
            with self._lock:
                for closed in [known for known in self._async_databases if known.is_closed()]:
                    del self._async_databases[closed]
                engine = self._given_async_engine or connections.create_async_queue_engine(
                    self.url, self.settings, pool_size=5, max_overflow=10
                )
                database = self._async_databases[loop] = AsyncDatabase(engine)
        return database

    async def _async_db(self) -> AsyncDatabase:
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
        (made again on next use), then those of the synchronous engines (``dispose``). Await
        it before the event loop closes."""
        database = self._async_databases.pop(asyncio.get_running_loop(), None)
        if database is not None and database.engine is not self._given_async_engine:
            await database.engine.dispose()
        self.dispose()

    async def ainsert_jobs(self, session: AsyncSession | None, jobs: Sequence[NewJob]) -> list[int]:
        """``insert_jobs`` for asyncio: in ``session``'s transaction (an ``AsyncSession``), or
        in an own one on ``async_engine``; the same statements, each wait awaited."""
        tracing = self.tracing
        if tracing is not None and jobs:
            with tracing.enqueue_span(jobs) as span:
                return span.inserted(await self._ainsert(session, jobs, span.trace_context))
        return await self._ainsert(session, jobs, None)

    async def _ainsert(
        self, session: AsyncSession | None, jobs: Sequence[NewJob], trace_context: str | None
    ) -> list[int]:
        database = await self._async_db()
        bounded = self._bounded_queues
        path = insert_path(session is not None, jobs, lambda: database.may_copy, bounded)
        if path == "one":
            job = jobs[0]
            job_id = await database.run(
                lambda db: enqueue_data.insert_one_job(db, job, trace_context), autocommit=True
            )
            if job_id is not None:
                return [job_id]
            bounded.suspect([job.queue])
        elif path == "copy":
            ids = await database.run(lambda db: enqueue_data.copy_jobs(db, jobs, trace_context))
            if ids is not None:
                return ids
            bounded.suspect({job.queue for job in jobs})
        return await database.in_caller_or_own_session(
            session, lambda s: enqueue_data.insert_jobs(s, jobs, trace_context, bounded)
        )

    async def aget_job(self, job_id: int) -> Job:
        """``get_job`` for asyncio. Raises JobNotFound."""
        job_id = check_job_id(job_id)
        database = await self._async_db()
        tables = JobTables.of(self.settings)
        return await database.read(lambda s: admin_data.job_snapshot(s, job_id, tables))

    async def aretry_job(self, job_id: int, *, session: AsyncSession | None = None) -> None:
        """``retry_job`` for asyncio (in ``session``'s transaction when given)."""
        job_id = check_job_id(job_id)
        session = check_async_session(session)
        database = await self._async_db()
        await database.in_caller_or_own_session(
            session, lambda s: self.admin.retry_job(job_id, session=s)
        )

    async def acancel_job(self, job_id: int, *, session: AsyncSession | None = None) -> JobState:
        """``cancel_job`` for asyncio (in ``session``'s transaction when given)."""
        job_id = check_job_id(job_id)
        session = check_async_session(session)
        database = await self._async_db()
        return await database.in_caller_or_own_session(
            session, lambda s: self.admin.cancel_job(job_id, session=s)
        )

    # -- schedules and queue control ---------------------------------------------------------

    def periodic(
        self,
        cron: str,
        *,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        missed: str = "latest",
    ) -> Callable[[Task[P, R]], Task[P, R]]:
        """Run a task on a cron schedule in time zone ``tz``; put it above ``@pgq.task``.

        ``missed`` says what happens to ticks missed while no scheduler ran: ``"latest"`` runs
        the latest one once, ``"all"`` runs them all, ``"skip"`` drops them. Each tick is
        enqueued exactly once however many workers run the scheduler.
        """

        def register(task: Task[P, R]) -> Task[P, R]:
            if not isinstance(task, Task):
                raise ValidationError("@pgq.periodic goes above @pgq.task (it needs a Task)")
            schedule = Schedule.create(
                cron, task, tz=tz, name=name, args=args, kwargs=kwargs, missed=missed
            )
            if schedule.name in self.schedules:
                raise ValidationError(
                    f"a schedule named {schedule.name!r} exists already; pass name="
                )
            self.schedules[schedule.name] = schedule
            return task

        return register

    def run_schedules(self) -> list[int]:
        """Enqueue the due ticks of all schedules now (workers do this in their maintenance
        loop); returns the ids of the jobs this call enqueued."""
        if not self.schedules:
            return []
        if self._scheduler is None:
            self._scheduler = Scheduler(self.sessions, self.schedules)
        return self._scheduler.run_pending()

    def pause_queue(self, queue: str) -> None:
        """Stop all workers from claiming ``queue``'s jobs (see ``Admin.pause_queue``)."""
        self.admin.pause_queue(queue)

    def resume_queue(self, queue: str) -> None:
        """Let workers claim ``queue``'s jobs again."""
        self.admin.resume_queue(queue)

    def set_queue_limit(self, queue: str, limit: int | None) -> None:
        """At most ``limit`` jobs of ``queue`` RUNNING at once (see ``Admin.set_queue_limit``)."""
        self.admin.set_queue_limit(queue, limit)

    def set_queue_max_depth(
        self, queue: str, max_depth: int | None, on_full: str = "reject"
    ) -> None:
        """Bound ``queue``: an enqueue that would take it above ``max_depth`` waiting jobs
        raises ``QueueFull`` (see ``Admin.set_queue_max_depth``); ``None`` removes the bound."""
        self.admin.set_queue_max_depth(queue, max_depth, on_full=on_full)

    def set_key_limit(self, key_or_prefix: str, limit: int | None) -> None:
        """At most ``limit`` jobs RUNNING per concurrency key starting with ``key_or_prefix``
        (see ``Admin.set_key_limit``); ``None`` removes the override."""
        self.admin.set_key_limit(key_or_prefix, limit)

    def set_rate_limit(
        self,
        queue: str | None = None,
        limit: int | None = None,
        *,
        per: float | None = None,
        key: str | None = None,
    ) -> None:
        """At most ``limit`` starts of ``queue`` (or of each key starting with ``key=``) in any
        window of ``per`` seconds (see ``Admin.set_rate_limit``); ``None`` removes it."""
        self.admin.set_rate_limit(queue, limit, per=per, key=key)

    def key_overrides(self) -> list[KeyOverride]:
        """The run-time limits of concurrency keys, one per prefix (see
        ``Admin.key_overrides``); queues' limits and rates: ``admin.queue_settings()``."""
        return self.admin.key_overrides()

    def queue_controls(self) -> dict[str, dict[str, Any]]:
        """``{queue: {"paused", "concurrency_limit", "running"}}`` for queues with settings
        (bounds: ``admin.queue_settings()``)."""
        return {
            name: {
                "paused": queue.paused,
                "concurrency_limit": queue.concurrency_limit,
                "running": queue.running,
            }
            for name, queue in self.admin.queue_settings().items()
        }


def _warn_embedded(settings: Settings) -> None:
    # Silently falling back would give every production host its own private queue, gone when
    # the process that started the server exits; this line is how such a deployment notices.
    from pgqueue import embedded

    data_dir = settings.embedded_data_dir or str(embedded.default_data_dir())
    logger.warning(
        "no database configured: pgqueue uses its embedded PostgreSQL server in %s, which is "
        "for development, demos and tests only (one per host, stopped when the process that "
        "started it exits). For a real server pass a URL or Engine to PgQueue, or set "
        "PGQUEUE_DATABASE_URL.",
        data_dir,
    )
