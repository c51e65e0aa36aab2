"""``--processes N``: N worker processes under one supervisor.

The supervisor runs each worker as a child process (the same command with one process),
restarts a child that dies (with a short backoff if children keep dying at once), and forwards
SIGTERM/SIGINT to the children; a second signal is forwarded as SIGKILL. It exits 0 when every
child stopped cleanly after a signal.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from types import FrameType

log = logging.getLogger("pgqueue.supervisor")


class Supervisor:
    """Keeps ``processes`` copies of ``command`` running until signalled."""

    def __init__(self, command: list[str], processes: int) -> None:
        self.command = command
        self.processes = processes
        self.children: list[subprocess.Popen[bytes]] = []
        self._signals = 0
        self._drain = "--drain" in command

    def _spawn(self) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(self.command)
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
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 10] + [now]
                if len(restarts) > 5 * self.processes:
                    time.sleep(1.0)  # children crash on start: do not spin
                self.children[index] = self._spawn()
                alive = True
            if not alive:
                codes = [child.returncode for child in self.children]
                return 0 if all(code == 0 for code in codes) else 1
            time.sleep(0.1)
