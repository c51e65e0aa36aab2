"""The worker: claim loop, slots, wake-ups, heartbeats, batched outcomes, and shutdown.

Threads of one worker process::

    main        claim loop: claims up to <free slots> tickets per statement, hands them to the pool
    pool (N)    handlers (sync directly; ``async def`` on the worker's event-loop thread)
    completer   writes outcomes in batches (one statement per kind) and frees slots
    heartbeat   extends leases of running jobs, learns about cancel requests and lost leases,
                and times out handlers past their task's timeout
    maintenance rescues expired leases and prunes history (one leader per database at a time)
    listener    LISTEN connection (see ``notifier.py``)

No SQL here: database work goes through ``WorkerStore`` (pgqueue's own engine, autocommit) and,
for atomic tasks, one transaction per job on the handler engine.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue as queue_module
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from pgqueue import repository, validation
from pgqueue.errors import ConfigurationError, ValidationError
from pgqueue.repository import Outcome
from pgqueue.worker.executor import Execution, Executor
from pgqueue.worker.notifier import Notifier, wall_to_monotonic
from pgqueue.worker.store import WorkerStore

if TYPE_CHECKING:
    from pgqueue.core import PgQueue

log = logging.getLogger("pgqueue.worker")

OUTCOME_BATCH = 500


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
        self.listen = settings.listen if listen is None else listen
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
        self._running: dict[int, Execution] = {}
        self._atomic_in_flight = 0
        self._outcomes: queue_module.Queue[tuple[Execution, Outcome] | None] = queue_module.Queue()
        self._next_known_run_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._signals_seen = 0
        self._work: queue_module.Queue[Callable[[], None] | None] = queue_module.Queue()
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
        task_leases = self.pgq.registry.lease_overrides()
        has_atomic = self.pgq.registry.has_atomic
        atomic_idle = False  # the last atomic claim found nothing: wait for a wake-up
        while not self._stopping.is_set():
            self._wake.clear()
            free = requested = self._free_slots()
            claimed = 0
            if free > 0:
                jobs = self.store.claim(
                    worker_id=self.worker_id,
                    limit=free,
                    queues=self.queues,
                    lease_seconds=self.lease_seconds,
                    task_leases=task_leases,
                )
                claimed = len(jobs)
                self._start_leased(jobs, task_leases)
                free -= claimed
            if has_atomic and free > 0 and not atomic_idle:
                atomic_idle = not self._run_one_atomic_slot()
                free -= 0 if atomic_idle else 1
            if claimed and claimed == requested and self._free_slots() > 0:
                continue  # a full batch: more may be waiting
            if drain and self._idle() and not self.store.ready_work_exists(self.queues):
                return
            self._wake.wait(self._wait_timeout())
            if self._wake.is_set():
                atomic_idle = False
            elif has_atomic:
                atomic_idle = False  # poll timeout: look again

    def _free_slots(self) -> int:
        with self._slots_lock:
            return self.concurrency - len(self._running) - self._atomic_in_flight

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
            self._wake.set()
            return
        at = wall_to_monotonic(run_at_epoch)
        known = self._next_known_run_at
        if known is None or at < known:
            self._next_known_run_at = at
            self._wake.set()  # recompute the wait

    def _start_leased(
        self, jobs: Sequence[repository.ClaimedJob], leases: dict[str, float]
    ) -> None:
        now = time.monotonic()
        for job in jobs:
            task = self.pgq.registry.find(job.task_name)
            execution = Execution(
                job=job,
                lease_seconds=leases.get(job.task_name, self.lease_seconds),
                timeout=task.timeout if task is not None else None,
                started=now,
                cancel_event=threading.Event(),
            )
            if job.cancel_requested:
                execution.cancel_event.set()
            with self._slots_lock:
                self._running[job.id] = execution
            self.stats.claimed += 1
            self._work.put(functools.partial(self._execute_leased, execution))

    def _execute_leased(self, execution: Execution) -> None:
        outcome = self.executor.run_leased(execution)
        if not execution.abandoned:
            self._outcomes.put((execution, outcome))

    def _run_one_atomic_slot(self) -> bool:
        """Start one atomic runner; returns False when it found no atomic ticket."""
        found = threading.Event()
        done = threading.Event()
        with self._slots_lock:
            self._atomic_in_flight += 1

        def runner() -> None:
            try:
                self._execute_atomic(found)
            finally:
                with self._slots_lock:
                    self._atomic_in_flight -= 1
                done.set()
                self._wake.set()

        self._work.put(runner)
        # Wait only for the claim (not the handler) to learn whether there was anything.
        while not (found.is_set() or done.is_set()):
            found.wait(0.05)
        return found.is_set()

    def _execute_atomic(self, found: threading.Event) -> None:
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
                if not jobs:
                    return
                found.set()
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
            first = self._outcomes.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < OUTCOME_BATCH:
                try:
                    item = self._outcomes.get_nowait()
                except queue_module.Empty:
                    break
                if item is None:
                    self._outcomes.put(None)  # keep the stop marker for the outer loop
                    break
                batch.append(item)
            self._write(batch)

    def _write(self, batch: list[tuple[Execution, Outcome]]) -> None:
        try:
            lost = self.store.record_outcomes(outcome for _, outcome in batch)
        except Exception:
            log.exception("could not record %d outcomes; their leases will expire", len(batch))
            lost = {outcome.job_id for _, outcome in batch}
        now = time.monotonic()
        with self._slots_lock:
            for execution, _ in batch:
                self._running.pop(execution.job.id, None)
        for execution, outcome in batch:
            if outcome.job_id in lost:
                self.stats.lost_leases += 1
                log.warning(
                    "lease lost: job %s (%s attempt %d) outcome %r dropped; another worker owns it",
                    outcome.job_id,
                    execution.job.task_name,
                    execution.job.attempt,
                    outcome.kind,
                )
                continue
            self._count(outcome, now - execution.started, execution.job)
        self._wake.set()

    def _count(self, outcome: Outcome, duration: float, job: repository.ClaimedJob) -> None:
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
            "" if not outcome.error else " error=" + outcome.error.strip().splitlines()[-1][:200],
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
                leases = [
                    (e.job.id, e.job.lease_token, e.lease_seconds)
                    for e in self._running.values()
                    if not e.abandoned
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
                if execution is None:
                    continue
                if job_id not in held:
                    # The outcome write will be refused too; stop paying attention to it.
                    log.warning("lease lost on running job %s", job_id)
                elif held[job_id] and not execution.cancel_event.is_set():
                    execution.cancel_event.set()
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
                if e.timeout and not e.abandoned and now - e.started > e.timeout
            ]
            for execution in overdue:
                execution.abandoned = True
        for execution in overdue:
            if execution.async_future is not None:
                execution.async_future.cancel()
            self._outcomes.put((execution, self.executor.timed_out(execution)))

    # -- maintenance -------------------------------------------------------------------------

    def _maintenance_loop(self) -> None:
        settings = self.pgq.settings
        next_prune = time.monotonic() + settings.prune_interval / 10
        while not self._halt.wait(settings.rescue_interval):
            try:
                rescued = self.store.rescue_expired(limit=1000, error="lease expired (worker lost)")
                if rescued:
                    self.stats.rescued += len(rescued)
                    log.warning(
                        "rescued %d jobs with expired leases: %s", len(rescued), rescued[:20]
                    )
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + settings.prune_interval
                    pruned = self.store.prune(
                        succeeded_before=settings.succeeded_retention,
                        failed_before=settings.failed_retention,
                        limit=10_000,
                    )
                    if pruned:
                        log.info("pruned %d finished jobs", pruned)
            except Exception:
                if not self._halt.is_set():
                    log.exception("maintenance pass failed")

    # -- threads, loop, shutdown -------------------------------------------------------------

    def _pool_thread(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            try:
                item()
            except Exception:
                log.exception("worker thread error")

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

    def _start_threads(self) -> None:
        # Daemon threads: a handler that never returns must not keep the process alive after a
        # shutdown has released its job.
        def spawn(target: Callable[[], None], name: str) -> None:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

        for index in range(self.concurrency + 2):
            spawn(self._pool_thread, f"pgqueue-slot-{index}")
        spawn(self._completer, "pgqueue-completer")
        spawn(self._heartbeat_loop, "pgqueue-heartbeat")
        if self.maintenance:
            spawn(self._maintenance_loop, "pgqueue-maintenance")
        if self.listen:
            self.notifier = Notifier(self.pgq.url, self.queues, self._on_notify, self._halt)
            self.notifier.start()

    def _shutdown(self) -> None:
        self._stopping.set()
        deadline = time.monotonic() + self.shutdown_timeout
        while time.monotonic() < deadline:
            with self._slots_lock:
                busy = bool(self._running) or self._atomic_in_flight > 0
            if not busy:
                break
            time.sleep(0.02)
        with self._slots_lock:
            unfinished = [e for e in self._running.values() if not e.abandoned]
            for execution in unfinished:
                execution.abandoned = True
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
