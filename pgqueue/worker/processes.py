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
  its attempt, with the exit code or signal named, and the slot gets a new child;
- recycling: a child is replaced between attempts once it ran ``max_tasks_per_child`` of them
  or its resident memory reached ``max_memory_per_child`` MB (the attempt that crossed the line
  finishes normally).

Children come from a fork server forked when the worker starts, before its threads do: the
app is imported once, and every child is forked from a process with one thread, so no lock
another thread held at the fork can be found taken in a child. A child drops the connection
pools it inherited (``Engine.dispose(close=False)``, as SQLAlchemy documents for forks) and
opens its own. Async handlers stay on the worker's event loop.
"""

from __future__ import annotations

import contextlib
import os
import queue
import resource
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from pgqueue.context import SoftTimeout
from pgqueue.errors import pgqueue_logger
from pgqueue.jobs import ClaimedJob, Outcome, Progress
from pgqueue.tasks import TaskRegistry
from pgqueue.worker.atomic import AtomicRun, run_transaction
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import CANCELLED_WHILE_RUNNING, Executor

log = pgqueue_logger("pgqueue.worker")

# How long a child stopped at its timeout gets between SIGTERM and SIGKILL.
KILL_GRACE_SECONDS: Final = 2.0
# How long the pool thread waits for the fork server's word on how a dead child ended.
EXIT_STATUS_WAIT: Final = 5.0
# How many ended children's wait statuses the fork server's reader keeps.
STATUSES_KEPT: Final = 1000
# How often a pool thread waiting on its child looks for a cancel request to pass on.
CANCEL_LOOK_INTERVAL: Final = 0.2

# The fork server's messages: a kind byte and two integers (the child's pid and, for an exit,
# its wait status); a fork's reply carries the parent's end of the child's socket.
_MESSAGE = struct.Struct("=cii")
_FORKED, _EXITED, _FORK = b"F", b"X", b"f"


def exit_description(status: int) -> str:
    """How a child ended, from its wait status: ``killed by signal SIGSEGV (11)`` or
    ``exited with code 3``."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by signal {name} ({number})"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status}"


def resident_megabytes() -> float:
    """This process's resident memory in MB (``/proc``; else its peak, from ``getrusage``)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1_048_576
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ForkServer:
    """A process forked from the worker before its threads start, which forks the pool's
    children on request and reports how each one ended (it is their parent)."""

    def __init__(self, child_main: Callable[[socket.socket], None]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the fork server
            ours.close()
            code = 0
            try:
                _serve_forks(theirs, child_main)
            except BaseException:
                code = 1
            os._exit(code)
        theirs.close()
        self.pid = pid
        self._socket = ours
        self._lock = threading.Lock()  # one fork request at a time
        self._replies: queue.Queue[tuple[int, socket.socket] | None] = queue.Queue()
        self._ended = threading.Condition()
        # Wait statuses of ended children until asked for; those of children retired between
        # attempts are never asked for, so only the latest ``STATUSES_KEPT`` are kept.
        self._statuses: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="pgqueue-forks", daemon=True)
        self._reader.start()

    def fork(self) -> tuple[int, Connection]:
        """A new child: its pid and the connection to it."""
        with self._lock:
            self._socket.send(_MESSAGE.pack(_FORK, 0, 0))
            reply = self._replies.get()
        if reply is None:
            raise RuntimeError("the process pool's fork server is gone")
        pid, end = reply
        return pid, Connection(end.detach())

    def exit_status(self, pid: int, timeout: float = EXIT_STATUS_WAIT) -> int | None:
        """The wait status of child ``pid`` once it ended (None: not known within ``timeout``)."""
        with self._ended:
            self._ended.wait_for(lambda: pid in self._statuses, timeout)
            return self._statuses.pop(pid, None)

    def close(self) -> None:
        """End the fork server (its children see their worker's end of their socket close)."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _read(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self._socket, _MESSAGE.size, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                self._replies.put(None)
                with self._ended:
                    self._ended.notify_all()
                return
            kind, pid, status = _MESSAGE.unpack(message)
            if kind == _FORKED:
                self._replies.put((pid, socket.socket(fileno=fds[0])))
            else:
                with self._ended:
                    self._statuses[pid] = status
                    if len(self._statuses) > STATUSES_KEPT:
                        del self._statuses[next(iter(self._statuses))]
                    self._ended.notify_all()


def _serve_forks(control: socket.socket, child_main: Callable[[socket.socket], None]) -> None:
    """The fork server's loop: fork a child per request, report each child's end; return when
    the worker closes its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when the pool ends
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        readable, _, _ = select.select([control], [], [], 0.1)
        _report_ended_children(control)
        if not readable:
            continue
        try:
            request = control.recv(_MESSAGE.size)
        except OSError:
            return
        if not request:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # a child
            control.close()
            ours.close()
            code = 0
            try:
                child_main(theirs)
            except BaseException:
                code = 1
            os._exit(code)
        theirs.close()
        socket.send_fds(control, [_MESSAGE.pack(_FORKED, pid, 0)], [ours.fileno()])
        ours.close()


def _report_ended_children(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            control.send(_MESSAGE.pack(_EXITED, pid, status))


# -- the child's side ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildSetup:
    """What a child needs to run handlers: the worker's registry, settings and sessions, and
    the engines whose inherited connections it must drop."""

    registry: TaskRegistry
    make_executor: Callable[[Callable[[Execution], bool]], Executor]
    session_factory: Callable[[], Session]
    engines: Callable[[], list[Engine]]


class _ChildLink:
    """The child's end of its connection. Only the child's main thread reads it (an attempt,
    then the answer to its own question, if any); a cancel request comes as SIGUSR1, which
    sets the running attempt's event between two bytecodes; sends are serialized (a handler
    may report progress from threads of its own)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.cancel = threading.Event()
        self._send_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self.connection.send(message)

    def next_job(self) -> tuple[str, ClaimedJob, float | None] | None:
        """The next attempt to run: ``("job" | "atomic", job, soft timeout)`` (None: exit)."""
        try:
            message = self.connection.recv()
        except (EOFError, OSError):
            return None  # the worker is gone: so is this child's purpose
        if message[0] not in ("job", "atomic"):
            return None
        return message[0], message[1], message[2]

    def ask_settled(self) -> bool:
        self.send(("settle",))
        try:
            answer: bool = self.connection.recv()[1]
        except (EOFError, OSError):
            return False
        return answer


