"""The worker: wires its services together, starts their threads, and shuts them down.

Each service owns its state and its lock (one module each)::

    claimer      the claim loop (main thread): claims for the free slots, hands attempts to
                 the pool; claims for a notification on the listener thread while idle
    slots        free-slot accounting and the attempts held (the heartbeat set)
    dispatch     the pool threads (N + 2) that run handlers, the dispatcher thread that wakes
                 them, the asyncio loop thread of ``async def`` handlers
    executor     one attempt -> one outcome (``backoff.after_failure`` after a failure)
    atomic       atomic claims for the claim loop, each job run in a transaction of its own
    completer    writes outcomes in batches, overlapping the next claims
    heartbeat    extends leases, times out handlers, passes on cancel requests
    maintenance  scheduler passes, rescue of expired leases, pruning, queue-limit recounts
    notifier     the LISTEN connection (wake-ups)
    stats        the worker's counts, and the one log line per outcome written
    gauges       metrics sampled on a thread: running attempts, the queue figures
    registry     the worker's row in the worker registry (registered at start, refreshed by
                 the heartbeat, deleted at a clean stop; stale rows deleted by maintenance)

``Worker(pgq, ...)`` reads what it needs from ``pgq`` once (``context.WorkerContext``).

No SQL here or in the services: database work goes through ``WorkerStore`` (pgqueue's own
engine, autocommit) and, for atomic tasks, one transaction per job on the handler engine. Each
service that reaches the database names the few calls it makes in a protocol of its own
(``ClaimStore``, ``OutcomeStore``, ``HeartbeatStore``, ``MaintenanceStore``, ``RegistryStore``,
``FiguresStore``, ``AtomicStore``); ``WorkerStore`` is each of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import FrameType

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from pgqueue import config, metrics, validation
from pgqueue.errors import ValidationError, pgqueue_logger
from pgqueue.jobs import JobTables, Outcome
from pgqueue.tasks import TaskRegistry
from pgqueue.worker.atomic import AtomicClaims
from pgqueue.worker.child import ChildSetup
from pgqueue.worker.claim_health import ClaimHealth
from pgqueue.worker.claimer import Claimer, ClaimSettings
from pgqueue.worker.completer import Completer
from pgqueue.worker.context import QueueHost, WorkerContext
from pgqueue.worker.dispatch import AsyncLoop, Dispatcher, WorkQueue, start_daemon
from pgqueue.worker.executor import Executor
from pgqueue.worker.gauges import Gauges
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.notifier import Notifier
from pgqueue.worker.processes import ProcessPool
from pgqueue.worker.registry import WorkerRegistry
from pgqueue.worker.slots import Slots
from pgqueue.worker.stats import OutcomeReport, WorkerStats
from pgqueue.worker.store import WorkerStore
from pgqueue.worker.unregistered import UnregisteredTasks

log = pgqueue_logger("pgqueue.worker")

# How long the shutdown waits for the completer to write the last outcomes.
COMPLETER_JOIN_TIMEOUT = 30
# How long the shutdown waits for a heartbeat in flight before it deletes the registry row.
HEARTBEAT_JOIN_TIMEOUT = 10


class Worker:
    """Runs jobs from some queues with ``concurrency`` slots. Use ``run()``; ``stop()`` from
    another thread or a signal ends it gracefully.

    ``concurrency``, ``listen``, ``poll_interval``, ``lease_seconds``, ``shutdown_timeout``,
    ``metrics_port``, ``metrics_address``, ``prefetch``, ``pool``, ``max_tasks_per_child`` and
    ``max_memory_per_child`` override the queue's settings of the
    same name (None: the setting; ``Settings.overridden``). ``metrics_port=0`` records metrics
    without serving them (a supervisor's child, or a host app that mounted
    ``pgqueue.metrics.registry()``, which also enables recording)."""

    def __init__(
        self,
        pgq: QueueHost,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        listen: bool | None = None,
        poll_interval: float | None = None,
        lease_seconds: float | None = None,
        shutdown_timeout: float | None = None,
        maintenance: bool = True,
        worker_id: str | None = None,
        install_signal_handlers: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
        metrics_port: int | None = None,
        metrics_address: str | None = None,
        prefetch: int | None = None,
        pool: str | None = None,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
    ) -> None:
        given = WorkerContext.of(pgq)
        settings = given.settings.overridden(
            concurrency=concurrency,
            listen=listen,
            poll_interval=poll_interval,
            lease_seconds=lease_seconds,
            shutdown_timeout=shutdown_timeout,
            metrics_port=metrics_port or None,
            metrics_address=metrics_address,
            prefetch=prefetch,
            pool=pool,
            max_tasks_per_child=max_tasks_per_child,
            max_memory_per_child=max_memory_per_child,
        )
        context = self._context = dataclasses.replace(given, settings=settings)
        self.queues = None if queues is None else [validation.queue_name(q) for q in queues]
        if self.queues is not None and not self.queues:
            raise ValidationError("queues must name at least one queue (or be None for all)")
        self.concurrency = settings.concurrency
        self.prefetch = settings.prefetch
        self.listen = settings.listen and context.can_listen
        self.poll_interval = settings.poll_interval
        self.lease_seconds = settings.lease_seconds
        self.heartbeat_interval = settings.effective_heartbeat_interval
        self.shutdown_timeout = settings.shutdown_timeout
        self.maintenance = maintenance
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.install_signal_handlers = install_signal_handlers
        self.on_outcome = on_outcome
        # A port serves /metrics; 0 records without serving.
        self.metrics_port = 0 if metrics_port == 0 else settings.metrics_port
        self.metrics = metrics.enable() if self.metrics_port else metrics.active()
        self.metrics_address = settings.metrics_address
        self._metrics_server: metrics.MetricsServer | None = None
        self.stats = WorkerStats()
        self._stopping = threading.Event()  # no more claims
        self._halt = threading.Event()  # helper threads end
        self._signals_seen = 0
        self._threads: list[threading.Thread] = []
        self.notifier: Notifier | None = None
        self._wire(context)

    def _wire(self, context: WorkerContext) -> None:
        wake = threading.Event()  # the claim loop's wake-up
        work = WorkQueue()
        self._async_loop = AsyncLoop()
        self.store = WorkerStore(
            context.engine, stopping=self._stopping, tables=JobTables.of(context.settings)
        )
        # The registry row shows the change at once: the heartbeat beats when it happens.
        self.claim_health = ClaimHealth(
            metrics=self.metrics, on_change=lambda: self._heartbeat.nudge()
        )
        self.registry = WorkerRegistry(
            self.store,
            worker_id=self.worker_id,
            queues=self.queues,
            concurrency=self.concurrency,
            stale_seconds=context.settings.worker_stale_seconds,
            claim_health=self.claim_health,
            task_names=context.registry.names,
            pool=context.settings.pool,
        )
        self._slots = Slots(self.concurrency, self.prefetch)
        self.executor = Executor(
            context.registry,
            context.settings,
            context.session_factory,
            self._async_loop.get,
            UnregisteredTasks(context.registry, self.metrics),
            settle_by_handler=self._slots.settle_by_handler,
        )
        self._slots.timed_out = self.executor.timed_out
        report = OutcomeReport(
            self.stats,
            log_successes=context.settings.log_successes,
            log_args=context.settings.log_args,
            on_outcome=self.on_outcome,
            metrics=self.metrics,
            summary_interval=context.settings.log_summary_interval,
        )
        self._completer = Completer(
            store=self.store,
            slots=self._slots,
            report=report,
            unrecorded=self.executor.unrecorded,
            wake=wake,
        )
        atomic = AtomicClaims(
            slots=self._slots,
            executor=self.executor,
            store=self.store,
            report=report,
            session_factory=context.session_factory,
            submit=work.put,
            wake=wake,
            worker_id=self.worker_id,
            queues=self.queues,
            lease_seconds=self.lease_seconds,
        )
        self._claimer = Claimer(
            settings=ClaimSettings(
                worker_id=self.worker_id,
                queues=self.queues,
                lease_seconds=self.lease_seconds,
                poll_interval=self.poll_interval,
                prefetch=self.prefetch,
            ),
            store=self.store,
            slots=self._slots,
            registry=context.registry,
            executor=self.executor,
            stats=self.stats,
            stopping=self._stopping,
            wake=wake,
            submit=work.put_many,
            put_outcome=self._completer.buffer.put,
            atomic=atomic,
            health=self.claim_health,
            metrics=self.metrics,
            deadline_at=lambda deadline: self._heartbeat.deadline_at(deadline),
        )
        self.processes: ProcessPool | None = None
        if context.settings.pool == "process":
            self.processes = ProcessPool(
                setup=ChildSetup(
                    registry=context.registry,
                    make_executor=lambda settle: Executor(
                        context.registry,
                        context.settings,
                        context.session_factory,
                        _no_event_loop,
                        settle_by_handler=settle,
                    ),
                    session_factory=context.session_factory,
                    engines=lambda: [context.engine, _bind_of(context.session_factory)],
                ),
                executor=self.executor,
                settle_by_handler=self._slots.settle_by_handler,
                max_tasks_per_child=context.settings.max_tasks_per_child,
                max_memory_per_child=context.settings.max_memory_per_child,
            )
            self._claimer.run_handler = self.processes.run_leased
            atomic.children = self.processes
        self._dispatcher = Dispatcher(self.concurrency, work, self._claimer.run_leased)
        self._heartbeat = Heartbeat(
            store=self.store,
            slots=self._slots,
            stats=self.stats,
            interval=self.heartbeat_interval,
            halt=self._halt,
            timed_out=self.executor.timed_out,
            put_outcome=self._completer.buffer.put,
            start_replacement=self._dispatcher.start_replacement,
            wake=wake,
            registry=self.registry,
        )
        self._maintenance = Maintenance(
            store=self.store,
            settings=context.settings,
            run_schedules=context.run_schedules,
            stats=self.stats,
            # Maintenance and the listener end when the worker begins to stop: a shutdown
            # waits for running jobs, not for passes against a server that may be down.
            halt=self._stopping,
            metrics=self.metrics,
            registry=self.registry,
        )
        self._gauges = Gauges(
            store=self.store,
            slots=self._slots,
            metrics=self.metrics,
            interval=context.settings.metrics_interval,
            read_figures=self.maintenance,
            halt=self._halt,
            registry=self.registry,
        )
        self._wake = wake

    # -- public ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_timeout`` to finish. Thread-safe."""
        self._stopping.set()
        self._wake.set()

    @property
    def running_job_ids(self) -> list[int]:
        return self._slots.running_ids()

    def run(self, drain: bool = False) -> WorkerStats:
        """Process jobs until ``stop()`` (or, with ``drain``, until nothing is ready)."""
        if self.install_signal_handlers:
            self._install_signal_handlers()
        if self.metrics_port:
            # Before registering: an address or port it cannot have stops the worker unlisted.
            self._metrics_server = metrics.serve(self.metrics_port, self.metrics_address)
            log.info(
                "serving metrics on port %d of %s at /metrics",
                self.metrics_port,
                self.metrics_address,
            )
        try:
            self.registry.register()  # before the first claim: a job's holder is always listed
            self._claimer.prepare(drain)
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
            raise
        # Before any claim (the listener's included): jobs of tasks missing from this registry
        # are counted as task "unknown".
        tasks = self._context.registry
        self.metrics.track_tasks(tasks)
        try:
            self._start_threads()
        except BaseException:
            self.metrics.untrack_tasks(tasks)
            raise
        if self.processes is None:
            _warn_of_soft_timeouts(tasks)
        log.info(
            "worker %s started: queues=%s concurrency=%d pool=%s listen=%s%s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self._context.settings.pool,
            self.listen,
            _successes_note(self._context.settings),
        )
        try:
            self._claimer.run(drain, idle=self._idle)
        finally:
            self._shutdown()
            self.metrics.untrack_tasks(tasks)
            if self._metrics_server is not None:
                self._metrics_server.close()
        self.stats.finished = time.monotonic()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        return self.stats

    # -- threads and shutdown ----------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._slots.busy() and not self._completer.pending()

    def _start_threads(self) -> None:
        if self.processes is not None:
            self.processes.start()  # forked while this process has no thread of the worker's
        threads = self._threads
        threads.extend(self._dispatcher.start())
        threads.append(start_daemon(self._completer.run, "pgqueue-completer"))
        threads.append(start_daemon(self._heartbeat.run, "pgqueue-heartbeat"))
        threads.append(start_daemon(self._heartbeat.run_deadlines, "pgqueue-deadlines"))
        if self.maintenance:
            threads.append(start_daemon(self._maintenance.run, "pgqueue-maintenance"))
        if self.metrics.enabled:
            threads.append(start_daemon(self._gauges.run, "pgqueue-gauges"))
        if self.listen:
            self.notifier = Notifier(
                self._context.listen_connection,
                self.queues,
                self._claimer.on_notify,
                self._stopping,
            )
            self.notifier.start()

    def _shutdown(self) -> None:
        self._stopping.set()
        self._claimer.close()
        self._completer.give_back(self._slots.take_waiting())
        deadline = time.monotonic() + self.shutdown_timeout
        running = self._slots.running_ids()
        if running:
            log.info(
                "waiting up to %.0fs for %s to finish", self.shutdown_timeout, _jobs_named(running)
            )
        while time.monotonic() < deadline and self._slots.busy():
            time.sleep(0.02)
        self._completer.release(self._slots.give_up_unfinished(), self.shutdown_timeout)
        # Handlers still running past their timeout end with the process: their retries may run.
        for timed_out in self._slots.take_timeout_outcomes():
            self._completer.buffer.put(timed_out)
        self._completer.stop()
        for thread in self._threads:
            if thread.name == "pgqueue-completer":
                thread.join(timeout=COMPLETER_JOIN_TIMEOUT)
        self._halt.set()
        self._heartbeat.nudge()
        for thread in self._threads:
            if thread.name == "pgqueue-heartbeat":
                # Its last refresh must not write the row back after it is deleted.
                thread.join(timeout=HEARTBEAT_JOIN_TIMEOUT)
        self.registry.unregister()
        self._dispatcher.stop()
        self._async_loop.stop()
        if self.processes is not None:
            self.processes.close()

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals_seen += 1
            if self._signals_seen > 1:
                left = self._slots.running_ids_from_a_signal()
                if left:
                    log.warning(
                        "second signal: exiting now; %s left to %s: another worker takes "
                        "each back once its lease expires (within %.0fs)",
                        _jobs_named(left),
                        "their leases" if len(left) > 1 else "its lease",
                        self.lease_seconds,
                    )
                else:
                    log.warning("second signal: exiting now")
                os._exit(1)
            log.info(
                "signal %d: stopping; running jobs get %.0fs to finish (a second signal exits "
                "at once, leaving them to their leases)",
                signum,
                self.shutdown_timeout,
            )
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)


