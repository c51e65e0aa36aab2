"""The process pool (``pool="process"``): sync handlers run in child processes.

Each pool thread of the worker owns one child and hands it its attempts one at a time; the
heartbeat, the leases, the claims and the fenced outcome writes of leased jobs stay in the
worker, so a child does nothing but run handlers (its ``ctx.session``, steps, sleeps, signals
and progress work as in a thread, through its own connections), and an atomic job's whole
transaction (``atomic.run_transaction``: the row lock, the handler, the outcome), which asks the
worker before it commits whether its deadline passed. What a child buys over a thread:

- a hard ``timeout=``: at the deadline the heartbeat stops the child (SIGTERM, SIGKILL after
  ``KILL_GRACE_SECONDS``); the attempt fails with an error naming the signal, once the child is
  gone, so nothing the handler does after the deadline can happen; ``soft_timeout=`` raises
  ``SoftTimeout`` inside the handler first, so it can clean up;
- containment: a child that dies (a segfault, ``os._exit``, the kernel's OOM killer) fails only
  its attempt, with the exit code or signal named, and the slot gets a new child; a worker that
  dies takes its children with it (``worker.fork_server``), so no handler runs on once the
  worker's lease on its job is gone;
- recycling: a child is replaced between attempts once it ran ``max_tasks_per_child`` of them
  or its resident memory reached ``max_memory_per_child`` MB (the attempt that crossed the line
  finishes normally).

Children come from a fork server (``worker.fork_server``) forked when the worker starts, before
its threads do: the app is imported once, and every child is forked from a process with one
thread. What a child does is ``worker.child``'s. Async handlers stay on the worker's event
loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Final

from pgqueue.errors import pgqueue_logger
from pgqueue.jobs import ClaimedJob, Outcome, Progress
from pgqueue.states import OutcomeKind
from pgqueue.worker.atomic import AtomicRun
from pgqueue.worker.child import ChildSetup, child_main
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import CANCELLED_WHILE_RUNNING, Executor
from pgqueue.worker.fork_server import ForkServer, exit_description

log = pgqueue_logger("pgqueue.worker")

# How long a child stopped at its timeout gets between SIGTERM and SIGKILL.
KILL_GRACE_SECONDS: Final = 2.0
# How often a pool thread waiting on its child looks for a cancel request to pass on.
CANCEL_LOOK_INTERVAL: Final = 0.2


class _Child:
    """The worker's handle on one child: its pid, its connection, how much it ran."""

    def __init__(self, pid: int, connection: Connection) -> None:
        self.pid = pid
        self.connection = connection
        self.attempts = 0
        self.megabytes = 0.0
        self.busy = False


