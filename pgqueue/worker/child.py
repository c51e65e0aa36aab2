"""A process-pool child's side: what it does between its fork and its end.

It drops the connection pools it inherited (``Engine.dispose(close=False)``, as SQLAlchemy
documents for forks) and runs each attempt the worker sends over its socket: a leased one
through its own ``Executor`` (progress reported goes to the worker as it comes; before a
returned handler's ``ctx.session`` commits it asks the worker whether the attempt's timeout
passed), or an atomic one's whole transaction (``atomic.run_transaction``, asking the same
before its commit). It answers with the outcome and, when a memory cap applies, its resident
memory. A cancel request comes as SIGUSR1, a ``soft_timeout`` as SIGALRM raising
``SoftTimeout`` in the handler; SIGINT is ignored (Ctrl-C reaches the whole process group: the
worker decides) and SIGTERM ends it at once.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from pgqueue.context import SoftTimeout
from pgqueue.jobs import ClaimedJob, Outcome, Progress
from pgqueue.tasks import TaskRegistry
from pgqueue.worker.atomic import AtomicRun, run_transaction
from pgqueue.worker.execution import Execution
from pgqueue.worker.executor import Executor


def resident_megabytes() -> float:
    """This process's resident memory in MB (``/proc``; else its peak, from ``getrusage``)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1_048_576
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