class _ChildExecution(Execution):
    """A child's view of an attempt: progress goes to the worker as it is reported."""

    __slots__ = ("link",)

    def __init__(self, job: ClaimedJob, link: _ChildLink) -> None:
        super().__init__(job, 0.0, None, time.monotonic(), _event=link.cancel)
        self.link = link

    def report_progress(self, progress: Progress) -> None:
        super().report_progress(progress)
        self.link.send(("progress", progress))


def _raise_soft_timeout(signum: int, frame: FrameType | None) -> None:
    raise SoftTimeout("the task's soft_timeout passed")


def child_main(setup: ChildSetup, end: socket.socket, measure_memory: bool) -> None:
    """A child's life: run each attempt the worker sends, answer with its outcome (and this
    process's resident memory when a cap applies); end when told, or when the worker's end
    closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the worker decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, _raise_soft_timeout)
    for engine in setup.engines():
        engine.dispose(close=False)  # the worker's connections are the worker's
    link = _ChildLink(Connection(end.detach()))
    signal.signal(signal.SIGUSR1, lambda signum, frame: link.cancel.set())
    executor = setup.make_executor(lambda execution: link.ask_settled())
    while (item := link.next_job()) is not None:
        kind, job, soft_timeout = item
        link.cancel.clear()
        if soft_timeout is not None:
            signal.setitimer(signal.ITIMER_REAL, soft_timeout)
        try:
            if kind == "atomic":
                done: Outcome | AtomicRun = run_transaction(
                    setup.session_factory(),
                    executor,
                    job,
                    lambda pid: link.send(("locked", pid)),
                    link.ask_settled,
                )
            else:
                done = executor.run_leased(_ChildExecution(job, link))
        finally:
            if soft_timeout is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
        link.send(("done", done, resident_megabytes() if measure_memory else 0.0))


# -- the worker's side -----------------------------------------------------------------------


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
        return outcome

    def _after_attempt(self, child: _Child) -> None:
        """Count an attempt the child finished, and retire the child once worn out."""
        child.attempts += 1
        if self._worn_out(child):
            self._forget(child)
            _stop(child, None)

    def _child(self) -> _Child:
        child: _Child | None = getattr(self._local, "child", None)
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