# Job ids a shutdown line names at most; the rest are counted.
NAMED_AT_MOST = 10


def _jobs_named(ids: list[int]) -> str:
    """``job 7`` or ``3 jobs (7, 9, 12)``, at most ``NAMED_AT_MOST`` ids and a count of the rest."""
    ids = sorted(ids)
    if len(ids) == 1:
        return f"job {ids[0]}"
    shown = ", ".join(str(i) for i in ids[:NAMED_AT_MOST])
    more = f" and {len(ids) - NAMED_AT_MOST} more" if len(ids) > NAMED_AT_MOST else ""
    return f"{len(ids)} jobs ({shown}{more})"


def _successes_note(settings: config.Settings) -> str:
    """What the start line says of successes when they are not logged one by one: a newcomer
    watching the first jobs run would otherwise see no line for a job that succeeded."""
    if settings.log_successes:
        return ""
    counted = (
        f"counted in one line every {settings.log_summary_interval:g}s"
        if settings.log_summary_interval
        else "logged at DEBUG"
    )
    return f"; successes are {counted} (PGQUEUE_LOG_SUCCESSES=true logs each)"


def _no_event_loop() -> asyncio.AbstractEventLoop:
    raise RuntimeError("async handlers run on the worker's event loop, never in a child process")


def _bind_of(session_factory: Callable[[], Session]) -> Engine:
    """The engine behind the handlers' sessions (a child drops its inherited connections)."""
    session = session_factory()
    try:
        bind = session.get_bind()
    finally:
        session.close()
    assert isinstance(bind, Engine)
    return bind


def _warn_of_soft_timeouts(tasks: TaskRegistry) -> None:
    """Say once that the thread pool does not raise ``soft_timeout`` (only children can be
    interrupted that way)."""
    soft = sorted(task.name for task in tasks if task.soft_timeout is not None)
    if soft:
        log.warning(
            "task%s %s ha%s a soft_timeout, which only the process pool raises (--pool "
            "process); in this worker's threads they run until their timeout",
            "s" if len(soft) > 1 else "",
            ", ".join(soft),
            "ve" if len(soft) > 1 else "s",
        )
