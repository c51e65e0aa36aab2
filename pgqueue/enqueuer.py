"""How a ``PgQueue`` inserts validated ``NewJob``s and laid-out workflows, decided in one place
for the synchronous and the asyncio enqueue alike.

A single plain job goes in by the one-row insert (``data.insert_choice.one_row``): outside a
caller's transaction as one autocommit statement. Its guard writes nothing into a bounded
queue; the queue is then noted as possibly bounded and the job goes in as a plan. Everything
else is a plan of the one writer (``data.enqueue.write``), in the caller's transaction or an
own one, where ``COPY`` may carry a large plan. ``Enqueuer.insert`` and ``Enqueuer.ainsert``
run on ``uow`` and on ``aio.AsyncDatabase``, each inside an enqueue span when tracing is on.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from pgqueue import uow
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data import workflows as workflow_data
from pgqueue.data.insert_choice import BoundedQueuesSeen, one_row
from pgqueue.db import Executor, executor_for
from pgqueue.engines import Engines
from pgqueue.jobs import InsertedWorkflow, NewJob, Plan, WorkflowPlan
from pgqueue.sqlstates import is_undefined_table
from pgqueue.tracing import Tracing


class Enqueuer:
    """Runs the enqueues of one ``PgQueue`` on its ``Engines``; ``bounded_queues`` is the
    belief its plans share (``data.insert_choice.BoundedQueuesSeen``)."""

    def __init__(
        self, engines: Engines, tracing: Tracing | None, bounded_queues: BoundedQueuesSeen
    ) -> None:
        self._engines = engines
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
        if one_row(jobs, self.bounded_queues):
            job = jobs[0]
            if session is None:
                job_id = uow.run_single(
                    database, lambda ex: enqueue_data.insert_one_job(ex, job, trace_context)
                )
            else:
                ex = self._executor(session)
                job_id = enqueue_data.insert_one_job(ex, job, trace_context)
            if job_id is not None:
                return [job_id]
            self.bounded_queues.suspect([job.queue])
        if session is None:
            may_copy = database.uses_driver
            return uow.run(database, lambda ex: self._write(ex, jobs, trace_context, may_copy))
        return self._write(self._executor(session), jobs, trace_context, False)

    def _write(
        self, ex: Executor, jobs: Sequence[NewJob], trace_context: str | None, may_copy: bool
    ) -> list[int]:
        """``jobs`` as a plan of the one writer; their ids."""
        return enqueue_data.write(
            ex,
            Plan(jobs),
            trace_context=trace_context,
            may_copy=may_copy,
            bounded=self.bounded_queues,
        ).ids

    def _executor(self, session: Session) -> Executor:
        """The executor of a caller's ``session``, reading jobs (a plan's dependencies) where the
        settings of this moment put them."""
        return executor_for(session, self._engines.tables())

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
        if one_row(jobs, self.bounded_queues):
            job = jobs[0]

            def one(ex: Executor) -> int | None:
                return enqueue_data.insert_one_job(ex, job, trace_context)

            if session is None:
                job_id = await database.run_single(one)
            else:
                job_id = await session.run_sync(lambda s: one(self._executor(s)))
            if job_id is not None:
                return [job_id]
            self.bounded_queues.suspect([job.queue])
        if session is None:
            may_copy = database.may_copy
            return await database.run(lambda ex: self._write(ex, jobs, trace_context, may_copy))
        return await session.run_sync(
            lambda s: self._write(self._executor(s), jobs, trace_context, False)
        )

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
        return workflow_data.insert_workflow(
            self._executor(session), plan, trace_context=trace_context
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
                    session, lambda s: workflow_data.insert_workflow(self._executor(s), plan)
                )
            with tracing.enqueue_span(plan.jobs, workflow=True) as span:
                context = span.trace_context
                inserted = await database.in_caller_or_own_session(
                    session,
                    lambda s: workflow_data.insert_workflow(
                        self._executor(s), plan, trace_context=context
                    ),
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
