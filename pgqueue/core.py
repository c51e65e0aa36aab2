"""``PgQueue``: the object an application creates once; a thin facade over the parts that do
the work.

It holds the settings, the task registry and the schedules, and wires: ``engines.Engines``
(where the database is, the engines and sessions, one AsyncEngine per event loop),
``pgq.enqueuer`` (``enqueuer.Enqueuer``, to which tasks hand their jobs), ``pgq.admin``
(``admin.Admin``, the job and queue control API; the ``AdminAlias`` attributes of
``PgQueue``, ``pgq.get_job``, ``pgq.retry_job`` ..., are its methods under the same names),
``waiting.JobWaiter`` (``wait_for``) and the worker (``run_worker``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, Unpack, overload

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

from pgqueue import uow
from pgqueue.admin import Admin
from pgqueue.aio import AsyncDatabase
from pgqueue.config import Settings
from pgqueue.data import admin as admin_data
from pgqueue.data.insert_choice import COPY_THRESHOLD as COPY_THRESHOLD
from pgqueue.data.insert_choice import BoundedQueuesSeen
from pgqueue.db import Database
from pgqueue.engines import Engines
from pgqueue.enqueuer import Enqueuer
from pgqueue.errors import ValidationError
from pgqueue.models import Job
from pgqueue.scheduler import Schedule, Scheduler
from pgqueue.tasks import Task, TaskOptions, TaskRegistry, task_name_for
from pgqueue.tracing import Tracing, tracing_for
from pgqueue.waiting import JobWaiter
from pgqueue.workflows.status import WorkflowStatus

P = ParamSpec("P")
R = TypeVar("R")


class AdminAlias(Generic[P, R]):
    """A ``PgQueue`` attribute that is ``pgq.admin``'s method of the same name: read on each
    access (a wrapper set on ``pgq.admin`` is seen), with that method's signature."""

    def __init__(self, method: Callable[Concatenate[Admin, P], R]) -> None:
        self.name = method.__name__
        self.__doc__ = f"Alias of ``pgq.admin.{self.name}`` (``Admin.{self.name}``)."

    @overload
    def __get__(self, queue: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, queue: PgQueue, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, queue: PgQueue | None, owner: type[Any]) -> Self | Callable[P, R]:
        if queue is None:
            return self
        method: Callable[P, R] = getattr(queue.admin, self.name)
        return method


class PgQueue:
    """A job queue in a PostgreSQL database.

    ``database`` is a SQLAlchemy URL (``postgresql+psycopg://...``), an ``Engine``, or None for
    ``$PGQUEUE_DATABASE_URL`` and, failing that, the embedded PostgreSQL server (for development,
    demos and tests; one WARNING says so). URLs are checked here, before anything connects.

    The asyncio calls (``aenqueue``, ``aget_job`` ...) use ``async_engine`` when given, else
    one made on first use from the same URL with psycopg's asyncio driver and the settings of
    ``engine``. ``database`` may also be an ``AsyncEngine``: the asyncio calls use it, and the
    synchronous ones (and workers) engines made from its URL.

    Jobs and queues are read and controlled through ``pgq.admin`` (``pgqueue.admin.Admin``).
    These attributes are aliases of its methods of the same name (``pgq.retry_job`` is
    ``pgq.admin.retry_job``): ``get_job``, ``aget_job``, ``explain_job``, ``retry_job``,
    ``aretry_job``, ``cancel_job``, ``acancel_job``, ``signal``, ``asignal``,
    ``get_workflow``, ``cancel_workflow``, ``counts``, ``prune``, ``maintain_history``,
    ``pause_queue``, ``resume_queue``, ``set_queue_limit``, ``set_queue_max_depth``,
    ``set_key_limit``, ``set_rate_limit``, ``key_overrides``.
    """

    get_job = AdminAlias(Admin.get_job)
    aget_job = AdminAlias(Admin.aget_job)
    explain_job = AdminAlias(Admin.explain_job)
    retry_job = AdminAlias(Admin.retry_job)
    aretry_job = AdminAlias(Admin.aretry_job)
    cancel_job = AdminAlias(Admin.cancel_job)
    acancel_job = AdminAlias(Admin.acancel_job)
    signal = AdminAlias(Admin.signal)
    asignal = AdminAlias(Admin.asignal)
    get_workflow = AdminAlias(Admin.get_workflow)
    cancel_workflow = AdminAlias(Admin.cancel_workflow)
    counts = AdminAlias(Admin.counts)
    prune = AdminAlias(Admin.prune)
    maintain_history = AdminAlias(Admin.maintain_history)
    pause_queue = AdminAlias(Admin.pause_queue)
    resume_queue = AdminAlias(Admin.resume_queue)
    set_queue_limit = AdminAlias(Admin.set_queue_limit)
    set_queue_max_depth = AdminAlias(Admin.set_queue_max_depth)
    set_key_limit = AdminAlias(Admin.set_key_limit)
    set_rate_limit = AdminAlias(Admin.set_rate_limit)
    key_overrides = AdminAlias(Admin.key_overrides)

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
        # Where tasks and workflows hand their validated jobs (``Task``, ``Signature``).
        self.enqueuer = Enqueuer(self._engines, self.tracing, bounded_queues)
        # The job and queue control API: the work of every ``AdminAlias`` above.
        self.admin = Admin(
            self._engines,
            lambda: self.settings,
            bounded_queues=bounded_queues,
            schedules=lambda: self.schedules,
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

    def wait_for_workflow(
        self, workflow_id: int, *, timeout: float | None = None
    ) -> WorkflowStatus:
        """Block until workflow ``workflow_id`` ended (the last of its members ended, or it
        was cancelled and its running members stopped) and return it as ``get_workflow`` does.
        Its ``on_failure`` job may still be running. JobWaitTimeout after ``timeout`` seconds."""
        status = self.admin.get_workflow(workflow_id)
        self.wait_for(status.closing_job_id, timeout=timeout)
        return self.admin.get_workflow(workflow_id)

    async def await_workflow(
        self, workflow_id: int, *, timeout: float | None = None
    ) -> WorkflowStatus:
        """``wait_for_workflow`` in an event loop, without blocking it."""
        status = await self.admin.aget_workflow(workflow_id)
        await self.await_job(status.closing_job_id, timeout=timeout)
        return await self.admin.aget_workflow(workflow_id)

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

    # -- schedules -------------------------------------------------------------------------

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
