"""``--processes N``: N worker processes under one supervisor.

The supervisor runs each worker as a child process (the same command with one process),
restarts a child that dies (with a short backoff if children keep dying at once), and forwards
SIGTERM/SIGINT to the children; a second signal is forwarded as SIGKILL. It exits 0 when every
child stopped cleanly after a signal.

With metrics on, the supervisor serves the group's endpoint (``pgqueue.metrics.serve_group``)
and tells it the PID of each child that exited (``on_exit``), whose live gauges then stop
counting.

A supervisor killed outright (SIGKILL from the OOM killer, or from a process manager that
signals only the main PID) forwards nothing, so each child is given the supervisor's PID and
watches its own parent: when the parent changes (the child was re-parented), it stops as on
SIGTERM, finishing its running jobs within the shutdown timeout and releasing the rest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from types import FrameType

from pgqueue.errors import pgqueue_logger

log = pgqueue_logger("pgqueue.supervisor")

# The hidden ``pgqueue worker`` option by which a child learns its supervisor's PID.
SUPERVISOR_PID_OPTION = "--supervisor-pid"

# How often a child looks at its parent: a getppid() call, so cheap enough to do often, and
# small next to any shutdown timeout.
PARENT_CHECK_INTERVAL = 0.25


class Supervisor:
    """Keeps ``processes`` copies of ``command`` running until signalled."""

    def __init__(
        self,
        command: list[str],
        processes: int,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.command = command
        self._on_exit = on_exit  # called with the PID of each child that exited
        self.processes = processes
        self.children: list[subprocess.Popen[bytes]] = []
        self._signals = 0
        self._drain = "--drain" in command

    def _spawn(self) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([*self.command, SUPERVISOR_PID_OPTION, str(os.getpid())])
        log.info("started worker process %d", child.pid)
        return child

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        sent = signal.SIGKILL if self._signals > 1 else signal.Signals(signum)
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(sent)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        self.children = [self._spawn() for _ in range(self.processes)]
        restarts: list[float] = []
        while True:
            alive = False
            for index, child in enumerate(self.children):
                code = child.poll()
                if code is None:
                    alive = True
                    continue
                if self._signals or (self._drain and code == 0):
                    continue
                log.warning("worker process %d exited with %s; starting a new one", child.pid, code)
                if self._on_exit is not None:
                    self._on_exit(child.pid)
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 10] + [now]
                if len(restarts) > 5 * self.processes:
                    time.sleep(1.0)  # children crash on start: do not spin
                self.children[index] = self._spawn()
                alive = True
            if not alive:
                codes = [child.returncode for child in self.children]
                if self._on_exit is not None:
                    for child in self.children:
                        self._on_exit(child.pid)
                return 0 if all(code == 0 for code in codes) else 1
            time.sleep(0.1)


def watch_supervisor(
    supervisor_pid: int, stop: Callable[[], None], interval: float = PARENT_CHECK_INTERVAL
) -> threading.Thread:
    """In a child: call ``stop()`` once the supervisor ``supervisor_pid`` is no longer its parent.

    A parent check rather than ``PR_SET_PDEATHSIG``: it works on every POSIX system, it does not
    depend on which supervisor thread started the child, and it calls ``stop()`` directly. A
    parent-death SIGTERM arriving after a forwarded one would count as the worker's second
    signal, which exits at once without releasing the running jobs.
    """

    def watch() -> None:
        while os.getppid() == supervisor_pid:
            time.sleep(interval)
        log.warning(
            "supervisor process %d is gone; stopping this worker process (%d)",
            supervisor_pid,
            os.getpid(),
        )
        stop()

    thread = threading.Thread(target=watch, name="pgqueue-supervisor-watch", daemon=True)
    thread.start()
    return thread
