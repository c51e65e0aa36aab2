"""``PgQueue``: the object an application creates once; a thin facade over the parts that do
the work.

It holds the settings, the task registry and the schedules, and wires: ``engines.Engines``
(where the database is, the engines and sessions, one AsyncEngine per event loop),
``enqueuer.Enqueuer`` (how ``task.enqueue`` and ``aenqueue`` insert their jobs), ``pgq.admin``
(``admin.Admin``, the job and queue control API; the job-control methods here, ``get_job``,
``retry_job``, ``cancel_job`` ..., are shortcuts to it), ``waiting.JobWaiter`` (``wait_for``)
and the worker (``run_worker``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session, sessionmaker

from pgqueue import uow
from pgqueue.admin import Admin, KeyOverride, check_job_id
from pgqueue.admin_values import queue_controls_of
from pgqueue.aio import AsyncDatabase, check_async_session
from pgqueue.config import Settings
from pgqueue.data import admin as admin_data
from pgqueue.data import history as history_data
from pgqueue.data import maintenance as maintenance_data
from pgqueue.data import signals as signals_data
from pgqueue.data.insert_choice import COPY_THRESHOLD as COPY_THRESHOLD
from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.db import ConnectionExecutor, Database, executor_for
from pgqueue.engines import Engines
from pgqueue.enqueuer import Enqueuer
from pgqueue.errors import ValidationError
from pgqueue.explain import JobExplanation
from pgqueue.jobs import InsertedWorkflow, NewJob, WorkflowPlan
from pgqueue.models import Job
from pgqueue.scheduler import Schedule, Scheduler
from pgqueue.states import JobState
from pgqueue.suspension import checked_signal
from pgqueue.tasks import Task, TaskOptions, TaskRegistry, task_name_for
from pgqueue.tracing import Tracing, tracing_for
from pgqueue.waiting import JobWaiter
from pgqueue.workflows.status import WorkflowStatus

P = ParamSpec("P")
R = TypeVar("R")


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
        self._engines = Engines(
            database,
            lambda: self.settings,
            session_factory=session_factory,
            async_engine=async_engine,
        )
        # The queues this object's enqueues believe bounded (``insert_choice``): a shortcut to
        # their checked insert, corrected by the database on every enqueue into them, and told
        # of the bounds ``admin`` sets.
        bounded_queues = BoundedQueuesSeen()
        self._enqueuer = Enqueuer(
            self._engines,
            self.tracing,
            bounded_queues,
            lambda: history_data.JobTables.of(self.settings),
        )
        self.admin = Admin(
            lambda: self.sessions,
            stale_seconds=lambda: self.settings.worker_stale_seconds,
            partitioned_history=lambda: self.settings.partitioned_history,
            bounded_queues=bounded_queues,
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

    # -- engines (``engines.Engines``) -------------------------------------------------------

    @property
    def url(self) -> URL:
        """The database URL (starts the embedded server if that is the database)."""
        return self._engines.url

    @property
    def engine(self) -> Engine:
        """Engine for pgqueue's own short transactions (statement timeout applied, no JIT)."""
        return self._engines.engine

    @property
    def handler_engine(self) -> Engine:
        """Engine for handlers' sessions: no pgqueue statement timeout on the app's queries."""
        return self._engines.handler_engine

    @property
    def can_listen(self) -> bool:
        """Whether workers can LISTEN: not through a transaction pooler (a notification goes to
        the server session that listened, which such a pooler hands to other clients), unless
        ``listen_database_url`` names a way around it."""
        return self._engines.can_listen

    def listen_connection(self) -> contextlib.AbstractContextManager[Any]:
        """A new autocommit psycopg connection for LISTEN, made like every connection of
        ``engine`` (URL, ``connect_args``, ``creator`` and ``do_connect`` hooks, TLS), or to
        ``listen_database_url``; closed on exit, never returned to a pool."""
        return self._engines.listen_connection()

    @property
    def sessions(self) -> sessionmaker[Session]:
        return self._engines.sessions

    def handler_session(self) -> Session:
        """A new session for a handler (the host's factory when one was given)."""
        return self._engines.handler_session()

    @property
    def database(self) -> Database:
        """pgqueue's access to ``engine`` for its own units of work (``db.Database``)."""
        return self._engines.database

    def dispose(self) -> None:
        """Close pooled connections and the wait listener (both are recreated on next use)."""
        self._job_waiter.close()
        self._engines.dispose()

    # -- schema ------------------------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Upgrade pgqueue's own tables (its Alembic lineage) to ``revision``, building
        indexes online (``pgqueue.migrations``, ``own_transaction``)."""
        from pgqueue import migrations

        # The handlers' engine: no statement_timeout of pgqueue's on the online builds, which
        # run outside any transaction (see the CLI's migrate).
        with self.handler_engine.connect() as connection:
            migrations.upgrade(
                connection,
                revision,
                lock_timeout=self.settings.migration_lock_timeout,
                own_transaction=True,
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

    def insert_jobs(self, session: Session | None, jobs: Sequence[NewJob]) -> list[int]:
        """Insert validated jobs in ``session``'s transaction, or in an own one (in an enqueue
        span that they carry the context of, when tracing is on)."""
        return self._enqueuer.insert(session, jobs)

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

    def signal(
        self, job_id: int, name: str, payload: Any = None, *, session: Session | None = None
    ) -> bool:
        """Send signal ``name`` with ``payload`` (JSON; None by default) to job ``job_id``: it
        is stored durably, and the job, if suspended in ``ctx.wait_for_signal(name)``, is woken
        (an idle worker picks it up at once). A signal sent before the job reaches that wait is
        kept, and the wait returns it at once.

        In ``session``'s transaction when given (a rollback sends nothing), else in one of its
        own. Returns True when stored, False when a signal of that name was stored for the
        job already: the first one is kept and the later one ignored. Raises JobNotFound when
        there is no such job, InvalidStateTransition when it has finished, and
        ValidationError (a ``ValueError``) for a bad job id or name or a payload that is not
        JSON or is larger than the ``max_payload_bytes`` setting, before anything is written.
        The job's row stays locked until the transaction ends, as for ``cancel_job``.
        """
        job_id, name, encoded = checked_signal(job_id, name, payload, self.settings)
        tables = history_data.JobTables.of(self.settings)
        return uow.in_caller_or_own_transaction(
            session,
            self.sessions,
            lambda s: signals_data.signal_job(executor_for(s), job_id, name, encoded, tables),
        )

    async def asignal(
        self, job_id: int, name: str, payload: Any = None, *, session: AsyncSession | None = None
    ) -> bool:
        """``signal`` for asyncio (in ``session``'s transaction when given)."""
        job_id, name, encoded = checked_signal(job_id, name, payload, self.settings)
        session = check_async_session(session)
        database = await self._engines.running_async_database()
        tables = history_data.JobTables.of(self.settings)
        return await database.in_caller_or_own_session(
            session,
            lambda s: signals_data.signal_job(executor_for(s), job_id, name, encoded, tables),
        )

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

    # -- workflows (``pgqueue.workflows``) ----------------------------------------------------

    def insert_workflow(self, session: Session | None, plan: WorkflowPlan) -> InsertedWorkflow:
        """Insert a laid-out workflow (``Enqueuer.insert_workflow``)."""
        return self._enqueuer.insert_workflow(session, plan)

    async def ainsert_workflow(
        self, session: AsyncSession | None, plan: WorkflowPlan
    ) -> InsertedWorkflow:
        """``insert_workflow`` for asyncio."""
        return await self._enqueuer.ainsert_workflow(session, plan)

    def get_workflow(self, workflow_id: int) -> WorkflowStatus:
        """Workflow ``workflow_id``: its state, member jobs and result. Raises
        WorkflowNotFound."""
        return self.admin.get_workflow(workflow_id)

    def wait_for_workflow(
        self, workflow_id: int, *, timeout: float | None = None
    ) -> WorkflowStatus:
        """Block until workflow ``workflow_id`` ended (the last of its members ended, or it
        was cancelled and its running members stopped) and return it as ``get_workflow`` does.
        Its ``on_failure`` job may still be running. JobWaitTimeout after ``timeout`` seconds."""
        status = self.get_workflow(workflow_id)
        self.wait_for(status.closing_job_id, timeout=timeout)
        return self.get_workflow(workflow_id)

    async def await_workflow(
        self, workflow_id: int, *, timeout: float | None = None
    ) -> WorkflowStatus:
        """``wait_for_workflow`` in an event loop, without blocking it."""
        database = await self._engines.running_async_database()
        status = await database.read(lambda s: self.admin.workflow_in(s, workflow_id))
        await self.await_job(status.closing_job_id, timeout=timeout)
        return await database.read(lambda s: self.admin.workflow_in(s, workflow_id))

    def cancel_workflow(self, workflow_id: int, *, session: Session | None = None) -> bool:
        """Cancel workflow ``workflow_id``: its jobs that have not started are cancelled (its
        ``on_failure`` job too), its running ones are asked to stop (``ctx.cancel_requested``).
        False when it had already ended. Raises WorkflowNotFound."""
        return self.admin.cancel_workflow(workflow_id, session=session)

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
                    executor_for(s),
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
    ) -> history_data.HistoryMaintenance:
        """Keep the partitioned history's partitions (``history="partitioned"``): create the
        partitions of today and the next ``days_ahead`` days, drop the days older than
        ``retention_days`` (default ``Settings.history_retention_days``), and move the rows
        the DEFAULT partition caught into their day's partition. DDL: run it as the owner of
        pgqueue's tables (daily, e.g. from cron); raises ``NotSchemaOwner`` otherwise."""
        retention = (
            self.settings.history_retention_days if retention_days is None else retention_days
        )
        with self.engine.begin() as connection:
            return history_data.maintain(
                ConnectionExecutor(connection), days_ahead=days_ahead, retention_days=retention
            )

    # -- workers -----------------------------------------------------------------------------

    def run_worker(
        self,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        drain: bool = False,
        **options: Any,
    ) -> Any:
        """Run a worker in this thread until stopped (or, with ``drain``, until idle).

        Returns the worker's stats. ``concurrency`` and the other options: see
        ``pgqueue.worker.Worker`` (None: the setting).
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
        return self._engines.async_database

    async def adispose(self) -> None:
        """Close the pooled connections of the AsyncEngine pgqueue made for the running loop
        (made again on next use), then those of the synchronous engines (``dispose``). Await
        it before the event loop closes."""
        await self._engines.adispose()
        self.dispose()

    async def ainsert_jobs(self, session: AsyncSession | None, jobs: Sequence[NewJob]) -> list[int]:
        """``insert_jobs`` for asyncio: in ``session``'s transaction (an ``AsyncSession``), or
        in an own one on ``async_engine``; the same statements, each wait awaited."""
        return await self._enqueuer.ainsert(session, jobs)

    async def aget_job(self, job_id: int) -> Job:
        """``get_job`` for asyncio. Raises JobNotFound."""
        job_id = check_job_id(job_id)
        database = await self._engines.running_async_database()
        tables = history_data.JobTables.of(self.settings)
        return await database.read(lambda s: admin_data.job_snapshot(s, job_id, tables))

    async def aretry_job(self, job_id: int, *, session: AsyncSession | None = None) -> None:
        """``retry_job`` for asyncio (in ``session``'s transaction when given)."""
        job_id = check_job_id(job_id)
        session = check_async_session(session)
        database = await self._engines.running_async_database()
        await database.in_caller_or_own_session(
            session, lambda s: self.admin.retry_job(job_id, session=s)
        )

    async def acancel_job(self, job_id: int, *, session: AsyncSession | None = None) -> JobState:
        """``cancel_job`` for asyncio (in ``session``'s transaction when given)."""
        job_id = check_job_id(job_id)
        session = check_async_session(session)
        database = await self._engines.running_async_database()
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
        return queue_controls_of(self.admin.queue_settings())
