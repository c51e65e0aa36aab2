"""Atomic tasks: claimed by the claim loop, each job run in a transaction that holds its row.

The claim loop claims atomic jobs for its free slots right after its leased claim, in a
statement that commits at once and counts them against every limit like a leased claim
(``WorkerStore.claim_atomic``), and starts each on a pool thread in a slot of its own. A short
claim means nothing more is ready: the next one waits for a notification, a poll, the end of a
run (which frees a slot and the rows its transaction held), or, while queue limits or flow
controls exist, any wake-up of the claim loop (a claim skips a control row another transaction
holds for a moment, an outcome's or another worker's claim, so a short claim there does not
mean the work is gone).

Each job runs in a transaction that first locks the job's row (``data.atomic_runs.lock_claimed``)
and writes the job's outcome before it commits, so the handler's writes and the outcome commit
together or not at all. No control row (a limited queue's or a key's counters, which the claims
and outcomes of the queue keep writing) is held while the handler runs: only the outcome's own
statement takes them, just before the commit. The claim has committed, so every attempt is
counted whatever happens next: if the transaction is lost (the handler's session ended it, it
failed at commit, the connection was cut) the failed attempt is written apart like a leased
outcome; if the worker dies, its transaction ends with it and the rescue, which skips locked
rows while the handler runs, takes the job when its lease expires. A job of a task the worker
does not register is given back unrun (``worker.unregistered``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from pgqueue.data import atomic_runs as atomic_runs_data
from pgqueue.data import schema as schema_data
from pgqueue.db import executor_for
from pgqueue.errors import error_line, pgqueue_logger
from pgqueue.jobs import ClaimedJob, ClaimRequest, Outcome
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import OutcomeReport

log = pgqueue_logger("pgqueue.worker")


class AtomicStore(Protocol):
    """What atomic runs need of the database besides their own transaction (``WorkerStore``
    is one)."""

    def claim_atomic(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Up to ``request.limit`` atomic jobs, claimed in a statement that commits at once."""
        ...

    def record_outcomes(
        self, outcomes: Iterable[Outcome], *, lock_wait: float | None = None
    ) -> set[int]:
        """Write ``outcomes``; the ids whose lease was lost."""
        ...

    def end_session(self, pid: int) -> bool:
        """End server session ``pid``, rolling back its transaction."""
        ...


