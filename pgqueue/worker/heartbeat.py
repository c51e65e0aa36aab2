"""The heartbeat: extends the leases of held attempts, and enforces timeouts and cancels.

At each attempt's deadline (its start plus its task's timeout), on a thread of its own
(``run_deadlines``: a beat retrying its statement through a database outage delays no
timeout), it gives up the attempts past their timeout: their outcome is a failed attempt (retried or failed for good, as
``backoff.after_failure`` decides). An async handler's future is cancelled and its outcome
written at once. A sync handler cannot be stopped: its ``ctx.cancel_requested`` turns true, its
slot goes to a replacement thread within the bound ``Slots`` keeps, and its outcome waits for
the thread to return (or the worker to exit), the job held and leased by this worker meanwhile:
its retry never runs beside it, and its key and queue limits count it.

Every ``interval`` it

- extends the leases of held attempts in one statement, which also answers which of them have a
  cancel request (the handler's ``JobContext`` sees it; an async handler is cancelled) and
  which leases are gone (rescued after this process was frozen or cut off: the handler runs on,
  but its outcome will be dropped; reported once);
- writes the progress handlers reported since the last heartbeat (``JobContext.progress``
  keeps only the latest value in memory), in that same statement: at most one write of a job's
  progress per heartbeat, however often its handler reports;
- refreshes the worker's registry row: in that same statement, or on its own when no lease
  needs extending.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from pgqueue.errors import pgqueue_logger
from pgqueue.jobs import Lease, Outcome, Progress, WorkerEntry
from pgqueue.sqlstates import is_connection_error
from pgqueue.worker.execution import Execution
from pgqueue.worker.registry import WorkerRegistry
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import WorkerStats

log = pgqueue_logger("pgqueue.worker")


class HeartbeatStore(Protocol):
    """What the heartbeat needs of the database (``WorkerStore`` is one)."""

    def heartbeat(
        self, leases: Sequence[Lease], worker: WorkerEntry | None, progress: Mapping[int, Progress]
    ) -> dict[int, bool]:
        """Extend ``leases`` (job id, token, seconds), refresh ``worker``'s registry row and
        write ``progress``; ``{job id: cancel requested}`` of the leases still held."""
        ...


class Heartbeat:
    """The heartbeat thread's loop (until ``halt`` is set)."""

    def __init__(
        self,
        *,
        store: HeartbeatStore,
        slots: Slots,
        stats: WorkerStats,
        interval: float,
        halt: threading.Event,
        timed_out: Callable[[Execution], Outcome],
        put_outcome: Callable[[tuple[Execution, Outcome]], None],
        start_replacement: Callable[[], None],
        wake: threading.Event,
        registry: WorkerRegistry | None = None,
    ) -> None:
        self.interval = interval if registry is None else min(interval, registry.refresh_interval)
        self._registry = registry
        self._store = store
        self._slots = slots
        self._stats = stats
        self._halt = halt
        self._timed_out = timed_out  # the outcome of an attempt past its timeout
        self._put_outcome = put_outcome
        self._start_replacement = start_replacement  # a pool thread for a replaced slot
        self._wake = wake  # the claim loop: a replaced slot is free
        self._woken = threading.Event()
        self._deadline_woken = threading.Event()
        self._beat_asked = False  # ``nudge``: beat at this wake-up, not at the next interval
        # The monotonic time the deadlines thread sleeps until: a new deadline before it wakes it.
        self._sleeps_until = 0.0

    def run(self) -> None:
        """The heartbeat thread's loop: a beat every ``interval``, or when nudged."""
        woken = self._woken
        next_beat = time.monotonic() + self.interval
        while not self._halt.is_set():
            woken.wait(max(next_beat - time.monotonic(), 0.0))
            woken.clear()
            if self._halt.is_set():
                return
            if self._beat_asked or time.monotonic() >= next_beat:
                self._beat_asked = False
                self._extend_leases()
                next_beat = time.monotonic() + self.interval

    def run_deadlines(self) -> None:
        """The deadlines thread's loop: gives up each attempt at its deadline. A thread of its
        own, so that a beat retrying its statement through a database outage delays no
        timeout."""
        woken = self._deadline_woken
        while not self._halt.is_set():
            # Any deadline set while the sleep is being computed wakes it at once.
            self._sleeps_until = math.inf
            until = self._slots.next_deadline()
            self._sleeps_until = math.inf if until is None else until
            woken.wait(None if until is None else max(until - time.monotonic(), 0.0))
            woken.clear()
            if self._halt.is_set():
                return
            self._check_timeouts()

    def nudge(self) -> None:
        """Beat now rather than at the next interval (the worker's health changed, or it
        stops: set ``halt`` first, which this also makes the deadlines thread see)."""
        self._beat_asked = True
        self._woken.set()
        if self._halt.is_set():
            self._deadline_woken.set()

    def deadline_at(self, deadline: float) -> None:
        """An attempt started whose timeout passes at monotonic time ``deadline``: wake the
        deadlines thread if it sleeps past that (most starts cost only this comparison)."""
        if deadline < self._sleeps_until:
            self._deadline_woken.set()

    def _check_timeouts(self) -> None:
        overdue, hung = self._slots.take_overdue(time.monotonic(), self._timed_out)
        if any(execution.replaced for execution, _ in overdue):
            self._wake.set()
        for execution, outcome in overdue:
            if execution.replaced:
                self._start_replacement()
            elif execution.async_future is None and execution.stop_process is None:
                log.error(
                    "job %s (%s) runs on past its timeout of %ss and keeps its slot until it "
                    "returns: %d threads already run handlers past their timeout",
                    execution.job.id,
                    execution.job.task_name,
                    execution.timeout,
                    hung,
                )
            if outcome is None and execution.stop_process is not None:
                execution.stop_process()
            elif outcome is None:
                # The handler may watch ``ctx.cancel_requested`` and stop early.
                execution.cancel_event().set()
            else:
                assert execution.async_future is not None
                execution.async_future.cancel()
                self._put_outcome((execution, outcome))

    def _extend_leases(self) -> None:
        leases = self._slots.leases()
        try:
            self._extend(leases)
        finally:
            self._slots.beat_done()

    def _extend(self, leases: Sequence[Lease]) -> None:
        # Attempts whose outcome waits for its write are extended too: their lease must not run
        # out in the meantime.
        registry = self._registry
        if not leases:
            if registry is not None:
                try:
                    registry.refresh()
                except Exception as exc:
                    # As for the heartbeat below: a lost connection is retried by the store
                    # until the worker stops, and the shutdown reports what it could not write.
                    if not (self._halt.is_set() or is_connection_error(exc)):
                        log.exception("worker registry refresh failed")
            return
        # Looked up before the statement: the attempts it covers, whatever the completer and
        # the claimer do to the running set meanwhile (an attempt written meanwhile is marked
        # ``writing``, and is left alone below as before).
        executions = self._slots.lookup(job_id for job_id, _, _ in leases)
        progress: dict[int, Progress] = {}
        for job_id, execution in executions.items():
            if execution is not None and execution.progress is not None:
                reported = execution.unwritten_progress()
                if reported is not None:
                    progress[job_id] = reported
        try:
            held = self._store.heartbeat(
                leases, None if registry is None else registry.entry, progress
            )
        except Exception as exc:
            # The store retries a lost connection until the worker stops: then the shutdown
            # reports the jobs whose outcome it could not write.
            if not is_connection_error(exc):
                log.exception("heartbeat failed")
            return
        for job_id, reported in progress.items():
            execution = executions[job_id]
            if execution is not None and job_id in held:  # written under this attempt's lease
                execution.progress_written = reported
        for job_id, execution in executions.items():
            if execution is None or execution.writing:
                continue
            if job_id not in held:
                # The handler runs on, but its outcome write will be refused. Report it once.
                if not execution.lease_lost:
                    execution.lease_lost = True
                    self._stats.lost_leases += 1
                    log.warning(
                        "lease lost on job %s: 'heartbeat' matched no row; "
                        "job %s keeps running here but its outcome will be dropped",
                        job_id,
                        job_id,
                    )
            elif held[job_id] and not execution.cancelled:
                execution.request_cancel()
                if execution.async_future is not None:
                    execution.async_future.cancel()
