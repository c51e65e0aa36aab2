"""Slot accounting: how many more attempts a worker may claim, and which attempts it holds.

A leased attempt takes a slot at its claim and gives it back as soon as its handler returns, so
the next claim overlaps the outcome write. It stays in the running set (the heartbeat set)
until the completer wrote its outcome. An atomic run holds a slot from its claim until its
transaction ends.

A claim may also take up to ``ahead`` attempts more than the free slots (the claimer's
prefetch): those wait, in claim order, leased to this worker and heartbeated like the others,
and the pool thread whose handler returns starts the next one itself (its slot passes on
without a thread hand-off). A waiting attempt's timeout and duration count from that start, not
from the claim. At most ``2 * (concurrency + prefetch)`` attempts are held at once (running,
waiting, or with their outcome not yet written): the slots and the prefetch, and as many again
whose handlers returned while the completer writes their outcomes. A bound of the slots and
the prefetch alone would make each claim ahead wait for the last outcome write, so claims and
outcome writes would take turns instead of overlapping. At a shutdown the waiting ones are given
back unstarted (``take_waiting``).

A sync handler past its timeout cannot be stopped: its slot goes to a replacement thread while
it runs on, but only while fewer than ``max(concurrency, MIN_HUNG_THREADS)`` threads are in that
state. Past that bound a timed-out handler keeps its slot until it returns: the worker runs
fewer jobs at once instead of growing threads without end.

All of it is guarded by this object's lock, which also guards the ``Execution`` flags that make
exactly one outcome per attempt (``decided``, ``timed_out``, ``holds_slot``, ``replaced``,
``writing``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from pgqueue.jobs import Lease, Outcome
from pgqueue.worker.execution import Execution

MIN_HUNG_THREADS = 10


class Slots:
    """Free slots and held attempts of one worker; thread-safe."""

    def __init__(self, concurrency: int, prefetch: int = 0) -> None:
        self.concurrency = concurrency
        self._lock = threading.Lock()
        self._running: dict[int, Execution] = {}
        # Attempts whose job this worker claimed again (its lease had expired and the job was
        # rescued) while their handler still ran: no longer heartbeated, but still timed out.
        self._superseded: list[Execution] = []
        self._busy = 0  # attempts whose handler has not returned (or was not replaced)
        self._waiting: collections.deque[Execution] = collections.deque()  # claimed, not started
        self._ahead = 0  # how many attempts the claimer means to keep waiting (its last claim)
        self._closed = False  # the worker stops: waiting attempts are not started any more
        self.returned = 0  # handlers returned, ever: slots that came free (the claimer's pace)
        self._max_held = 2 * (concurrency + prefetch)
        self._hung = 0  # threads whose timed-out handler still runs (their slot was replaced)
        self._max_hung = max(concurrency, MIN_HUNG_THREADS)
        self._atomic = 0  # atomic runners probing or running
        self._atomic_running: dict[str, int] = {}  # atomic attempts running, per queue
        self._beats = 0  # heartbeats between ``leases`` and ``beat_done``
        # The failed attempt of a timed-out execution (``Executor.timed_out``), set by the
        # worker: ``settle_by_handler`` decides by the clock an attempt nobody decided in time.
        self.timed_out: Callable[[Execution], Outcome] | None = None

    # -- claims --------------------------------------------------------------------------------

    def free(self) -> int:
        """How many attempts may be claimed now for the free slots (0 or less: none)."""
        with self._lock:
            return self._claimable(0)

    def claimable(self, ahead: int) -> int:
        """How many attempts may be claimed now to fill the free slots and keep ``ahead``
        waiting (0 or less: none); the claimer's current ``ahead`` from now on."""
        with self._lock:
            self._ahead = ahead
            return self._claimable(ahead)

    def _claimable(self, ahead: int) -> int:
        atomic = self._atomic
        return min(
            self.concurrency - self._busy - atomic + ahead - len(self._waiting),
            self._max_held - self._held() - atomic,
        )

    def _drop_superseded(self, execution: Execution) -> None:
        """Forget ``execution`` if it is a superseded attempt (by identity: attempts compare
        equal by their fields). Under the lock."""
        self._superseded = [e for e in self._superseded if e is not execution]

    def _held(self) -> int:
        """The attempts held toward the bound: not those whose timed-out handler runs on in a
        replaced slot (they have their own bound, and no outcome write will free them soon)."""
        return len(self._running) + len(self._superseded) - self._hung

    def add(self, executions: Sequence[Execution]) -> list[Execution]:
        """Hold newly claimed attempts: those that fit in the free slots take one and are
        returned, to be started now; the rest wait for a slot."""
        with self._lock:
            running = self._running
            for execution in executions:
                earlier = running.get(execution.job.id)
                if earlier is not None and not earlier.decided:
                    self._superseded.append(earlier)
                running[execution.job.id] = execution
            waiting = self._waiting
            room = self.concurrency - self._busy - self._atomic
            if not waiting and room >= len(executions):
                self._busy += len(executions)
                return list(executions)
            for execution in executions:
                execution.holds_slot = False
                execution.waiting = True
            waiting.extend(executions)
            return self._start_waiting(room)

    def start_waiting(self) -> list[Execution]:
        """The waiting attempts that free slots can take now (slots freed with no handler
        returning, such as a timed-out one's), each in its slot."""
        with self._lock:
            if not self._waiting:
                return []
            return self._start_waiting(self.concurrency - self._busy - self._atomic)

    def _start_waiting(self, room: int) -> list[Execution]:
        started: list[Execution] = []
        waiting = self._waiting
        if self._closed:
            return started
        now = time.monotonic()
        while room > 0 and waiting:
            execution = waiting.popleft()
            execution.waiting = False
            execution.holds_slot = True
            execution.started = now
            started.append(execution)
            room -= 1
        self._busy += len(started)
        return started

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

    def handler_returned(
        self, execution: Execution
    ) -> tuple[bool | Outcome, bool, Execution | None]:
        """Give back the slot of a handler that returned, or pass it to the next waiting
        attempt. Returns what the caller writes: True for the handler's own outcome, the failed
        attempt its timeout decided while it ran on, or False when another path put the
        attempt's outcome already (a shutdown release, an async handler's timeout); whether the
        claimer has room to claim (more attempts may be held, and at most half of those it
        means to keep waiting still wait); and the waiting attempt now started in this slot (to
        run on the calling thread)."""
        following: Execution | None = None
        with self._lock:
            write: bool | Outcome = (
                not execution.decided
                or execution.settled
                or (execution.timed_out and execution.stop_process is not None)
            )
            if execution.timeout_outcome is not None:
                write, execution.timeout_outcome = execution.timeout_outcome, None
            if write is False and self._superseded:
                self._drop_superseded(execution)  # no outcome write will drop it
            execution.decided = True
            if execution.holds_slot:
                execution.holds_slot = False
                waiting = self._waiting
                if waiting and not self._closed:
                    following = waiting.popleft()
                    following.waiting = False
                    following.holds_slot = True
                    following.started = time.monotonic()
                else:
                    self._busy -= 1
            if execution.replaced:
                self._hung -= 1
            self.returned += 1
            room = self._held() < self._max_held and 2 * len(self._waiting) <= self._ahead
            return write, room, following

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

    def running_ids_from_a_signal(self) -> list[int]:
        """``running_ids`` for a signal handler, which runs in the main thread between two of
        its statements: that thread may hold the lock, so it is not waited for. A copy made
        while another thread changes the dict is taken again."""
        if self._lock.acquire(timeout=0.05):
            try:
                return list(self._running)
            finally:
                self._lock.release()
        for _ in range(10):
            try:
                return list(self._running)
            except RuntimeError:  # changed size during the copy
                continue
        return []

    def leases(self) -> list[Lease]:
        """``(job id, lease token, lease seconds)`` of the held attempts to extend: not those
        whose outcome is being written (the write may commit first, which would look like a
        lost lease), nor those already known lost. Until the caller's ``beat_done``, a
        heartbeat is in flight (``heartbeat_in_flight``)."""
        with self._lock:
            self._beats += 1
            return [
                (e.job.id, e.job.lease_token, e.lease_seconds)
                for e in self._running.values()
                if not e.writing and not e.lease_lost
            ]

    def beat_done(self) -> None:
        """The heartbeat that took ``leases`` has ended its statement (committed or not)."""
        with self._lock:
            self._beats -= 1

    def heartbeat_in_flight(self) -> bool:
        """Whether a heartbeat took its leases and has not ended its statement. An outcome
        write that asks after ``start_writing`` and hears no can update its rows in any order:
        a heartbeat that begins later leaves those attempts out (they are ``writing``)."""
        with self._lock:
            return self._beats > 0

    def half_held(self) -> bool:
        """Whether half or more of the attempts this worker may hold are held: the claims
        may soon wait for the outcome writes that free room."""
        with self._lock:
            return 2 * self._held() >= self._max_held

    def lookup(self, job_ids: Iterable[int]) -> dict[int, Execution | None]:
        with self._lock:
            running = self._running
            return {job_id: running.get(job_id) for job_id in job_ids}

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which a started attempt's timeout passes (None: no
        started attempt has a timeout)."""
        with self._lock:
            deadlines = [
                e.started + e.timeout
                for e in (*self._running.values(), *self._superseded)
                if e.timeout and not e.decided and not e.waiting
            ]
        return min(deadlines, default=None)

    def settle_by_handler(self, execution: Execution) -> bool:
        """Decide ``execution``'s outcome for its handler, which returned and is about to
        commit its context session's writes; False when its timeout or a shutdown release
        decided it first, or its deadline passed though nobody decided it yet (those writes
        must then be rolled back, never committed)."""
        with self._lock:
            if execution.decided:
                return False
            timeout = execution.timeout
            if (
                timeout
                and self.timed_out is not None
                and time.monotonic() - execution.started >= timeout
            ):
                # The deadlines' thread is late (a stalled host): the clock decides.
                execution.decided = execution.timed_out = True
                if execution.stop_process is None:
                    execution.timeout_outcome = self.timed_out(execution)
                return False
            execution.decided = execution.settled = True
            return True

    def take_overdue(
        self, now: float, timed_out: Callable[[Execution], Outcome]
    ) -> tuple[list[tuple[Execution, Outcome | None]], int]:
        """Decide (once) the attempts past their timeout at monotonic time ``now``, handing the
        slot of each sync one to a replacement thread while the bound allows (``replaced``).
        Returns them, each with its outcome (``timed_out``'s) to write now: an async handler's
        (its future is cancelled, so it runs no more); None for a sync handler, which runs on,
        and whose outcome is kept (``timeout_outcome``) for when its thread returns. Also how
        many threads now run handlers past their timeout."""
        with self._lock:
            overdue = [
                e
                for e in (*self._running.values(), *self._superseded)
                if e.timeout and not e.decided and not e.waiting and now - e.started >= e.timeout
            ]
            decided: list[tuple[Execution, Outcome | None]] = []
            for execution in overdue:
                execution.decided = True
                execution.timed_out = True
                if execution.stop_process is not None:
                    # Its child is stopped: its pool thread writes the failure once it is gone.
                    decided.append((execution, None))
                    continue
                outcome = timed_out(execution)
                if execution.async_future is None:
                    execution.timeout_outcome = outcome
                    decided.append((execution, None))
                else:
                    decided.append((execution, outcome))
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
            return decided, self._hung

    def start_writing(self, executions: Iterable[Execution]) -> None:
        with self._lock:
            for execution in executions:
                execution.writing = True

    def kept_waiting(self, executions: Iterable[Execution]) -> None:
        """Attempts whose outcome waits for a later write: heartbeated again meanwhile."""
        with self._lock:
            for execution in executions:
                execution.writing = False

    def written(self, executions: Iterable[Execution]) -> None:
        """Stop holding attempts whose outcome was written (or given up)."""
        with self._lock:
            running = self._running
            for execution in executions:
                # Only this attempt: a retry written with no delay may have been claimed again
                # already (by this worker), and that attempt needs its heartbeats.
                if running.get(execution.job.id) is execution:
                    del running[execution.job.id]
                elif self._superseded:
                    self._drop_superseded(execution)

    # -- idle and shutdown ---------------------------------------------------------------------

    def busy(self) -> bool:
        """Whether any attempt is held or any atomic runner is under way."""
        with self._lock:
            return bool(self._running) or self._atomic > 0

    def take_waiting(self) -> list[Execution]:
        """Decide (once) every waiting attempt, to be given back unstarted, and start no more
        (the worker stops)."""
        with self._lock:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            for execution in waiting:
                execution.decided = True
            return waiting

    def take_timeout_outcomes(self) -> list[tuple[Execution, Outcome]]:
        """The failed attempts decided at a timeout whose handler still runs (the worker
        stops: their threads end with it), each taken once."""
        with self._lock:
            taken = []
            for execution in self._running.values():
                if execution.timeout_outcome is not None:
                    taken.append((execution, execution.timeout_outcome))
                    execution.timeout_outcome = None
            return taken

    def give_up_unfinished(self) -> list[Execution]:
        """Decide every held attempt whose outcome is not decided yet (for a shutdown release)."""
        with self._lock:
            unfinished = [e for e in self._running.values() if not e.decided]
            for execution in unfinished:
                execution.decided = True
            return unfinished
