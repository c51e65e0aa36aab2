"""The process pool's fork server: a process forked from the worker before its threads start,
which forks the pool's children on request and reports how each one ended (it is their
parent).

Forked while the worker still has one thread, it has one thread too, and so has every child it
forks: no lock another thread held at a fork can be found taken in a child. The worker asks
for a child over a Unix socket (``SOCK_SEQPACKET``: one message a request) and gets back its
pid and, as an attached file descriptor, the worker's end of a socket pair whose other end the
child holds; the server reaps each child that ends and sends its wait status.

The children end with their worker, however it ends: the server ends when the worker's end of
its socket closes (a worker killed or stopping) and kills the children still alive as it
goes, and the kernel kills each child whose server ended (``PR_SET_PDEATHSIG``, on Linux), so
no handler runs on after its worker's lease on the job ran out and the job ran again
elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Final

from pgqueue.parent_death import set_parent_death_signal

# How long the pool thread waits for the fork server's word on how a dead child ended.
EXIT_STATUS_WAIT: Final = 5.0
# How many ended children's wait statuses the fork server's reader keeps.
STATUSES_KEPT: Final = 1000

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
    """The fork server's loop: fork a child per request, report each child's end; when the
    worker closes its end, kill the children still alive and return."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when the pool ends
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server = os.getpid()
    children: set[int] = set()  # forked, not yet reaped: their pids cannot be reused
    try:
        while True:
            readable, _, _ = select.select([control], [], [], 0.1)
            _report_ended_children(control, children)
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
                    _die_with(server)
                    child_main(theirs)
                except BaseException:
                    code = 1
                os._exit(code)
            children.add(pid)
            theirs.close()
            socket.send_fds(control, [_MESSAGE.pack(_FORKED, pid, 0)], [ours.fileno()])
            ours.close()
    finally:
        # A child busy with a handler reads nothing from its worker until the handler returns:
        # without this it would run on, its job's lease lost with the worker.
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _die_with(server: int) -> None:
    """Have the kernel kill this child when its fork server ends, however it ends (the server
    kills its children as it returns, but a SIGKILL or the OOM killer may end it first)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != server:  # it ended before the request: no signal would come
        os._exit(1)


def _report_ended_children(control: socket.socket, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        with contextlib.suppress(OSError):
            control.send(_MESSAGE.pack(_EXITED, pid, status))
