"""Immediate mode for tests: ``with immediate(pgq):`` runs each job enqueued inside the block in
the calling thread as soon as the transaction that enqueued it commits.

Nothing is imitated: the job is inserted by the normal enqueue, claimed by its id with the
claim statement's ``claim_listed`` form, run by the worker's own ``Executor`` and its outcome
written by ``data.outcomes.record_outcomes``, on the real tables. So a job of a rolled-back
transaction never runs (there is nothing to claim), and what a test reads afterwards is what a
worker would have left.

When a job runs:

- enqueued without ``session=`` (its own transaction): once that commits, before ``enqueue``
  returns;
- with ``session=`` a caller's ``Session`` or ``AsyncSession``: inside that session's
  ``commit()``, after the commit (SQLAlchemy's ``after_commit`` event); a rollback forgets the
  jobs;
- ``aenqueue`` and ``aenqueue_many`` alike: the jobs run in the thread of the event loop that
  awaited the commit (the loop waits for them, as a test wants);
- enqueued by a running job (``async def`` ones included): after that job, in the order they
  were enqueued;
- with ``depends_on``: after its parents, which were enqueued before it, ended (it runs if
  they succeeded, and is cancelled with them otherwise, as always);
- with ``delay``/``run_at``: at once, like the others (immediate mode does not wait).

A job that cannot be claimed when its turn comes is left for a worker: one that waits for a
parent enqueued before the block, or sits in a paused or concurrency-limited queue (or was
rolled back with a savepoint: then there is nothing to run).

A failed attempt is retried at once, without the backoff delay, until the job succeeds or fails
for good (``retries=False``: one attempt only; the job stays RETRYING for the test to look at).
A snoozed job (``raise Snooze(delay)``) is run again at once too, without its delay, as the
worker would after it: the snooze uses no attempt, and past the ``max_snoozes`` setting a snooze
counts as a failed attempt (retried, or failed for good on the last attempt), so a task that
keeps snoozing ends FAILED after ``max_snoozes`` snoozes and its attempts. With
``retries=False`` the job stays QUEUED with its ``run_at`` ``delay`` seconds ahead.
A job whose handler sleeps or waits for a signal (``ctx.sleep``, ``ctx.wait_for_signal``) is
left suspended, QUEUED as a worker leaves it: a worker resumes it at its time or signal.
Handlers' exceptions are recorded on the job, as a worker records them, not raised: assert on
``runs`` or on the job. ``async def`` handlers run to completion on an event loop thread while
the calling thread waits. Task ``timeout``s of ``async def`` handlers hold; a synchronous
handler is not interrupted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from pgqueue import uow
from pgqueue.core import PgQueue
from pgqueue.data import claim as claim_data
from pgqueue.data import outcomes as outcomes_data
from pgqueue.db import executor_for
from pgqueue.errors import ValidationError
from pgqueue.jobs import ClaimedJob, NewJob, Outcome
from pgqueue.states import JobState, OutcomeKind
from pgqueue.testing.records import JobRun
from pgqueue.worker.dispatch import AsyncLoop
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor

# A job to run: its id and whether its task is atomic (which claim form takes it).
Entry = tuple[int, bool]

# The states an attempt can leave a job in that it runs again from: retried, or snoozed.
RUN_AGAIN = frozenset({JobState.RETRYING, JobState.QUEUED})


def queue_of(queue: Any) -> PgQueue:
    """The core ``PgQueue`` of ``queue``: itself, or the current app's queue of the Flask
    extension (``pgqueue.contrib.flask.PgQueue``, inside an app context)."""
    if isinstance(queue, PgQueue):
        return queue
    core = getattr(queue, "queue", None)
    if isinstance(core, PgQueue):
        return core
    raise ValidationError(f"expected a pgqueue.PgQueue, got {type(queue).__name__}")


@contextlib.contextmanager
def immediate(queue: Any, *, retries: bool = True) -> Iterator[ImmediateMode]:
    """Run the jobs enqueued on ``queue`` inside this block as soon as their transaction
    commits, in the committing thread (see the module docstring). Yields the
    ``ImmediateMode``, whose ``runs`` lists every attempt that ran, in order."""
    mode = ImmediateMode(queue_of(queue), retries=retries)
    mode.start()
    try:
        yield mode
    finally:
        mode.stop()


class ImmediateMode:
    """The state of one ``immediate()`` block: the jobs waiting for their commit, the jobs
    waiting to run in each thread, and the attempts that ran (``runs``)."""

    def __init__(self, pgq: PgQueue, *, retries: bool = True) -> None:
        self.pgq = pgq
        self.retries = retries
        self.runs: list[JobRun] = []
        self._worker_id = f"pgqueue-immediate:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._executor = Executor(
            pgq.registry,
            pgq.settings,
            pgq.handler_session,
            self._event_loop,
            interrupts_propagate=True,
        )
        # Each running thread's event loop for ``async def`` handlers, and the queue of jobs
        # of the thread waiting on it: a job enqueued by an async handler joins that queue.
        self._loops: list[AsyncLoop] = []
        self._owners: dict[asyncio.AbstractEventLoop, collections.deque[Entry]] = {}
        overrides = pgq.registry.lease_overrides().values()
        self._lease_seconds = max([pgq.settings.lease_seconds, *overrides])
        self._lock = threading.Lock()
        # Jobs whose latest run suspended them: not run again at once (see ``_drain``).
        self._suspended: set[int] = set()
        # Jobs enqueued in a caller's session, run when that session commits.
        self._uncommitted: weakref.WeakKeyDictionary[Session, list[Entry]] = (
            weakref.WeakKeyDictionary()
        )
        self._watched: weakref.WeakSet[Session] = weakref.WeakSet()
        self._thread = threading.local()
        self._insert_jobs = pgq.enqueuer.insert
        self._ainsert_jobs = pgq.enqueuer.ainsert

    # -- the block -----------------------------------------------------------------------------

    def start(self) -> None:
        enqueuer = self.pgq.enqueuer
        if "insert" in vars(enqueuer):
            raise RuntimeError("immediate mode is already on for this queue")
        # Instance attributes shadow the methods for this queue's enqueuer only, and only
        # inside the block: enqueues elsewhere pay nothing for immediate mode existing.
        enqueuer.insert = self._inserted  # type: ignore[method-assign]
        enqueuer.ainsert = self._ainserted  # type: ignore[method-assign]

    def stop(self) -> None:
        del self.pgq.enqueuer.insert
        del self.pgq.enqueuer.ainsert
        for session in list(self._watched):
            event.remove(session, "after_commit", self._committed)
            event.remove(session, "after_soft_rollback", self._rolled_back)
        for loop in self._loops:
            loop.stop()

    # -- enqueues and commits ------------------------------------------------------------------

    def _inserted(self, session: Session | None, jobs: Sequence[NewJob]) -> list[int]:
        ids = self._insert_jobs(session, jobs)
        self._after_commit_of(session, ids, jobs)
        return ids

    async def _ainserted(self, session: AsyncSession | None, jobs: Sequence[NewJob]) -> list[int]:
        ids = await self._ainsert_jobs(session, jobs)
        # An AsyncSession commits through its synchronous Session, whose events fire then.
        self._after_commit_of(None if session is None else session.sync_session, ids, jobs)
        return ids

    def _after_commit_of(
        self, session: Session | None, ids: list[int], jobs: Sequence[NewJob]
    ) -> None:
        """Run the jobs ``ids`` now if they were inserted in their own (committed) transaction,
        else when ``session`` commits."""
        entries = [(job_id, job.atomic) for job_id, job in zip(ids, jobs, strict=True)]
        if session is None:
            self._run(entries)
            return
        with self._lock:
            if session not in self._watched:
                self._watched.add(session)
                event.listen(session, "after_commit", self._committed)
                event.listen(session, "after_soft_rollback", self._rolled_back)
            self._uncommitted.setdefault(session, []).extend(entries)

    def _committed(self, session: Session) -> None:
        if session.in_nested_transaction():
            return  # a savepoint was released: the jobs wait for the outer commit
        with self._lock:
            entries = self._uncommitted.pop(session, [])
        if entries:
            self._run(entries)

    def _rolled_back(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is not None:
            # A savepoint: its jobs are gone, the others still commit with the outer
            # transaction. Claiming by id finds nothing to run for the ones that are gone.
            return
        with self._lock:
            self._uncommitted.pop(session, None)

    # -- running -------------------------------------------------------------------------------

    def _run(self, entries: list[Entry]) -> None:
        """Queue ``entries`` in this thread and run its queue, unless this thread is already
        running it (a job enqueued by a job runs after that job)."""
        owner = self._owner_waiting()
        if owner is not None:
            owner.extend(entries)  # run by the thread waiting on this async handler, after it
            return
        local = self._local()
        local.ready.extend(entries)
        if local.running:
            return
        local.running = True
        try:
            self._drain(local.ready)
        except BaseException:
            # The error reaches the enqueue or commit that started the run; the jobs queued
            # behind it must not run later, at some unrelated enqueue of this thread.
            local.ready.clear()
            raise
        finally:
            local.running = False

    def _local(self) -> Any:
        """This thread's queue of jobs to run, whether it is running them, and its event loop."""
        local = self._thread
        if not hasattr(local, "ready"):
            local.ready = collections.deque()
            local.running = False
            local.loop = AsyncLoop()
            with self._lock:
                self._loops.append(local.loop)
        return local

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop an ``async def`` handler run by this thread runs on."""
        local = self._local()
        loop: asyncio.AbstractEventLoop = local.loop.get()
        with self._lock:
            self._owners[loop] = local.ready
        return loop

    def _owner_waiting(self) -> collections.deque[Entry] | None:
        """On the event loop of an ``async def`` handler: the queue of the thread running it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        with self._lock:
            return self._owners.get(loop)

    def _drain(self, ready: collections.deque[Entry]) -> None:
        while ready:
            entry = ready.popleft()
            run = self._attempt(entry)
            # A suspended job (``ctx.sleep``, ``ctx.wait_for_signal``) waits for its time or
            # its signal, which running it again at once would not bring: it is left queued.
            suspended = run is not None and run.job_id in self._suspended
            if run is not None and run.state in RUN_AGAIN and self.retries and not suspended:
                ready.appendleft(entry)

    def _attempt(self, entry: Entry) -> JobRun | None:
        """Claim job ``entry`` by its id and run one attempt of it; None if it was not there
        to claim."""
        job_id, atomic = entry
        if atomic:
            return self._attempt_atomic(job_id)
        claimed = uow.run(
            self.pgq.database,
            lambda db: claim_data.claim_listed(
                db, [job_id], worker_id=self._worker_id, lease_seconds=self._lease_seconds
            ),
            autocommit=True,
        )
        if not claimed:
            return None
        job = claimed[0]
        task = self.pgq.registry.find(job.task_name)
        timeout = None if task is None else task.timeout
        execution = Execution(job, self._lease_seconds, timeout, 0.0)
        try:
            outcome = self._executor.run_leased(execution)
        except BaseException:
            # Interrupted (a Ctrl-C, the test's failure or timeout): the job goes back to its
            # queue with the attempt not counted. Should that write fail too, the interrupt
            # still propagates, and the job is rescued when its lease expires.
            with contextlib.suppress(Exception):
                uow.run(
                    self.pgq.database,
                    lambda db: outcomes_data.record_outcomes(db, [Outcome.release(job)]),
                )
            raise
        lost = uow.run(self.pgq.database, lambda db: outcomes_data.record_outcomes(db, [outcome]))
        if lost:
            raise RuntimeError(f"job {job_id}'s lease was taken while it ran in immediate mode")
        return self._ran(job, outcome)

    def _attempt_atomic(self, job_id: int) -> JobRun | None:
        session = self.pgq.handler_session()
        try:
            with session.begin():
                claimed = claim_data.claim_listed(
                    executor_for(session),
                    [job_id],
                    worker_id=self._worker_id,
                    lease_seconds=self._lease_seconds,
                    atomic=True,
                )
                if not claimed:
                    return None
                outcome = self._executor.run_atomic(session, claimed[0], threading.Event())
        finally:
            session.close()
        return self._ran(claimed[0], outcome)

    def _ran(self, job: ClaimedJob, outcome: Outcome) -> JobRun:
        run = JobRun.ended(job.id, job.task_name, job.args, job.kwargs, job.attempt, outcome)
        if outcome.kind is OutcomeKind.SNOOZE:
            # The outcome statement decides whether the snooze was free (QUEUED) or, past
            # max_snoozes, a failed attempt: the job's row says which, and with what error.
            written = self.pgq.get_job(job.id)
            failed = written.state is not JobState.QUEUED
            run = replace(run, state=written.state, error=written.last_error if failed else None)
        with self._lock:
            self.runs.append(run)
            if outcome.kind is OutcomeKind.SUSPEND:
                self._suspended.add(job.id)
            else:
                self._suspended.discard(job.id)
        return run

    def states(self) -> dict[int, JobState]:
        """The state each job that ran ended its last attempt in."""
        return {run.job_id: run.state for run in self.runs}
