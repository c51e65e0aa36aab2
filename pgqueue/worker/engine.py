"""The worker: claim loop, slots, wake-ups, heartbeats, batched outcomes, and shutdown.

Threads of one worker process::

    main        claim loop: claims up to <free slots> tickets per statement, hands them to the pool
    pool (N)    handlers (sync directly; ``async def`` on the worker's event-loop thread); a
                handler's slot is free as soon as it returns
    completer   writes outcomes in batches (one statement per kind), overlapping the next claims
    heartbeat   extends leases of running jobs, learns about cancel requests and lost leases,
                and times out handlers past their task's timeout
    maintenance rescues expired leases and prunes history (one leader per database at a time)
    listener    LISTEN connection (see ``notifier.py``); while the claim loop is idle it claims
                for a notification itself, one thread hand-off less on an idle worker's pick-up

No SQL here: database work goes through ``WorkerStore`` (pgqueue's own engine, autocommit) and,
for atomic tasks, one transaction per job on the handler engine.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from pgqueue import repository, validation
from pgqueue.errors import (
    ConfigurationError,
    LeaseLost,
    ValidationError,
    error_line,
    error_summary,
)
from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.worker.executor import Execution, Executor
from pgqueue.worker.notifier import Notifier, wall_to_monotonic
from pgqueue.worker.store import WorkerStore

if TYPE_CHECKING:
    from pgqueue.core import PgQueue

log = logging.getLogger("pgqueue.worker")

OUTCOME_BATCH = 500
# A sync handler past its timeout cannot be stopped; its slot goes to a new thread while it
# runs on. At most ``max(concurrency, MIN_HUNG_THREADS)`` such threads exist at once: past
# that, a timed-out handler keeps its slot until it returns.
MIN_HUNG_THREADS = 10


class _Outcomes:
    """Outcomes waiting for the completer, which takes everything waiting at once (up to a
    batch); ``None`` marks the stop. Producers wake the completer only while it waits."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple[Execution, Outcome] | None] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._waiting = False

    def put(self, item: tuple[Execution, Outcome] | None) -> None:
        with self._ready:
            self._items.append(item)
            if self._waiting:
                self._ready.notify()

    def empty(self) -> bool:
        return not self._items

    def take(self, limit: int) -> tuple[list[tuple[Execution, Outcome]], bool]:
        """Up to ``limit`` outcomes (waiting while there are none), and whether the stop
        marker came after them."""
        with self._ready:
            items = self._items
            while not items:
                self._waiting = True
                try:
                    self._ready.wait()
                finally:
                    self._waiting = False
            batch: list[tuple[Execution, Outcome]] = []
            while items and len(batch) < limit:
                item = items.popleft()
                if item is None:
                    return batch, True
                batch.append(item)
            return batch, False


