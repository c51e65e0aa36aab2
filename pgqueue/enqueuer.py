"""How a ``PgQueue`` inserts a batch of validated ``NewJob``s, decided in one place for the
synchronous and the asyncio enqueue alike.

``plan_insert`` decides (``data.insert_choice.insert_path``): outside a caller's transaction a
single plain job, or a large uniform batch where ``COPY`` may carry it, is first tried with a
plain insert in a unit of work of pgqueue's own. That insert's guard writes nothing when a
queue of the jobs has a bound; the plan then marks those queues as possibly bounded and the
jobs go to the checked insert (the queues' locks, then count and insert, or ``QueueFull``), in
the caller's transaction or an own one. Every other enqueue goes to the checked insert at
once. ``Enqueuer.insert`` and ``Enqueuer.ainsert`` run the plan, the one with ``uow``, the
other with ``aio.AsyncDatabase``, each inside an enqueue span when tracing is on. A workflow
(``insert_workflow``) is inserted whole in the caller's transaction or an own one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue import uow
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import workflows as workflow_data
from pgqueue.data.history import JobTables
from pgqueue.data.insert_choice import BoundedQueuesSeen, InsertPath, insert_path
from pgqueue.db import Executor
from pgqueue.engines import Engines
from pgqueue.jobs import InsertedWorkflow, NewJob, WorkflowPlan
from pgqueue.sqlstates import is_undefined_table
from pgqueue.tracing import Tracing


@dataclass(frozen=True, slots=True)
class InsertPlan:
    """How one enqueue inserts ``jobs``: ``first_try`` (when ``tries_plain``) in a unit of
    work of pgqueue's own, in autocommit mode when ``autocommit``; and, unless that inserted
    them, ``checked_insert`` in the caller's transaction or an own one."""

    jobs: Sequence[NewJob]
    trace_context: str | None
    path: InsertPath
    bounded: BoundedQueuesSeen
    tables: Callable[[], JobTables]

    @property
    def tries_plain(self) -> bool:
        return self.path != "batch"

    @property
    def autocommit(self) -> bool:
        """A single job's insert is one statement: no transaction round trips around it."""
        return self.path == "one"

    def first_try(self, db: Executor) -> list[int] | None:
        """The plain insert: the ids, or None when a bound stopped it (nothing written)."""
        if self.path == "one":
            job_id = enqueue_data.insert_one_job(db, self.jobs[0], self.trace_context)
            return None if job_id is None else [job_id]
        if self.trace_context is None:
            # The untraced call keeps the two-argument form that wrappers of ``copy_jobs``
            # (tests' spies among them) have always been given.
            return enqueue_data.copy_jobs(db, self.jobs)
        return enqueue_data.copy_jobs(db, self.jobs, self.trace_context)

    def stopped_by_bound(self) -> None:
        """The plain insert wrote nothing: the jobs' queues are noted as possibly bounded, so
        the next enqueues into them go to the checked insert at once."""
        self.bounded.suspect({job.queue for job in self.jobs})

    def checked_insert(self, session: Session) -> list[int]:
        """The insert that takes the bounded queues' locks and raises ``QueueFull``."""
        return enqueue_data.insert_jobs(
            session, self.jobs, self.trace_context, self.bounded, self.tables()
        )


def plan_insert(
    in_callers_transaction: bool,
    jobs: Sequence[NewJob],
    may_copy: Callable[[], bool],
    bounded: BoundedQueuesSeen,
    trace_context: str | None,
    tables: Callable[[], JobTables],
) -> InsertPlan:
    """The plan of one enqueue (see the module)."""
    path = insert_path(in_callers_transaction, jobs, may_copy, bounded)
    return InsertPlan(jobs, trace_context, path, bounded, tables)


