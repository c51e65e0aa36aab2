"""Slot accounting: how many more attempts a worker may claim, and which attempts it holds.

A leased attempt takes a slot at its claim and gives it back as soon as its handler returns, so
the next claim overlaps the outcome write. It stays in the running set (the heartbeat set)
until the completer wrote its outcome; at most ``2 * concurrency`` attempts are held at once.
An atomic runner holds a slot from its probe until its transaction ends.

A sync handler past its timeout cannot be stopped: its slot goes to a replacement thread while
it runs on, but only while fewer than ``max(concurrency, MIN_HUNG_THREADS)`` threads are in that
state. Past that bound a timed-out handler keeps its slot until it returns: the worker runs
fewer jobs at once instead of growing threads without end.

All of it is guarded by this object's lock, which also guards the ``Execution`` flags that make
exactly one outcome per attempt (``decided``, ``timed_out``, ``holds_slot``, ``replaced``,
``writing``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence

from pgqueue.worker.execution import Execution

MIN_HUNG_THREADS = 10


class Slots:
    """Free slots and held attempts of one worker; thread-safe."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._lock = threading.Lock()
        self._running: dict[int, Execution] = {}
        self._busy = 0  # attempts whose handler has not returned (or was not replaced)
        self._max_held = 2 * concurrency
        self._hung = 0  # threads whose timed-out handler still runs (their slot was replaced)
        self._max_hung = max(concurrency, MIN_HUNG_THREADS)
        self._atomic = 0  # atomic runners probing or running
        self._atomic_running: dict[str, int] = {}  # atomic attempts running, per queue

    # -- claims --------------------------------------------------------------------------------

    def free(self) -> int:
        """How many attempts may be claimed now (0 or less: none)."""
        with self._lock:
            atomic = self._atomic
            return min(
                self.concurrency - self._busy - atomic,
                self._max_held - len(self._running) - atomic,
            )

    def add(self, executions: Sequence[Execution]) -> None:
        """Hold newly claimed attempts, each in a slot."""
        with self._lock:
            running = self._running
            for execution in executions:
                running[execution.job.id] = execution
            self._busy += len(executions)

    def running_per_queue(self) -> dict[str, int]:
        """How many attempts of each queue are held (claimed, outcome not yet written)."""
        per_queue: dict[str, int] = {}
        with self._lock:
            for execution in self._running.values():
                queue = execution.job.queue
                per_queue[queue] = per_queue.get(queue, 0) + 1
            for queue, count in self._atomic_running.items():
                per_queue[queue] = per_queue.get(queue, 0) + count
        return per_queue

    def handler_returned(self, execution: Execution) -> tuple[bool, bool]:
        """Give back the slot of a handler that returned. Returns whether this decided the
        attempt's outcome (a timeout or a shutdown release may have decided it first), and
        whether more attempts may be held."""
        with self._lock:
            decided, execution.decided = execution.decided, True
            if execution.holds_slot:
                execution.holds_slot = False
                self._busy -= 1
            if execution.replaced:
                self._hung -= 1
            return not decided, len(self._running) < self._max_held

    def atomic_started(self) -> None:
        with self._lock:
            self._atomic += 1

    def atomic_finished(self) -> None:
        with self._lock:
            self._atomic -= 1

    def atomic_running(self, queue: str, change: int) -> None:
        """An atomic runner's claimed attempt of ``queue`` began (+1) or ended (-1)."""
        with self._lock:
            count = self._atomic_running.get(queue, 0) + change
            if count:
                self._atomic_running[queue] = count
            else:
                del self._atomic_running[queue]

    # -- what the heartbeat and the completer see ----------------------------------------------

    def running_ids(self) -> list[int]:
        with self._lock:
            return list(self._running)

    def leases(self) -> list[tuple[int, uuid.UUID, float]]:
        """``(job id, lease token, lease seconds)`` of the held attempts to extend: not those
        whose outcome is being written (the write may commit first, which would look like a
        lost lease), nor those already known lost."""
        with self._lock:
            return [
                (e.job.id, e.job.lease_token, e.lease_seconds)
                for e in self._running.values()
                if not e.writing and not e.lease_lost
            ]

    def lookup(self, job_ids: Iterable[int]) -> dict[int, Execution | None]:
        with self._lock:
            running = self._running
            return {job_id: running.get(job_id) for job_id in job_ids}

    def timeouts(self) -> list[float]:
        with self._lock:
            return [e.timeout for e in self._running.values() if e.timeout]

    def take_overdue(self, now: float) -> tuple[list[Execution], int]:
        """Decide (once) the attempts past their timeout at monotonic time ``now``, handing the
        slot of each sync one to a replacement thread while the bound allows (``replaced``).
        Returns them and how many threads now run handlers past their timeout."""
        with self._lock:
            overdue = [
                e
                for e in self._running.values()
                if e.timeout and not e.decided and now - e.started > e.timeout
            ]
            for execution in overdue:
                execution.decided = True
                execution.timed_out = True
                # An async handler's thread returns as soon as its future is cancelled.
                if (
                    execution.holds_slot
                    and execution.async_future is None
                    and self._hung < self._max_hung
                ):
                    execution.holds_slot = False
                    execution.replaced = True
                    self._busy -= 1
                    self._hung += 1
            return overdue, self._hung

    def start_writing(self, executions: Iterable[Execution]) -> None:
        with self._lock:
            for execution in executions:
                execution.writing = True

    def written(self, executions: Iterable[Execution]) -> None:
        """Stop holding attempts whose outcome was written (or given up)."""
        with self._lock:
            running = self._running
            for execution in executions:
                # Only this attempt: a retry written with no delay may have been claimed again
                # already (by this worker), and that attempt needs its heartbeats.
                if running.get(execution.job.id) is execution:
                    del running[execution.job.id]

    # -- idle and shutdown ---------------------------------------------------------------------

    def busy(self) -> bool:
        """Whether any attempt is held or any atomic runner is under way."""
        with self._lock:
            return bool(self._running) or self._atomic > 0

    def give_up_unfinished(self) -> list[Execution]:
        """Decide every held attempt whose outcome is not decided yet (for a shutdown release)."""
        with self._lock:
            unfinished = [e for e in self._running.values() if not e.decided]
            for execution in unfinished:
                execution.decided = True
            return unfinished
