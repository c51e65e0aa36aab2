"""Atomic tasks: found by probes, each run inside the transaction that claimed it.

An atomic claim holds its transaction open while the handler runs, so it cannot be made by the
claim loop: the claim loop starts a probe (one at a time) on a pool thread, which claims at most
one atomic job in a handler session and runs it there (``Executor.run_atomic``). The probe tells
as soon as its claim answered whether it found a job, so the claim loop never waits for it: a
find starts the next probe at once; nothing found stops probing until a notification or a poll
(the ``after_wait`` of the claim loop). A probe holds a slot until its transaction ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from pgqueue import repository
from pgqueue.errors import pgqueue_logger
from pgqueue.worker.executor import Executor
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import OutcomeReport

log = pgqueue_logger("pgqueue.worker")


class AtomicProbes:
    """Starts atomic runners and keeps their probe state (its own lock)."""

    def __init__(
        self,
        *,
        slots: Slots,
        executor: Executor,
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
        session = self._session_factory()
        started = time.monotonic()
        try:
            with session.begin():
                jobs = repository.claim(
                    session,
                    worker_id=self._worker_id,
                    limit=1,
                    queues=self._queues,
                    lease_seconds=self._lease_seconds,
                    task_leases={},
                    atomic=True,
                )
                claimed(bool(jobs))
                if not jobs:
                    return
                self._report.stats.claimed += 1
                self._report.metrics.claimed(1)
                queue = jobs[0].queue
                self._slots.atomic_running(queue, +1)
                try:
                    outcome = self._executor.run_atomic(session, jobs[0], threading.Event())
                finally:
                    self._slots.atomic_running(queue, -1)
            self._report.written(outcome, time.monotonic() - started, jobs[0])
        except Exception:
            log.exception("atomic job transaction failed; it rolled back and its ticket is back")
        finally:
            session.close()