class Enqueuer:
    """Runs the enqueues of one ``PgQueue`` on its ``Engines``; ``bounded_queues`` is the
    belief its plans share (``data.insert_choice.BoundedQueuesSeen``); ``tables`` says, at each
    enqueue, where its jobs' dependencies may be (``data.history.JobTables``)."""

    def __init__(
        self,
        engines: Engines,
        tracing: Tracing | None,
        bounded_queues: BoundedQueuesSeen,
        tables: Callable[[], JobTables],
    ) -> None:
        self._engines = engines
        self._tables = tables
        # None when tracing is off: each enqueue then tests this once and nothing more.
        self._tracing = tracing
        self.bounded_queues = bounded_queues

    def insert(self, session: Session | None, jobs: Sequence[NewJob]) -> list[int]:
        """Insert ``jobs`` in ``session``'s transaction, or in an own one; their ids."""
        tracing = self._tracing
        try:
            if tracing is not None and jobs:
                return tracing.enqueue(jobs, lambda context: self._insert(session, jobs, context))
            return self._insert(session, jobs, None)
        except DBAPIError as exc:
            _note_if_unmigrated(exc)
            raise

    def _insert(
        self, session: Session | None, jobs: Sequence[NewJob], trace_context: str | None
    ) -> list[int]:
        database = self._engines.database
        plan = plan_insert(
            session is not None,
            jobs,
            lambda: database.uses_driver,
            self.bounded_queues,
            trace_context,
            self._tables,
        )
        if plan.tries_plain:
            if plan.autocommit:
                ids = uow.run_single(database, plan.first_try)
            else:
                ids = uow.run(database, plan.first_try)
            if ids is not None:
                return ids
            plan.stopped_by_bound()
        return uow.in_caller_or_own_transaction(
            session, self._engines.sessions, plan.checked_insert
        )

    async def ainsert(self, session: AsyncSession | None, jobs: Sequence[NewJob]) -> list[int]:
        """``insert`` for asyncio: in ``session``'s transaction (an ``AsyncSession``), or in an
        own one on the running loop's AsyncEngine; the same statements, each wait awaited."""
        tracing = self._tracing
        try:
            if tracing is not None and jobs:
                with tracing.enqueue_span(jobs) as span:
                    return span.inserted(await self._ainsert(session, jobs, span.trace_context))
            return await self._ainsert(session, jobs, None)
        except DBAPIError as exc:
            _note_if_unmigrated(exc)
            raise

    async def _ainsert(
        self, session: AsyncSession | None, jobs: Sequence[NewJob], trace_context: str | None
    ) -> list[int]:
        database = await self._engines.running_async_database()
        plan = plan_insert(
            session is not None,
            jobs,
            lambda: database.may_copy,
            self.bounded_queues,
            trace_context,
            self._tables,
        )
        if plan.tries_plain:
            if plan.autocommit:
                ids = await database.run_single(plan.first_try)
            else:
                ids = await database.run(plan.first_try)
            if ids is not None:
                return ids
            plan.stopped_by_bound()
        return await database.in_caller_or_own_session(session, plan.checked_insert)

    def insert_workflow(self, session: Session | None, plan: WorkflowPlan) -> InsertedWorkflow:
        """Insert a laid-out workflow in ``session``'s transaction, or in an own one (where a
        large one may go by ``COPY``, as ``enqueue_many``'s batches do); in one PRODUCER span
        when tracing is on."""
        tracing = self._tracing
        try:
            if tracing is None:
                return self._insert_workflow(session, plan, None)
            with tracing.enqueue_span(plan.jobs, workflow=True) as span:
                inserted = self._insert_workflow(session, plan, span.trace_context)
                span.workflow_inserted(inserted.id)
                return inserted
        except DBAPIError as exc:
            _note_if_unmigrated(exc)
            raise

    def _insert_workflow(
        self, session: Session | None, plan: WorkflowPlan, trace_context: str | None
    ) -> InsertedWorkflow:
        if session is None:
            database = self._engines.database
            may_copy = database.uses_driver
            return uow.run(
                database,
                lambda ex: workflow_data.insert_workflow(
                    ex, plan, may_copy=may_copy, trace_context=trace_context
                ),
            )
        return uow.in_caller_or_own_transaction(
            session,
            self._engines.sessions,
            lambda s: workflow_data.insert_workflow(s, plan, trace_context=trace_context),
        )

    async def ainsert_workflow(
        self, session: AsyncSession | None, plan: WorkflowPlan
    ) -> InsertedWorkflow:
        """``insert_workflow`` for asyncio: in ``session``'s transaction or an own one."""
        database = await self._engines.running_async_database()
        tracing = self._tracing
        try:
            if tracing is None:
                return await database.in_caller_or_own_session(
                    session, lambda s: workflow_data.insert_workflow(s, plan)
                )
            with tracing.enqueue_span(plan.jobs, workflow=True) as span:
                context = span.trace_context
                inserted = await database.in_caller_or_own_session(
                    session,
                    lambda s: workflow_data.insert_workflow(s, plan, trace_context=context),
                )
                span.workflow_inserted(inserted.id)
                return inserted
        except DBAPIError as exc:
            _note_if_unmigrated(exc)
            raise


def _note_if_unmigrated(exc: DBAPIError) -> None:
    """An enqueue on a database whose pgqueue tables were never made fails as any statement
    does (an SQLAlchemy error, for the caller's transaction handling), with one more line at
    the end of its traceback saying what to do: the server's "relation does not exist" alone
    does not."""
    if is_undefined_table(exc) and "pgqueue_" in str(exc.orig):
        exc.add_note(
            "pgqueue's tables are missing from this database: migrate it first "
            "(`pgqueue migrate`, `flask pgqueue migrate` or `pgq.migrate()`)"
        )