class ProcessPool:
    """The worker's side of the pool: each pool thread runs its attempts of sync leased tasks
    through its own child (``run_leased``); the rest run as in the thread pool."""

    def __init__(
        self,
        *,
        setup: ChildSetup,
        executor: Executor,
        settle_by_handler: Callable[[Execution], bool],
        max_tasks_per_child: int | None,
        max_memory_per_child: float | None,
    ) -> None:
        self._setup = setup
        self._executor = executor
        self._settle_by_handler = settle_by_handler
        self._max_tasks = max_tasks_per_child
        self._max_megabytes = max_memory_per_child
        self._server: ForkServer | None = None
        self._local = threading.local()
        self._children: set[_Child] = set()
        self._lock = threading.Lock()
        self.children_started = 0
        # How the last child that ended while running an attempt ended (per pool thread).
        self._ended = threading.local()

    def start(self) -> None:
        """Fork the fork server: call before the worker's threads start."""
        setup = self._setup
        measure = self._max_megabytes is not None
        self._server = ForkServer(lambda end: child_main(setup, end, measure))

    def close(self) -> None:
        """Stop every child (one still running an attempt has had its job released or its
        outcome written) and the fork server."""
        with self._lock:
            children = list(self._children)
            self._children.clear()
        for child in children:
            _stop(child, signal.SIGKILL if child.busy else None)
        if self._server is not None:
            self._server.close()
            self._server = None

    def runs_in_child(self, task_name: str) -> bool:
        task = self._setup.registry.find(task_name)
        return task is not None and not task.is_async and self._server is not None

    def run_atomic(
        self,
        job: ClaimedJob,
        on_locked: Callable[[int], None],
        may_commit: Callable[[], bool],
        on_start: Callable[[Callable[[], None]], None],
    ) -> AtomicRun | None:
        """Run atomic ``job``'s transaction in this thread's child (``atomic.run_transaction``
        there): ``on_locked`` hears its server process id, ``may_commit`` answers whether it may
        commit; ``on_start`` gets what stops the child. None: the child ended first."""
        child = self._child()
        task = self._setup.registry.find(job.task_name)
        on_start(lambda: _stop(child, signal.SIGKILL))
        child.busy = True
        try:
            done = self._serve(
                child,
                ("atomic", job, None if task is None else task.soft_timeout),
                on_progress=lambda progress: None,
                on_settle=may_commit,
                on_locked=on_locked,
                cancelled=lambda: False,
            )
        finally:
            child.busy = False
        if not isinstance(done, AtomicRun):
            self._forget(child)
            return None
        self._after_attempt(child)
        return done

    def ended(self, job: ClaimedJob) -> tuple[Outcome, str]:
        """The failed attempt of atomic ``job``, whose child ended while running it."""
        status = self._ended.status
        error = f"ChildProcessDied: the process running the handler {status}"
        log.error("job %d (%s): %s", job.id, job.task_name, error)
        return self._executor.failed_attempt(job, error), error

    def run_leased(self, execution: Execution) -> Outcome:
        """Run ``execution`` in this thread's child when its task is a sync one this worker
        knows and it may start; else as the thread pool does (its executor decides)."""
        task = self._setup.registry.find(execution.job.task_name)
        if (
            task is None
            or task.is_async
            or execution.cancelled
            or execution.past_start_by()
            or self._server is None
        ):
            return self._executor.run_leased(execution)
        child = self._child()
        server_pid = self._server.pid
        execution.stop_process = lambda: _stop(
            child, signal.SIGTERM, KILL_GRACE_SECONDS, server_pid
        )
        if execution.timed_out:
            # Its deadline passed before its thread got to it: the timeout's outcome is kept
            # (``Slots.take_overdue``), and this one is dropped.
            return Outcome.release(execution.job)
        child.busy = True
        try:
            done = self._serve(
                child,
                ("job", execution.job, task.soft_timeout),
                on_progress=execution.report_progress,
                on_settle=lambda: self._settle_by_handler(execution),
                on_locked=lambda pid: None,
                cancelled=lambda: execution.cancelled,
            )
        finally:
            child.busy = False
        outcome = done if isinstance(done, Outcome) else None
        if outcome is None or execution.timed_out:
            # Ended, or returned as its timeout stopped it: either way the child goes, and the
            # attempt is the timeout's (or the crash's) failure, written once it is gone.
            self._forget(child)
            if outcome is not None:
                _stop(child, signal.SIGKILL)
                self._ended.status = self._how_it_ended(child)
            return self._ended_with(execution)
        self._after_attempt(child)
        if execution.cancelled and outcome.kind is not OutcomeKind.RELEASE:
            # As in a thread: a cancel seen while the handler ran decides its outcome, whether
            # or not the child's handler heard of it in time.
            return Outcome.cancelled(execution.job, CANCELLED_WHILE_RUNNING)
        return outcome

    def _after_attempt(self, child: _Child) -> None:
        """Count an attempt the child finished, and retire the child once worn out."""
        child.attempts += 1
        if self._worn_out(child):
            self._forget(child)
            _stop(child, None)

    def _child(self) -> _Child:
        """This thread's child, alive as far as can be told: one that ended while idle (killed
        by someone, the OOM killer) is replaced before it is given an attempt it cannot run."""
        child: _Child | None = getattr(self._local, "child", None)
        if child is not None and _ended_while_idle(child):
            self._forget(child)
            child.connection.close()
            child = None
        if child is None:
            assert self._server is not None
            pid, connection = self._server.fork()
            child = self._local.child = _Child(pid, connection)
            with self._lock:
                self._children.add(child)
                self.children_started += 1
        return child

    def _forget(self, child: _Child) -> None:
        self._local.child = None
        with self._lock:
            self._children.discard(child)

    def _worn_out(self, child: _Child) -> bool:
        if self._max_tasks is not None and child.attempts >= self._max_tasks:
            return True
        return self._max_megabytes is not None and child.megabytes >= self._max_megabytes

    def _serve(
        self,
        child: _Child,
        request: tuple[Any, ...],
        *,
        on_progress: Callable[[Progress], None],
        on_settle: Callable[[], bool],
        on_locked: Callable[[int], None],
        cancelled: Callable[[], bool],
    ) -> Outcome | AtomicRun | None:
        """Send ``request`` and serve the child's messages until its answer (None: the child
        ended first; the fork server's word on how is kept for ``ended``)."""
        connection = child.connection
        cancel_sent = False
        try:
            connection.send(request)
            while True:
                if not connection.poll(CANCEL_LOOK_INTERVAL):
                    if not cancel_sent and cancelled():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(child.pid, signal.SIGUSR1)
                        cancel_sent = True
                    continue
                message = connection.recv()
                kind = message[0]
                if kind == "done":
                    child.megabytes = message[2]
                    answer: Outcome | AtomicRun = message[1]
                    return answer
                if kind == "progress":
                    on_progress(message[1])
                elif kind == "settle":
                    connection.send(("settled", on_settle()))
                elif kind == "locked":
                    on_locked(message[1])
        except (EOFError, OSError):
            self._ended.status = self._how_it_ended(child)
            return None

    def _how_it_ended(self, child: _Child) -> str:
        assert self._server is not None
        status = self._server.exit_status(child.pid)
        return "ended" if status is None else exit_description(status)

    def _ended_with(self, execution: Execution) -> Outcome:
        """The failed attempt of a child that ended while running it: stopped at its timeout,
        or died (a crash, ``os._exit``, the OOM killer)."""
        how = self._ended.status
        job = execution.job
        if execution.cancelled:
            return Outcome.cancelled(job, CANCELLED_WHILE_RUNNING)
        if execution.timed_out:
            error = (
                f"JobTimeout: still running after the task's timeout of {execution.timeout}s; "
                f"its process was stopped ({how})"
            )
        else:
            error = f"ChildProcessDied: the process running the handler {how}"
            log.error("job %d (%s): %s", job.id, job.task_name, error)
        return self._executor.failed_attempt(job, error)


def _ended_while_idle(child: _Child) -> bool:
    """Whether an idle child's end of its socket closed (an idle child sends nothing)."""
    try:
        return child.connection.poll(0)
    except (EOFError, OSError):
        return True


def _stop(
    child: _Child, first: signal.Signals | None, grace: float = 0.0, server_pid: int = 0
) -> None:
    """End ``child``: ask it to exit (``first`` None), or send ``first`` and, when ``grace`` is
    given, SIGKILL if it still lives that much later."""
    if first is None:
        with contextlib.suppress(OSError, ValueError):
            child.connection.send(("exit",))
        child.connection.close()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, first)
    if grace > 0:
        timer = threading.Timer(grace, _kill_if_alive, (child.pid, server_pid))
        timer.daemon = True
        timer.start()


def _kill_if_alive(pid: int, server_pid: int) -> None:
    """SIGKILL ``pid`` if it is still a child of the fork server (not a process that reused
    the pid of one that ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return
    if parent == server_pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
