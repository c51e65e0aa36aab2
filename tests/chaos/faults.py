"""Seeded faults during a chaos run.

Every second or two (from its own ``random.Random``) the injector does one of: SIGKILL a worker
process (a standalone worker is restarted by the harness, a supervisor's child by its
supervisor, a killed supervisor's children stop on their own and the supervisor is restarted;
half the time it kills one of a process pool's children instead of its worker);
SIGSTOP a worker process for longer than the lease, then SIGCONT it; ``pg_terminate_backend``
some of pgqueue's backends; hold ``FOR UPDATE`` locks on some waiting jobs (with
``lock_tickets``, sometimes on their tickets too) for a few seconds;
restart the PostgreSQL server (fast: every open transaction aborted, every connection closed),
when the run has a server it may restart; and, with a PgBouncer in the path, restart it. Each
fault is an :class:`Event` the checks use to explain (and the traces to show) what a job went
through.

Beside those, on a schedule of its own (its own ``random.Random``, so the faults above keep
their sequence for a seed), a long transaction holds the limited queue's control row or a
concurrency key's row, as an operator's ``SELECT ... FOR UPDATE`` would, for 2 to 12 s, sometimes
past the workers' statement timeout. It takes the row while a leased job of that queue
or key runs (waiting up to a few seconds for one), so an outcome meets the held row. The
outcomes of that queue or key wait for it; no other queue's may, and none may turn into a
failed attempt.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, text

from .app import QUEUE_LIMITED
from .cluster import LEASE_SECONDS, Bouncer, Worker, Workers, descendants_of
from .workload import KEYS, Event

TERMINATE = text(
    "SELECT pg_terminate_backend(pid) FROM ("
    "  SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    "  AND application_name LIKE 'pgqueue%' AND pid <> pg_backend_pid()"
    "  ORDER BY random() LIMIT :n) chosen"
)
# Waiting jobs locked the way a long application transaction could lock them. SKIP LOCKED:
# the locker never waits, so it cannot deadlock with a claim that updates several jobs in an
# order of its own (a deadlock the harness made would hide pgqueue's).
LOCK_JOBS = text(
    "SELECT id FROM pgqueue_jobs WHERE state IN ('queued', 'retrying')"
    " ORDER BY random() LIMIT :n FOR UPDATE SKIP LOCKED"
)
# Their tickets too (``--lock-tickets``), taken first, in pgqueue's own order (tickets, then
# jobs). Off by default: no pgqueue statement expects another session to hold a ticket without
# claiming or ending its job.
LOCK_TICKETS = text(
    "SELECT t.job_id FROM pgqueue_message_queue t JOIN pgqueue_jobs j ON j.id = t.job_id"
    " WHERE j.state IN ('queued', 'retrying') ORDER BY random() LIMIT :n"
    " FOR UPDATE OF t SKIP LOCKED"
)
LOCK_CONTROL_ROW = text("SELECT name FROM pgqueue_queues WHERE name = :name FOR UPDATE")
LOCK_KEY_ROW = text("SELECT key FROM pgqueue_concurrency_keys WHERE key = :name FOR UPDATE")
# The same rows, taken only while a leased job of that queue or key runs: its outcome, written
# as it ends, must wait for the row (the outcomes of a queue or key nobody runs have nothing to
# wait for).
LOCK_BUSY_CONTROL_ROW = text(
    "SELECT name FROM pgqueue_queues WHERE name = :name AND EXISTS (SELECT 1 FROM pgqueue_jobs"
    " WHERE queue = :name AND state = 'running' AND NOT atomic) FOR UPDATE"
)
LOCK_BUSY_KEY_ROW = text(
    "SELECT key FROM pgqueue_concurrency_keys WHERE key = :name AND EXISTS (SELECT 1 FROM"
    " pgqueue_jobs WHERE concurrency_key = :name AND state = 'running' AND NOT atomic)"
    " FOR UPDATE"
)
# How long a held control or key row stays held (seconds): up to past the statement timeout.
CONTROL_HOLD = (2.0, 12.0)
# How long a hold waits for a running job of its queue or key before it takes the row anyway.
BUSY_WAIT = 3.0
# Seconds between two holds of a control or key row.
CONTROL_EVERY = (8.0, 20.0)
LOCK_THESE_JOBS = text(
    "SELECT id FROM pgqueue_jobs WHERE id = ANY(:ids) ORDER BY id FOR UPDATE SKIP LOCKED"
)


@dataclass
class Faults:
    """Injects faults until stopped; keeps the events and the PIDs it killed (with when)."""

    seed: int
    workers: Workers
    engine: Engine  # direct to the server, application name not ``pgqueue%``
    bouncer: Bouncer | None = None
    lock_tickets: bool = False
    restart_server: Callable[[], None] | None = None
    speed: float = 1.0
    events: list[Event] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    killed: dict[int, float] = field(default_factory=dict)  # pid -> when it was killed
    stop_event: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}-faults")
        self.control_rng = random.Random(f"{self.seed}-control-rows")
        self.stopped: set[int] = set()  # SIGSTOPped, not yet continued
        self.restarting: set[str] = set()  # killed workers whose restart is pending
        self.pending: list[tuple[float, str, Callable[[], None]]] = []
        self.lockers: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._loop, name="chaos-faults", daemon=True)
        self.lock = threading.Lock()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop injecting; run every pending repair (SIGCONT, restarts) at once."""
        self.stop_event.set()
        self.thread.join(60)
        for _, _, action in sorted(self.pending, key=lambda p: p[0]):
            action()
        self.pending.clear()
        for locker in self.lockers:
            locker.join(30)
        if self.bouncer is not None and self.bouncer.process is None:
            self.bouncer.start()

    def _record(self, kind: str, detail: str, pid: int | None = None, **kw: float) -> None:
        with self.lock:
            self.counts[kind] += 1
            self.events.append(Event(time.time(), kind, detail, pid, kw.get("until")))

    def _loop(self) -> None:
        choices: list[tuple[float, Callable[[], None]]] = [
            (3, self._kill),
            (3, self._stop),
            (3, self._terminate),
            (2, self._lock),
        ]
        if self.bouncer is not None:
            choices.append((1.5, self._restart_bouncer))
        if self.restart_server is not None:
            choices.append((0.6, self._restart_server))
        weights = [w for w, _ in choices]
        actions = [a for _, a in choices]
        next_fault = time.monotonic() + self.rng.uniform(1, 3) / self.speed
        next_control = time.monotonic() + self.control_rng.uniform(*CONTROL_EVERY) / self.speed
        while not self.stop_event.is_set():
            now = time.monotonic()
            if now >= next_control:
                self._lock_control_row()
                next_control = now + self.control_rng.uniform(*CONTROL_EVERY) / self.speed
            for due, _, action in [p for p in self.pending if p[0] <= now]:
                self.pending.remove((due, _, action))
                action()
            self.workers.handler_pids()  # learn the children's PIDs while they live
            if now >= next_fault:
                fault = self.rng.choices(actions, weights)[0]
                try:
                    fault()
                except Exception as exc:
                    self.errors[f"{fault.__name__}: {type(exc).__name__}: {exc}"[:120]] += 1
                next_fault = now + self.rng.uniform(0.7, 3.0) / self.speed
            self.stop_event.wait(0.05)

    def _later(self, delay: float, what: str, action: Callable[[], None]) -> None:
        self.pending.append((time.monotonic() + delay, what, action))

    # -- process faults ------------------------------------------------------------------

    def _kill(self) -> None:
        worker = self.rng.choice([w for w in self.workers.workers if w.alive])
        if worker.popen is None:
            return
        if worker.spec.processes > 1 and self.rng.random() < 0.8:
            pids = [p for p in worker.pids() if p not in self.stopped]
            if not pids:
                return
            pid = self.rng.choice(pids)
            os.kill(pid, signal.SIGKILL)
            self.killed[pid] = time.time()
            self._record("sigkill", f"{worker.spec.name} child {pid}", pid)
            return
        if worker.spec.pool == "process" and self.rng.random() < 0.5:
            # One of its pool's children, as the kernel's OOM killer would: only its attempt
            # fails, the worker forks another.
            pids = [p for p in worker.pool_children() if p not in self.stopped]
            if pids:
                pid = self.rng.choice(pids)
                os.kill(pid, signal.SIGKILL)
                self.killed[pid] = time.time()
                self._record("sigkill", f"{worker.spec.name} pool child {pid}", pid)
                return
        pid = worker.popen.pid
        # A process pool's fork server and children too: they end with their worker.
        children = descendants_of(pid)
        # Before the kill: the harness's loop restarts a worker that died unless it is here.
        self.restarting.add(worker.spec.name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        worker.popen.wait(10)
        now = time.time()
        self.killed[pid] = now
        for child in children:
            # A killed supervisor's children stop on their own (releasing their jobs): their
            # runs are interrupted too. One that was stopped must run again to notice.
            self.killed[child] = now
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
            self.stopped.discard(child)
        self.stopped.discard(pid)
        self._record("sigkill", f"{worker.spec.name} {pid} (children {children})", pid)
        self._later(self.rng.uniform(0.3, 2.0), "restart", lambda: self._restart(worker))

    def _restart(self, worker: Worker) -> None:
        # Started before it leaves ``restarting``: the harness's loop, seeing it dead and not
        # there, would start a second process in between.
        if not worker.alive:
            self.workers.start(worker)
            self._record("restart", worker.spec.name, worker.popen.pid if worker.popen else None)
        self.restarting.discard(worker.spec.name)

    def _stop(self) -> None:
        pids = [p for p in self.workers.handler_pids() if p not in self.stopped]
        if not pids:
            return
        pid = self.rng.choice(pids)
        seconds = LEASE_SECONDS + self.rng.uniform(1, 3)
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        self._record("sigstop", f"pid {pid} for {seconds:.1f} s", pid, until=time.time() + seconds)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)

        self._later(seconds, "sigcont", resume)

    # -- database faults -----------------------------------------------------------------

    def _terminate(self) -> None:
        n = 100 if self.rng.random() < 0.2 else self.rng.randint(1, 4)
        with self.engine.connect() as connection:
            done = connection.execute(TERMINATE, {"n": n}).all()
            connection.commit()
        self._record("terminate", f"{len(done)} pgqueue backends (asked for {n})")

    def _lock(self) -> None:
        n = self.rng.randint(1, 10)
        seconds = self.rng.uniform(2, 5)
        tickets = self.lock_tickets and self.rng.random() < 0.5
        what = "jobs and their tickets" if tickets else "jobs"
        self._record("lock", f"{n} waiting {what} for {seconds:.1f} s", until=time.time() + seconds)

        def lock(connection: Connection) -> None:
            if tickets:
                ids = list(connection.execute(LOCK_TICKETS, {"n": n}).scalars())
                connection.execute(LOCK_THESE_JOBS, {"ids": ids})
            else:
                connection.execute(LOCK_JOBS, {"n": n}).all()

        self._hold("lock", lock, seconds)

    def _lock_control_row(self) -> None:
        rng = self.control_rng
        if rng.random() < 0.5:
            statements, name, what = (
                (LOCK_BUSY_CONTROL_ROW, LOCK_CONTROL_ROW),
                QUEUE_LIMITED,
                "queue",
            )
        else:
            statements, name, what = (LOCK_BUSY_KEY_ROW, LOCK_KEY_ROW), rng.choice(KEYS), "key"
        seconds = rng.uniform(*CONTROL_HOLD)
        busy, any_time = statements

        def lock(connection: Connection) -> None:
            # Taken when a job of the queue or key runs (its outcome then meets the held
            # row), else after BUSY_WAIT anyway; recorded once held, until the hold ends.
            deadline = time.monotonic() + BUSY_WAIT
            while not connection.execute(busy, {"name": name}).first():
                if time.monotonic() > deadline or self.stop_event.is_set():
                    connection.execute(any_time, {"name": name})
                    break
                time.sleep(0.05)
            self._record(
                "lock_control",
                f"{what} {name}'s row for {seconds:.1f} s",
                until=time.time() + seconds,
            )

        self._hold("lock_control", lock, seconds)

    def _hold(self, kind: str, lock: Callable[[Connection], object], seconds: float) -> None:
        """In a thread of its own, take row locks with ``lock`` in a transaction and keep them
        ``seconds``, as a long application transaction would; a failure is counted under
        ``kind``."""

        def hold() -> None:
            try:
                with self.engine.begin() as connection:
                    lock(connection)
                    time.sleep(seconds)
            except Exception as exc:
                self.errors[f"{kind}: {type(exc).__name__}"] += 1

        locker = threading.Thread(target=hold, name=f"chaos-{kind}", daemon=True)
        self.lockers = [t for t in self.lockers if t.is_alive()] + [locker]
        locker.start()

    def _restart_bouncer(self) -> None:
        assert self.bouncer is not None
        if self.bouncer.process is None:
            return
        self.bouncer.stop()
        down = self.rng.uniform(0.2, 1.5)
        self._record("bouncer_restart", f"down for {down:.1f} s", until=time.time() + down)
        self._later(down, "bouncer start", self.bouncer.start)

    def _restart_server(self) -> None:
        assert self.restart_server is not None
        began = time.time()
        self.restart_server()
        ended = time.time()
        with self.lock:
            self.counts["server_restart"] += 1
            self.events.append(
                Event(began, "server_restart", f"down {ended - began:.1f} s", until=ended)
            )
