"""A process-pool child ends with its worker. A worker killed (SIGKILL, the kernel's OOM killer)
while its child runs a handler takes the child with it within the pool's kill grace, and so
does a fork server killed on its own: the worker's lease on the job runs out with the worker,
the job runs again elsewhere, and the child must not run on beside that run.

The "worker" is a process forked from the test's that starts a fork server and has it fork one
child, whose handler sleeps, deaf to everything (as a handler blocked on the network is); no
database is involved.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from pgqueue.worker.fork_server import ForkServer
from pgqueue.worker.processes import KILL_GRACE_SECONDS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads processes' states from /proc"
)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its exit status waits to be read)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def _hang(end: socket.socket) -> None:
    time.sleep(120)


def _worker(report: int) -> None:
    """The forked worker's life: a fork server, one busy child, their pids sent to ``report``."""
    code = 1
    try:
        server = ForkServer(_hang)
        child, _ = server.fork()
        os.write(report, f"{server.pid} {child}\n".encode())
        time.sleep(120)
        code = 0
    finally:
        os._exit(code)  # never back into the test's own process


@pytest.mark.parametrize("killed", ["worker", "fork server"])
def test_a_busy_child_ends_with_its_worker_within_the_kill_grace(killed: str) -> None:
    read, write = os.pipe()
    worker = os.fork()
    if worker == 0:
        os.close(read)
        _worker(write)
    os.close(write)
    pids: list[int] = []
    try:
        with os.fdopen(read) as report:
            pids = [int(pid) for pid in report.readline().split()]
        server, child = pids
        assert _running(child)
        os.kill(worker if killed == "worker" else server, signal.SIGKILL)
        killed_at = time.monotonic()
        while _running(child) and time.monotonic() - killed_at < KILL_GRACE_SECONDS + 1:
            time.sleep(0.01)
        lived = time.monotonic() - killed_at
        assert not _running(child), f"the child still ran {lived:.1f} s after its {killed} died"
        assert lived <= KILL_GRACE_SECONDS
    finally:
        for pid in [worker, *pids]:
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        os.waitpid(worker, 0)