class _WorkQueue:
    """Work for the pool threads: a deque, and a dispatcher that decides how many threads to wake.

    Waking a sleeping thread costs a futex round trip and a GIL hand-off, more CPU than a
    no-op job's whole run; waking one per job made thread switches the largest cost of a
    drain. So ``put_many`` wakes one sleeping thread, and the threads already awake take item
    after item. While items wait, the dispatcher thread looks every ``SPREAD_INTERVAL``: when
    the awake threads took nothing since its last look (they are all inside slow handlers) it
    wakes a thread per waiting item; when they made progress but too slowly to finish the
    waiting items before its next look, it wakes enough more threads at the rate they showed.
    A batch of quick jobs is run by one or two threads; a batch of slow jobs still spreads over
    all threads, each waiting at most a few intervals for its thread.
    """

    SPREAD_INTERVAL = 0.002

    def __init__(self) -> None:
        lock = threading.Lock()
        self._items: collections.deque[Any] = collections.deque()
        self._ready = threading.Condition(lock)  # pool threads wait here
        self._tick = threading.Condition(lock)  # the dispatcher waits here
        self._idle = 0  # pool threads waiting for items
        self._active = 0  # pool threads that took an item and have not asked for the next
        self._taken = 0  # items taken, ever
        self._dispatcher_waiting = False
        self._closed = False

    def put_many(self, items: Iterable[Any]) -> None:
        with self._ready:
            self._items.extend(items)
            if self._idle:
                self._ready.notify()
            # One item goes to the thread just woken (or one already awake): the dispatcher
            # is needed only for more, so a lone job (an idle worker's pick-up) wakes nothing else.
            if self._dispatcher_waiting and len(self._items) > 1:
                self._tick.notify()

    def put(self, item: Any) -> None:
        self.put_many((item,))

    def get(self, finished: bool = False) -> Any:
        """The next item; ``finished``: the calling thread is done with its previous item."""
        with self._ready:
            if finished:
                self._active -= 1
            items = self._items
            while not items:
                self._idle += 1
                try:
                    self._ready.wait()
                finally:
                    self._idle -= 1
            self._active += 1
            self._taken += 1
            return items.popleft()

    def retire(self) -> None:
        """The calling pool thread ends after its current item (it will not call ``get``)."""
        with self._ready:
            self._active -= 1

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._tick.notify()

    def dispatch(self) -> None:
        """The dispatcher thread's loop (until ``close``)."""
        with self._ready:
            while not self._closed:
                if not self._items or not self._idle:
                    self._dispatcher_waiting = True
                    try:
                        # Without idle threads there is nobody to wake: look again in a while.
                        self._tick.wait(None if not self._items else self.SPREAD_INTERVAL)
                    finally:
                        self._dispatcher_waiting = False
                    continue
                taken = self._taken
                self._tick.wait(self.SPREAD_INTERVAL)
                waiting = len(self._items)
                if not waiting or not self._idle:
                    continue
                rate = self._taken - taken  # by ~``_active`` threads in one interval
                if rate == 0:
                    wake = waiting
                elif rate < waiting:
                    active = max(self._active, 1)
                    wake = -(-active * (waiting - rate) // rate)  # ceil
                else:
                    continue
                self._ready.notify(min(wake, waiting, self._idle))


@dataclass(slots=True)
class WorkerStats:
    """Counts of what one worker did."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    released: int = 0
    lost_leases: int = 0
    rescued: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    @property
    def processed(self) -> int:
        return self.succeeded + self.retried + self.failed + self.cancelled

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started


class Worker:
    """Runs jobs from some queues with ``concurrency`` slots. Use ``run()``; ``stop()`` from
    another thread or a signal ends it gracefully."""

    def __init__(
        self,
        pgq: PgQueue,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        listen: bool | None = None,
        poll_interval: float | None = None,
        lease_seconds: float | None = None,
        shutdown_timeout: float | None = None,
        maintenance: bool = True,
        worker_id: str | None = None,
        install_signal_handlers: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValidationError(f"concurrency must be a positive int, got {concurrency!r}")
        settings = pgq.settings
        self.pgq = pgq
        self.queues = None if queues is None else [validation.queue_name(q) for q in queues]
        if self.queues is not None and not self.queues:
            raise ValidationError("queues must name at least one queue (or be None for all)")
        self.concurrency = concurrency
        self.listen = (settings.listen if listen is None else listen) and pgq.can_listen
        self.poll_interval = poll_interval or settings.poll_interval
        self.lease_seconds = lease_seconds or settings.lease_seconds
        if self.lease_seconds <= 0 or self.poll_interval <= 0:
            raise ConfigurationError("lease_seconds and poll_interval must be positive")
        self.heartbeat_interval = (
            settings.effective_heartbeat_interval if lease_seconds is None else lease_seconds / 3
        )
        self.shutdown_timeout = (
            settings.shutdown_timeout if shutdown_timeout is None else shutdown_timeout
        )
        self.maintenance = maintenance
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.install_signal_handlers = install_signal_handlers
        self.on_outcome = on_outcome
        self.stats = WorkerStats()

        self._stopping = threading.Event()  # no more claims
        self._halt = threading.Event()  # helper threads end
        self._wake = threading.Event()
        self._slots_lock = threading.Lock()
        # Claimed leased attempts whose outcome is not written yet: the heartbeat set. A slot
        # is given back when the handler returns (``_busy``), so the next claim overlaps the
        # outcome write; up to ``concurrency`` more attempts may wait for their write.
        self._running: dict[int, Execution] = {}
        self._busy = 0
        self._max_held = 2 * concurrency
        self._hung = 0  # threads whose timed-out handler still runs (their slot was replaced)
        self._max_hung = max(concurrency, MIN_HUNG_THREADS)
        self._backlog = True  # the last claim was full (or not tried): more may be waiting
        self._atomic_in_flight = 0
        self._log_successes = settings.log_successes
        # Atomic claims run on a pool thread (they hold a transaction); the claim loop starts one
        # probe at a time and learns from its callback whether it found a ticket, never waiting.
        self._atomic_probing = False
        self._atomic_idle = False  # the last probe found nothing: wait for a wake-up or a poll
        self._notified = False  # a notification (not just a freed slot) set ``_wake``
        # One claimer at a time (the claim loop, or the listener for a notification): free slots
        # are counted and filled under it, and the store's claim connection is used under it.
        self._claim_lock = threading.Lock()
        self._claim_on_notify = False  # set by ``run`` (not in drain mode, no atomic tasks)
        self._task_leases: dict[str, float] = {}
        self._outcomes = _Outcomes()
        self._next_known_run_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._signals_seen = 0
        # Executions to run, callables (True when their thread must retire because a
        # replacement was started), or None (stop).
        self._work = _WorkQueue()
        self._threads: list[threading.Thread] = []
        self.store = WorkerStore(pgq.engine, stopping=self._stopping)
        self.executor = Executor(pgq.registry, settings, pgq.handler_session, self._event_loop)
        self.notifier: Notifier | None = None

    # -- public ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_timeout`` to finish. Thread-safe."""
        self._stopping.set()
        self._wake.set()

    @property
    def running_job_ids(self) -> list[int]:
        with self._slots_lock:
            return list(self._running)

    def run(self, drain: bool = False) -> WorkerStats:
        """Process jobs until ``stop()`` (or, with ``drain``, until nothing is ready)."""
        if self.install_signal_handlers:
            self._install_signal_handlers()
        self._task_leases = self.pgq.registry.lease_overrides()
        # Atomic work is found by probes that the claim loop starts; in drain mode the claim
        # loop decides when the queue is empty. Both keep every claim on the claim loop.
        self._claim_on_notify = not drain and not self.pgq.registry.has_atomic
        self._start_threads()
        log.info(
            "worker %s started: queues=%s concurrency=%d listen=%s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.listen,
        )
        try:
            self._claim_loop(drain)
        finally:
            self._shutdown()
        self.stats.finished = time.monotonic()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        return self.stats

    # -- claim loop --------------------------------------------------------------------------

    def _claim_loop(self, drain: bool) -> None:
        task_leases = self._task_leases
        has_atomic = self.pgq.registry.has_atomic
        failures = 0
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                with self._claim_lock:
                    full_batch = self._claim_once(task_leases, has_atomic)
                if (
                    drain
                    and not full_batch
                    and self._idle()
                    and not self.store.ready_work_exists(self.queues)
                ):
                    return
            except Exception:
                # A claim that fails for a reason other than a lost connection (which the store
                # retries itself) must not end the worker: log, back off, try again.
                if self._stopping.is_set():
                    return
                failures += 1
                delay = min(0.1 * 2 ** min(failures - 1, 6), 5.0)
                log.exception("claim failed (%d in a row); retrying in %.2fs", failures, delay)
                self._stopping.wait(delay)
                continue
            failures = 0
            if full_batch:
                continue  # a full batch: more may be waiting
            woken = self._wake.wait(self._wait_timeout())
            with self._slots_lock:
                if not woken or self._notified:
                    self._atomic_idle = False  # poll time or new tickets: look for atomic work
                self._notified = False

    def _claim_once(self, task_leases: dict[str, float], has_atomic: bool) -> bool:
        """Claim for the free slots; True when the claim was full (more may be waiting)."""
        free = requested = self._free_slots()
        claimed = 0
        if free > 0:
            jobs = self.store.claim(
                worker_id=self.worker_id,
                limit=free,
                queues=self.queues,
                lease_seconds=self.lease_seconds,
                task_leases=task_leases,
                held=lambda: self.running_job_ids,
            )
            claimed = len(jobs)
            # Fewer than asked for: nothing else is ready, so a freed slot is no reason to
            # claim again; a notification, a poll or a known run_at is.
            self._backlog = claimed == requested
            self._start_leased(jobs, task_leases)
            free -= claimed
        else:
            self._backlog = True  # no room to look: work may be waiting
        if has_atomic and free > 0:
            self._maybe_probe_atomic()
        return claimed > 0 and claimed == requested and self._free_slots() > 0

    def _free_slots(self) -> int:
        with self._slots_lock:
            atomic = self._atomic_in_flight
            return min(
                self.concurrency - self._busy - atomic,
                self._max_held - len(self._running) - atomic,
            )

    def _idle(self) -> bool:
        with self._slots_lock:
            return not self._running and self._atomic_in_flight == 0 and self._outcomes.empty()

    def _wait_timeout(self) -> float:
        timeout = self.poll_interval
        known = self._next_known_run_at
        if known is not None:
            until = known - time.monotonic()
            if until <= 0:
                self._next_known_run_at = None
                return 0.0
            timeout = min(timeout, until)
        return timeout

    def _on_notify(self, run_at_epoch: float | None) -> None:
        if run_at_epoch is None:
            if self._claim_on_notify and self._claim_lock.acquire(blocking=False):
                # The claim loop is waiting (or between claims): claim here, on the thread the
                # notification woke, instead of waking the claim loop to do it.
                try:
                    if self._stopping.is_set() or not self._claim_once(self._task_leases, False):
                        return
                except Exception:
                    if not self._stopping.is_set():
                        log.exception("claim on notification failed; the claim loop takes over")
                finally:
                    self._claim_lock.release()
                # A full claim (more may be waiting) or a failed one: the claim loop goes on.
            with self._slots_lock:
                self._notified = True
            self._wake.set()
            return
        at = wall_to_monotonic(run_at_epoch)
        known = self._next_known_run_at
        if known is None or at < known:
            self._next_known_run_at = at
            self._wake.set()  # recompute the wait

    def _start_leased(self, jobs: Sequence[ClaimedJob], leases: dict[str, float]) -> None:
        if not jobs:
            return
        now = time.monotonic()
        find = self.pgq.registry.find
        default_lease = self.lease_seconds
        executions = []
        for job in jobs:
            task = find(job.task_name)
            execution = Execution(
                job=job,
                lease_seconds=leases.get(job.task_name, default_lease) if leases else default_lease,
                timeout=task.timeout if task is not None else None,
                started=now,
                cancelled=job.cancel_requested,
            )
            executions.append(execution)
        with self._slots_lock:
            running = self._running
            for execution in executions:
                running[execution.job.id] = execution
            self._busy += len(executions)
        self.stats.claimed += len(executions)
        self._work.put_many(executions)

    def _execute_leased(self, execution: Execution) -> bool:
        outcome = self.executor.run_leased(execution)
        with self._slots_lock:
            decided, execution.decided = execution.decided, True
            if execution.holds_slot:
                execution.holds_slot = False
                self._busy -= 1
            if execution.replaced:
                self._hung -= 1
            # Wake the claim loop only if it may find work and can claim now: while the
            # unwritten outcomes are at their bound, the completer wakes it after the next
            # write instead (a wake-up per job would cost a thread switch per job for nothing).
            claimable = self._backlog and len(self._running) < self._max_held
        if not decided:
            self._outcomes.put((execution, outcome))
        # Already set: the claim loop has not cleared it yet, and it reads the free slots
        # only after clearing it, so this handler's slot is seen (Event.set costs a lock).
        if claimable and not self._wake.is_set():
            self._wake.set()
        # A timed-out handler's thread was replaced when its job was given up: retire it.
        return execution.replaced

    def _maybe_probe_atomic(self) -> None:
        """Start one atomic runner unless one is claiming or the last found nothing."""
        with self._slots_lock:
            if self._atomic_probing or self._atomic_idle:
                return
            self._atomic_probing = True
            self._atomic_in_flight += 1
        self._work.put(self._atomic_runner)

    def _atomic_runner(self) -> bool:
        reported = False

        def claimed(found: bool) -> None:
            nonlocal reported
            reported = True
            with self._slots_lock:
                self._atomic_probing = False
                self._atomic_idle = not found
            self._wake.set()  # found: probe for the next one; not found: nothing to do

        try:
            self._execute_atomic(claimed)
        finally:
            with self._slots_lock:
                self._atomic_in_flight -= 1
                if not reported:
                    self._atomic_probing = False
                    self._atomic_idle = True  # it failed before claiming: wait for a poll
            self._wake.set()
        return False

    def _execute_atomic(self, claimed: Callable[[bool], None]) -> None:
        session = self.pgq.handler_session()
        started = time.monotonic()
        try:
            with session.begin():
                jobs = repository.claim(
                    session,
                    worker_id=self.worker_id,
                    limit=1,
                    queues=self.queues,
                    lease_seconds=self.lease_seconds,
                    task_leases={},
                    atomic=True,
                )
                claimed(bool(jobs))
                if not jobs:
                    return
                self.stats.claimed += 1
                outcome = self.executor.run_atomic(session, jobs[0], threading.Event())
            self._count(outcome, time.monotonic() - started, jobs[0])
        except Exception:
            log.exception("atomic job transaction failed; it rolled back and its ticket is back")
        finally:
            session.close()

    # -- outcomes ----------------------------------------------------------------------------

    def _completer(self) -> None:
        while True:
            batch, stop = self._outcomes.take(OUTCOME_BATCH)
            if batch:
                self._write(batch)
            if stop:
                return

    def _write(self, batch: list[tuple[Execution, Outcome]]) -> None:
        with self._slots_lock:
            for execution, _ in batch:
                execution.writing = True
        written = batch
        try:
            lost = self.store.record_outcomes(outcome for _, outcome in batch)
        except Exception as exc:
            # Not a lost connection or a transient conflict (the store retries those): the
            # database refused something in the batch. One bad outcome must not cost the others
            # their write (a success would run again after its lease expired).
            written, lost = self._write_one_by_one(batch, exc)
        now = time.monotonic()
        with self._slots_lock:
            running = self._running
            for execution, _ in batch:
                # Only this attempt: a retry written with no delay may have been claimed again
                # already (by this worker), and that attempt needs its heartbeats.
                if running.get(execution.job.id) is execution:
                    del running[execution.job.id]
        for execution, outcome in written:
            if outcome.job_id in lost:
                if not execution.lease_lost:
                    self.stats.lost_leases += 1
                log.warning(
                    "%s; outcome %r of %s attempt %d dropped (another worker owns the job)",
                    LeaseLost(outcome.job_id, outcome.kind),
                    outcome.kind,
                    execution.job.task_name,
                    execution.job.attempt,
                )
                continue
            self._count(outcome, now - execution.started, execution.job)
        self._wake.set()

    def _write_one_by_one(
        self, batch: list[tuple[Execution, Outcome]], error: Exception
    ) -> tuple[list[tuple[Execution, Outcome]], set[int]]:
        """Write a refused batch's outcomes one at a time; an outcome refused on its own is
        replaced by a failed attempt that records why (``Executor.unrecorded``). Returns the
        outcomes written and the ids whose lease was lost. An attempt for which nothing could
        be written is logged and left out: its row stays RUNNING until its lease expires and
        the rescuer re-queues it."""
        if len(batch) > 1:
            log.warning(
                "could not record %d outcomes at once (%s); writing them one by one",
                len(batch),
                error_line(error),
            )
        written: list[tuple[Execution, Outcome]] = []
        lost: set[int] = set()
        for execution, outcome in batch:
            refused: Exception | None = error if len(batch) == 1 else None
            if refused is None:
                try:
                    lost |= self.store.record_outcomes([outcome])
                except Exception as exc:
                    refused = exc
            if refused is not None:
                job = execution.job
                substitute = self.executor.unrecorded(job, outcome, refused)
                log.error(
                    "job %s (%s attempt %d): outcome %r refused by the database (%s); "
                    "recording a failed attempt instead",
                    job.id,
                    job.task_name,
                    job.attempt,
                    outcome.kind,
                    error_line(refused),
                )
                try:
                    lost |= self.store.record_outcomes([substitute])
                except Exception:
                    log.exception(
                        "job %s: no outcome could be recorded; its lease will expire", job.id
                    )
                    continue
                outcome = substitute
            written.append((execution, outcome))
        return written, lost

    def _count(self, outcome: Outcome, duration: float, job: ClaimedJob) -> None:
        kind = outcome.kind
        if kind == "complete":
            self.stats.succeeded += 1
        elif kind == "retry":
            self.stats.retried += 1
        elif kind == "fail":
            self.stats.failed += 1
        elif kind == "cancelled":
            self.stats.cancelled += 1
        elif kind == "release":
            self.stats.released += 1
        if (kind != "complete" or self._log_successes) and log.isEnabledFor(logging.INFO):
            extra = {
                "task": job.task_name,
                "job_id": job.id,
                "attempt": job.attempt,
                "duration_ms": round(duration * 1000, 2),
                "outcome": kind,
            }
            if self.pgq.settings.log_args:
                extra["args"] = job.args
                extra["kwargs"] = job.kwargs
            log.info(
                "job %s task=%s attempt=%d outcome=%s duration_ms=%.2f%s",
                job.id,
                job.task_name,
                job.attempt,
                kind,
                extra["duration_ms"],
                "" if not outcome.error else " error=" + error_summary(outcome.error),
                extra={"pgqueue": extra},
            )
        if self.on_outcome is not None:
            try:
                self.on_outcome(outcome)
            except Exception:
                log.exception("on_outcome callback failed")

    # -- heartbeat, timeouts, cancel ---------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._halt.wait(self._heartbeat_wait()):
            self._check_timeouts()
            with self._slots_lock:
                # Attempts whose outcome waits for its write are extended too: their lease must
                # not run out in the meantime. Those being written are left alone (the write
                # may commit before this statement runs, which would look like a lost lease).
                leases = [
                    (e.job.id, e.job.lease_token, e.lease_seconds)
                    for e in self._running.values()
                    if not e.writing and not e.lease_lost
                ]
            if not leases:
                continue
            try:
                held = self.store.heartbeat(leases)
            except Exception:
                log.exception("heartbeat failed")
                continue
            with self._slots_lock:
                executions = {job_id: self._running.get(job_id) for job_id, _, _ in leases}
            for job_id, execution in executions.items():
                if execution is None or execution.writing:
                    continue
                if job_id not in held:
                    # Rescued after its lease expired (this process was frozen or cut off): the
                    # handler runs on, but its outcome write will be refused. Report it once.
                    if not execution.lease_lost:
                        execution.lease_lost = True
                        self.stats.lost_leases += 1
                        log.warning(
                            "%s; job %s keeps running here but its outcome will be dropped",
                            LeaseLost(job_id, "heartbeat"),
                            job_id,
                        )
                elif held[job_id] and not execution.cancelled:
                    execution.request_cancel()
                    if execution.async_future is not None:
                        execution.async_future.cancel()

    def _heartbeat_wait(self) -> float:
        # Timeouts are checked at heartbeat time; check more often when a short timeout exists.
        with self._slots_lock:
            timeouts = [e.timeout for e in self._running.values() if e.timeout]
        return min([self.heartbeat_interval, *(max(t / 4, 0.05) for t in timeouts)])

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        with self._slots_lock:
            overdue = [
                e
                for e in self._running.values()
                if e.timeout and not e.decided and now - e.started > e.timeout
            ]
            replaced = []
            for execution in overdue:
                execution.decided = True
                execution.timed_out = True
                # A sync handler cannot be interrupted: its thread stays busy until the function
                # returns, so another thread takes its slot (the old one then retires), up to
                # a bound. An async handler's thread returns as soon as its future is cancelled.
                if (
                    execution.holds_slot
                    and execution.async_future is None
                    and self._hung < self._max_hung
                ):
                    execution.holds_slot = False
                    execution.replaced = True
                    self._busy -= 1
                    self._hung += 1
                    replaced.append(execution)
            hung = self._hung
        if replaced:
            self._wake.set()
        for execution in overdue:
            if execution.replaced:
                self._spawn(self._pool_thread, "pgqueue-slot-replacement", keep=False)
            elif execution.async_future is None:
                log.error(
                    "job %s (%s) runs on past its timeout of %ss and keeps its slot until it "
                    "returns: %d threads already run handlers past their timeout",
                    execution.job.id,
                    execution.job.task_name,
                    execution.timeout,
                    hung,
                )
            if execution.async_future is not None:
                execution.async_future.cancel()
            self._outcomes.put((execution, self.executor.timed_out(execution)))

    # -- maintenance -------------------------------------------------------------------------

    def _maintenance_loop(self) -> None:
        settings = self.pgq.settings
        next_prune = time.monotonic() + settings.prune_interval / 10
        while not self._halt.wait(settings.rescue_interval):
            # Each duty guarded on its own: a failing schedule (say, a periodic task whose
            # arguments no longer validate) must not stop expired leases being rescued.
            self._maintenance_step("schedule pass", self.pgq.run_schedules)
            self._maintenance_step("rescue pass", self._rescue)
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + settings.prune_interval
                self._maintenance_step("prune pass", self._prune)
                self._maintenance_step("queue limit recount", self._recount_running)

    def _maintenance_step(self, what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception:
            if not self._halt.is_set():
                log.exception("maintenance: %s failed", what)

    def _rescue(self) -> None:
        rescued = self.store.rescue_expired(limit=1000, error="lease expired (worker lost)")
        if rescued:
            self.stats.rescued += len(rescued)
            log.warning("rescued %d jobs with expired leases: %s", len(rescued), rescued[:20])

    def _recount_running(self) -> None:
        # The running counters of limited queues are kept exact by the statements that move
        # jobs in and out of RUNNING; this only repairs what bypassed them (rows deleted or
        # edited by hand), which would otherwise hold a queue at its limit for good.
        for queue, running in self.store.recount_running().items():
            log.warning("queue %s: running count corrected to %d", queue, running)

    def _prune(self) -> None:
        settings = self.pgq.settings
        pruned = self.store.prune(
            succeeded_before=settings.succeeded_retention,
            failed_before=settings.failed_retention,
            limit=10_000,
        )
        if pruned:
            log.info("pruned %d finished jobs", pruned)

    # -- threads, loop, shutdown -------------------------------------------------------------

    def _pool_thread(self) -> None:
        work = self._work
        execute = self._execute_leased
        finished = False
        while True:
            item = work.get(finished)
            finished = True
            if item is None:
                work.retire()
                return
            retire = False
            try:
                retire = execute(item) if type(item) is Execution else item()
            except Exception:
                log.exception("worker thread error")
            if retire:
                work.retire()
                return

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="pgqueue-asyncio", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    def _spawn(self, target: Callable[[], None], name: str, *, keep: bool = True) -> None:
        # Daemon threads: a handler that never returns must not keep the process alive after a
        # shutdown has released its job. Replacement threads are not kept: they come and go.
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        if keep:
            self._threads.append(thread)

    def _start_threads(self) -> None:
        spawn = self._spawn
        for index in range(self.concurrency + 2):
            spawn(self._pool_thread, f"pgqueue-slot-{index}")
        spawn(self._work.dispatch, "pgqueue-dispatcher")
        spawn(self._completer, "pgqueue-completer")
        spawn(self._heartbeat_loop, "pgqueue-heartbeat")
        if self.maintenance:
            spawn(self._maintenance_loop, "pgqueue-maintenance")
        if self.listen:
            self.notifier = Notifier(
                self.pgq.listen_connection, self.queues, self._on_notify, self._halt
            )
            self.notifier.start()

    def _shutdown(self) -> None:
        self._stopping.set()
        with self._claim_lock:  # a claim under way on the listener registers its jobs first
            self.store.close()
        deadline = time.monotonic() + self.shutdown_timeout
        while time.monotonic() < deadline:
            with self._slots_lock:
                busy = bool(self._running) or self._atomic_in_flight > 0
            if not busy:
                break
            time.sleep(0.02)
        with self._slots_lock:
            unfinished = [e for e in self._running.values() if not e.decided]
            for execution in unfinished:
                execution.decided = True
        for execution in unfinished:
            log.warning(
                "shutdown: releasing job %s (%s) still running after %.1fs",
                execution.job.id,
                execution.job.task_name,
                self.shutdown_timeout,
            )
            self._outcomes.put(
                (
                    execution,
                    Outcome(execution.job.id, execution.job.lease_token, "release"),
                )
            )
        self._outcomes.put(None)
        for thread in self._threads:
            if thread.name == "pgqueue-completer":
                thread.join(timeout=30)
        self._halt.set()
        for _ in range(self.concurrency + 2):
            self._work.put(None)
        self._work.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals_seen += 1
            if self._signals_seen > 1:
                log.warning("second signal: exiting now")
                os._exit(1)
            log.info("signal %d: stopping (running jobs get %.0fs)", signum, self.shutdown_timeout)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