class Deadline:
    """An atomic attempt's timeout: ``expire`` runs once, on a timer thread, at the deadline,
    unless ``finish`` (the handler returned first, its transaction about to commit) came
    before. Exactly one of the two wins."""

    def __init__(self, seconds: float, expire: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._state = "running"
        self._expire = expire
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._state != "running":
                return
            self._state = "expired"
        self._expire()

    def finish(self) -> bool:
        """Whether the attempt is still the handler's to commit (False: its deadline passed
        and ``expire`` ran or runs)."""
        self._timer.cancel()
        with self._lock:
            if self._state == "expired":
                return False
            self._state = "finished"
            return True

    @property
    def expired(self) -> bool:
        return self._state == "expired"


class AtomicTimeout(Exception):
    """The attempt's deadline passed before its transaction could commit."""


@dataclass(frozen=True, slots=True)
class AtomicRun:
    """What an atomic attempt's transaction came to (sent back by a process-pool child):
    whether it locked the job's row, the outcome it wrote, and, when the transaction failed,
    the failed attempt to write apart and the failure in one line."""

    locked: bool
    outcome: Outcome | None = None
    lost: Outcome | None = None
    failure: str | None = None


def run_transaction(
    session: Session,
    executor: Executor,
    job: ClaimedJob,
    on_locked: Callable[[int], None],
    may_commit: Callable[[], bool],
) -> AtomicRun:
    """Run atomic ``job`` in a transaction of ``session`` that locks its row, runs the
    handler and writes its outcome, then commits if ``may_commit()`` (its deadline did not
    pass first). ``on_locked`` gets the transaction's server process id once the row is held."""
    locked = False
    outcome: Outcome | None = None
    try:
        with session.begin():
            ex = executor_for(session)
            locked = atomic_runs_data.lock_claimed(ex, job)
            if not locked:
                return AtomicRun(False)  # its lease was lost: another worker owns the job
            on_locked(schema_data.backend_pid(ex))
            outcome = executor.run_atomic(session, job, threading.Event())
            if not may_commit():
                raise AtomicTimeout(f"job {job.id}: past its timeout")
    except Exception as exc:
        lost = executor.lost_attempt(job, exc) if locked else None
        return AtomicRun(locked, None, lost, error_line(exc))
    finally:
        session.close()
    return AtomicRun(True, outcome)


class ChildRunner(Protocol):
    """Runs an atomic attempt's transaction in this pool thread's child process
    (``worker.processes.ProcessPool``)."""

    def runs_in_child(self, task_name: str) -> bool:
        """Whether attempts of ``task_name`` run in a child."""
        ...

    def ended(self, job: ClaimedJob) -> tuple[Outcome, str]:
        """The failed attempt of ``job`` whose child ended while running it, and why."""
        ...

    def run_atomic(
        self,
        job: ClaimedJob,
        on_locked: Callable[[int], None],
        may_commit: Callable[[], bool],
        on_start: Callable[[Callable[[], None]], None],
    ) -> AtomicRun | None:
        """``run_transaction`` in the child; ``on_start`` gets what stops the child; None when
        the child ended before answering."""
        ...


class AtomicClaims:
    """Claims atomic jobs for the claim loop and runs each in a slot of its own; keeps whether
    looking is worth a statement (its own lock)."""

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
        # The process pool, when the worker has one: sync handlers' transactions run there.
        self.children: ChildRunner | None = None
        self._slots = slots
        self._executor = executor
        self._store = store
        self._report = report
        self._session_factory = session_factory
        self._submit = submit  # to the pool threads
        self._wake = wake  # the claim loop
        self._worker_id = worker_id
        self._queues = queues
        self._lease_seconds = lease_seconds
        self._lock = threading.Lock()
        # The last claim came back short and nothing has happened since that could make more
        # atomic work claimable: the next claim waits for a notification, a poll, the end of a
        # run, or (while controls exist) any wake-up of the claim loop.
        self._idle = False
        self._notified = False  # a notification (not just a freed slot) woke the claim loop

    def claim(self, free: int) -> bool:
        """Claim up to ``free`` atomic jobs (by the claim loop, whose leased claim never runs
        at the same time) and start each in a slot of its own; True when the claim was full."""
        with self._lock:
            if self._idle:
                return False
        jobs, full = self._claim(free)
        with self._lock:
            self._idle = not full
        for job in jobs:
            self._slots.atomic_started()
            self._submit(functools.partial(self._run_in_slot, job))
        return full

    def notified(self) -> None:
        """New tickets were announced: the claim loop's next turn looks for atomic work."""
        with self._lock:
            self._notified = True

    def after_wait(self, woken: bool, controlled: bool) -> None:
        """The claim loop's wait ended (``woken``: by a wake-up, else at its poll time;
        ``controlled``: queue limits or flow controls exist). Under controls any wake-up may
        mean a control row came free that the last claim skipped while another transaction
        held it (an outcome's, or another worker's claim)."""
        with self._lock:
            if not woken or self._notified or controlled:
                self._idle = False
            self._notified = False

    def _claim(self, limit: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to ``limit``: the jobs this worker can run, and whether the claim got as
        many as it asked for."""
        unregistered = self._executor.unregistered
        request = ClaimRequest(
            worker_id=self._worker_id,
            limit=limit,
            queues=self._queues,
            lease_seconds=self._lease_seconds,
            task_leases={},
            excluded=unregistered.names if unregistered is not None else (),
        )
        try:
            claimed = self._store.claim_atomic(request)
        except Exception as exc:
            log.error("atomic claim failed: %s", error_line(exc))
            return [], False
        jobs = []
        for job in claimed:
            if unregistered is not None and unregistered.gives_back(job):
                self._give_back(job)
                self._report.stats.released += 1
            else:
                jobs.append(job)
        self._report.stats.claimed += len(jobs)
        self._report.metrics.claimed(len(jobs))
        return jobs, len(claimed) == limit

    def _run_in_slot(self, job: ClaimedJob) -> bool:
        """Run ``job`` in the slot taken for it, then give the slot back."""
        try:
            self._run(job)
        finally:
            self._slots.atomic_finished()
            with self._lock:
                # Its slot is free and the rows its transaction held too (a limited queue's
                # row, which a claim meanwhile skipped): look for atomic work again.
                self._idle = False
            self._wake.set()
        return False

    def _run(self, job: ClaimedJob) -> None:
        started = time.monotonic()
        task = self._executor.registry.find(job.task_name)
        timeout = None if task is None else task.timeout
        deadline: Deadline | None = None
        pid: list[int] = []  # the transaction's server process, once its row is locked
        stop_child: list[Callable[[], None]] = []

        def expire() -> None:
            for stop in stop_child:
                stop()
            self._time_out(job, timeout or 0.0, pid[0] if pid else None)

        def on_locked(backend: int) -> None:
            nonlocal deadline
            pid.append(backend)
            if timeout is not None and not stop_child:
                deadline = Deadline(max(timeout - (time.monotonic() - started), 0.0), expire)

        def may_commit() -> bool:
            return deadline is None or deadline.finish()

        self._slots.atomic_running(job.queue, +1)
        try:
            children = self.children
            if children is not None and children.runs_in_child(job.task_name):

                def on_start(stop: Callable[[], None]) -> None:
                    nonlocal deadline
                    stop_child.append(stop)
                    if timeout is not None:
                        left = max(timeout - (time.monotonic() - started), 0.0)
                        deadline = Deadline(left, expire)

                run = children.run_atomic(job, on_locked, may_commit, on_start)
                if run is None:  # the child ended first
                    if deadline is not None and not deadline.finish():
                        return  # ``expire`` stopped it, ended the transaction, wrote the failure
                    run = AtomicRun(True, None, *children.ended(job))
            else:
                run = run_transaction(
                    self._session_factory(), self._executor, job, on_locked, may_commit
                )
        finally:
            self._slots.atomic_running(job.queue, -1)
        if deadline is not None and deadline.expired:
            return  # ``expire`` ended the transaction and wrote the failed attempt
        if not run.locked:
            if run.failure is not None:
                # The handler never started: the job goes back to its queue unrun.
                log.error(
                    "job %s (%s): could not be started: %s", job.id, job.task_name, run.failure
                )
                self._give_back(job)
            return
        self._settle(job, run, time.monotonic() - started)

    def _time_out(self, job: ClaimedJob, timeout: float, pid: int | None) -> None:
        """At an atomic attempt's deadline (on the timer's thread): end its transaction on the
        server, which rolls back the handler's writes whatever the handler does next, and write
        the failed attempt, retried or failed for good like any other. The handler's thread
        runs on until it returns, holding its slot, with a session that can no longer write."""
        outcome = self._executor.timed_out(Execution(job, 0.0, timeout, 0.0))
        try:
            if pid is not None:
                self._store.end_session(pid)
            # Waits for the row lock the ended transaction held: it is gone within moments.
            lost = self._store.record_outcomes([outcome])
        except Exception as exc:
            log.error(
                "job %s (%s): past its timeout of %ss, the attempt could not be ended (%s); "
                "it is rescued when its lease expires",
                job.id,
                job.task_name,
                timeout,
                error_line(exc),
            )
            return
        if job.id not in lost:
            self._report.written(outcome, timeout, job)

    def _give_back(self, job: ClaimedJob) -> None:
        """Release a claimed job that did not run, so it is claimed again now rather than
        rescued after its lease."""
        try:
            self._store.record_outcomes([Outcome.release(job)])
        except Exception as exc:
            log.error(
                "job %s (%s): could not be released (%s); it is rescued when its lease expires",
                job.id,
                job.task_name,
                error_line(exc),
            )

    def _settle(self, job: ClaimedJob, run: AtomicRun, took: float) -> None:
        """Report the attempt, or, when its transaction failed or was ended by the handler's
        session (or its child died), write it as a failed attempt in a transaction of its own,
        like a leased outcome: its claim committed, so the job is RUNNING under its lease until
        then."""
        lost = run.lost
        if lost is None:
            if run.outcome is not None:
                self._report.written(run.outcome, took, job)
            return
        try:
            if job.id in self._store.record_outcomes([lost]):
                return  # the lease was lost: another worker owns the job
        except Exception as exc:
            log.error(
                "job %s (%s) attempt %d: its transaction was lost (%s) and the attempt could "
                "not be recorded (%s); it is rescued when its lease expires",
                job.id,
                job.task_name,
                job.attempt,
                run.failure,
                error_line(exc),
            )
            return
        self._report.written(lost, took, job)
