"""Atomic tasks: found by probes, each run inside the transaction that claimed it.

An atomic claim holds its transaction open while the handler runs, so it cannot be made by the
claim loop: the claim loop starts a probe (one at a time) on a pool thread, which claims at most
one atomic job in a handler session and runs it there (``Executor.run_atomic``). The probe tells
as soon as its claim answered whether it found a job, so the claim loop never waits for it: a
find starts the next probe at once; nothing found stops probing until a notification or a poll
(the ``after_wait`` of the claim loop). A probe holds a slot until its transaction ends.

The handler's transaction never holds a control row: a row a limited queue's leased claims and
outcomes update all the time. So atomic jobs of controlled work (a limited or rate-limited queue,
a concurrency key) are claimed first, in a statement that commits at once and counts them like
leased ones (``WorkerStore.claim_atomic_controlled``); the transaction then locks just the job's
row and the outcome written in it frees the counters as it commits. If that transaction is lost,
the failed attempt is written like a leased outcome; if the worker dies, the job is rescued when
its lease expires, and every counter is right in the meantime (the job is RUNNING, committed).
Other atomic jobs are claimed inside the handler's transaction, which then holds their ticket
and their row only.

A transaction lost after the handler ran (it failed at commit, the handler's session ended it,
the connection or the worker died) undoes an in-transaction claim too. So before the handler
runs, the run is recorded on another connection and committed (``data.atomic_runs.record_atomic_run``), and the run's
transaction deletes that record when it commits. A record left behind is counted as a failed
attempt in a transaction of its own (``data.atomic_runs.count_lost_attempt``): by this worker at
once when it saw its transaction fail, else by the next claim of the job, which finds the
record and counts it instead of running the handler. A job whose transaction always fails runs
its handler ``max_attempts`` times and fails, with one log line per attempt, whatever happened
to the workers and connections that ran it. A committed claim records its run the same way: its
attempt is counted already (so the record is stale once the job moves on), and a record of the
very attempt it claimed means that attempt ran before, so it is counted as failed, not run again.
A job of a task the worker does not register is given back by rolling its claim back
(``worker.unregistered``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from sqlalchemy.orm import Session

from pgqueue.data import atomic_runs as atomic_runs_data
from pgqueue.data import claim as claim_data
from pgqueue.errors import AtomicRunUnfinished, error_line, pgqueue_logger
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.states import JobState
from pgqueue.worker.executor import Executor
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import OutcomeReport

log = pgqueue_logger("pgqueue.worker")


class AtomicStore(Protocol):
    """What atomic runs need of the database besides their own transaction (``WorkerStore``
    is one)."""

    @property
    def controlled(self) -> bool:
        """Whether queue limits, concurrency keys or rate limits may exist."""
        ...

    def claim_atomic_controlled(
        self,
        *,
        worker_id: str,
        queues: Sequence[str] | None,
        lease_seconds: float,
        excluded: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        """At most one atomic job of controlled work, claimed in a statement that commits."""
        ...

    def record_atomic_run(self, job: ClaimedJob, worker_id: str) -> bool:
        """Record the attempt's start, committed at once; False when a run of that attempt is
        already recorded (an earlier run's transaction was lost and must be counted first)."""
        ...

    def record_outcomes(
        self, outcomes: Iterable[Outcome], *, lock_wait: float | None = None
    ) -> set[int]:
        """Write ``outcomes``; the ids whose lease was lost."""
        ...

    def count_lost_attempt(self, job: ClaimedJob, *, delay: float, error: str) -> JobState | None:
        """Count the runs of ``job`` whose transaction was lost; the job's state after it, or
        None when nothing was lost."""
        ...


class _GivenBack(Exception):
    """The claimed job's task is not registered here: its claim is rolled back."""


class AtomicProbes:
    """Starts atomic runners and keeps their probe state (its own lock)."""

    def __init__(
        self,
        *,
        slots: Slots,
        executor: Executor,
        store: AtomicStore,
        report: OutcomeReport,
        session_factory: Callable[[], Session],
        submit: Callable[[Callable[[], bool]], None],
        wake: threading.Event,
        worker_id: str,
        queues: Sequence[str] | None,
        lease_seconds: float,
    ) -> None:
        self._slots = slots
        self._executor = executor
        self._store = store  # counts the attempts whose transaction was lost
        self._report = report
        self._session_factory = session_factory
        self._submit = submit  # to the pool threads
        self._wake = wake  # the claim loop
        self._worker_id = worker_id
        self._queues = queues
        self._lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._probing = False  # a runner has not answered yet
        self._idle = False  # the last probe found nothing: wait for a notification or a poll
        self._notified = False  # a notification (not just a freed slot) woke the claim loop

    def maybe_probe(self) -> None:
        """Start one atomic runner unless one is claiming or the last found nothing."""
        with self._lock:
            if self._probing or self._idle:
                return
            self._probing = True
            self._slots.atomic_started()
        self._submit(self._runner)

    def notified(self) -> None:
        """New tickets were announced: the next wake-up of the claim loop probes again."""
        with self._lock:
            self._notified = True

    def after_wait(self, woken: bool) -> None:
        """The claim loop's wait ended (``woken``: by a wake-up, else at its poll time)."""
        with self._lock:
            if not woken or self._notified:
                self._idle = False  # poll time or new tickets: look for atomic work
            self._notified = False

    def _runner(self) -> bool:
        reported = False

        def claimed(found: bool) -> None:
            nonlocal reported
            reported = True
            with self._lock:
                self._probing = False
                self._idle = not found
            self._wake.set()  # found: probe for the next one; not found: nothing to do

        try:
            self._execute(claimed)
        finally:
            self._slots.atomic_finished()
            if not reported:
                with self._lock:
                    self._probing = False
                    self._idle = True  # it failed before claiming: wait for a poll
            self._wake.set()
        return False

    def _execute(self, claimed: Callable[[bool], None]) -> None:
        started = time.monotonic()
        job: ClaimedJob | None = None
        outcome: Outcome | None = None
        failure: Exception | None = None
        unregistered = self._executor.unregistered
        excluded = unregistered.names if unregistered is not None else ()
        committed: list[ClaimedJob] = []
        if self._store.controlled:
            try:
                committed = self._store.claim_atomic_controlled(
                    worker_id=self._worker_id,
                    queues=self._queues,
                    lease_seconds=self._lease_seconds,
                    excluded=excluded,
                )
            except Exception as exc:
                log.error("atomic claim failed: %s", error_line(exc))
        session = self._session_factory()
        try:
            with session.begin():
                if committed:
                    jobs = committed if atomic_runs_data.lock_claimed(session, committed[0]) else []
                else:
                    jobs = claim_data.claim(
                        session,
                        worker_id=self._worker_id,
                        limit=1,
                        queues=self._queues,
                        lease_seconds=self._lease_seconds,
                        task_leases={},
                        atomic=True,
                        excluded=excluded,
                    )
                claimed(bool(jobs))
                if not jobs:
                    return
                if unregistered is not None and unregistered.gives_back(jobs[0]):
                    raise _GivenBack
                job = jobs[0]
                self._report.stats.claimed += 1
                self._report.metrics.claimed(1)
                if not self._store.record_atomic_run(job, self._worker_id):
                    raise AtomicRunUnfinished(
                        f"job {job.id} attempt {job.attempt} already ran in a transaction that "
                        "never committed"
                    )
                self._slots.atomic_running(job.queue, +1)
                try:
                    outcome = self._executor.run_atomic(session, job, threading.Event())
                finally:
                    self._slots.atomic_running(job.queue, -1)
                atomic_runs_data.clear_atomic_runs(session, job.id)
        except _GivenBack:
            # The rollback put an in-transaction claim's ticket back as it was, attempt count
            # included; a committed claim is released like a leased job.
            if committed:
                self._give_back(committed[0])
            self._report.stats.released += 1
            return
        except Exception as exc:
            failure = exc
        finally:
            session.close()
        if job is None:
            if failure is not None:
                log.error("atomic claim failed: %s", error_line(failure))
                if committed:
                    self._give_back(committed[0])
            return
        self._settle(job, outcome, failure, time.monotonic() - started, bool(committed))

    def _give_back(self, job: ClaimedJob) -> None:
        """Release a job whose committed claim no transaction could take up (its row could not
        be locked), so it is claimed again now rather than rescued after its lease."""
        try:
            self._store.record_outcomes([Outcome.release(job)])
        except Exception as exc:
            log.error(
                "job %s (%s): could not be released (%s); it is rescued when its lease expires",
                job.id,
                job.task_name,
                error_line(exc),
            )

    def _settle(
        self,
        job: ClaimedJob,
        outcome: Outcome | None,
        failure: Exception | None,
        took: float,
        committed: bool,
    ) -> None:
        """Report the attempt, or, when its transaction failed or was ended by the handler's
        session, count it as a failed attempt in a transaction of its own: the claim was undone
        with it, and the job would otherwise be claimed again at once with no attempt counted,
        its handler's side effects repeated without end."""
        if failure is None:
            if outcome is not None:
                self._report.written(outcome, took, job)
            return
        lost = self._executor.lost_attempt(job, failure)
        if committed:
            # Its claim committed on its own: the job is RUNNING under its lease, the attempt
            # counted; its failed attempt is written like a leased job's outcome.
            try:
                if job.id in self._store.record_outcomes([lost]):
                    return  # the lease was lost: another worker owns the job
            except Exception as exc:
                log.error(
                    "job %s (%s) attempt %d: its transaction was lost (%s) and the attempt "
                    "could not be recorded (%s); it is rescued when its lease expires",
                    job.id,
                    job.task_name,
                    job.attempt,
                    error_line(failure),
                    error_line(exc),
                )
                return
            self._report.written(lost, took, job)
            return
        try:
            state = self._store.count_lost_attempt(job, delay=lost.delay, error=lost.error)
        except Exception as exc:
            log.error(
                "job %s (%s) attempt %d: its transaction was lost (%s) and the attempt could not "
                "be counted (%s)",
                job.id,
                job.task_name,
                job.attempt,
                error_line(failure),
                error_line(exc),
            )
            return
        if state is None:
            # Nothing of this attempt was lost (the claim had committed after all, or the
            # handler never started), or a claim of the job under way elsewhere counts it.
            log.error(
                "job %s (%s) attempt %d: its transaction ended with an error (%s); nothing was "
                "counted here",
                job.id,
                job.task_name,
                job.attempt,
                error_line(failure),
            )
            return
        self._report.written(lost, took, job)
