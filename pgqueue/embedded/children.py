"""Child processes of the embedded server: a fixed environment, and death with this process.

Every long-running child is forked from one daemon thread that lives as long as the process,
and gets SIGINT (PostgreSQL's fast shutdown) through ``PR_SET_PDEATHSIG`` when its parent dies.
"""

from __future__ import annotations

import errno
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Final, TypeVar

from pgqueue.embedded.identity import RunAs, identity_kwargs
from pgqueue.parent_death import set_parent_death_signal

_T = TypeVar("_T")

# Children never inherit our environment: as root it would hand every secret in it to a process
# running as another user (whose /proc/<pid>/environ every process of that user can read), and PG*
# variables would otherwise leak into initdb/postgres behaviour. LC_ALL=C matches --locale=C.
CHILD_ENV: Final[Mapping[str, str]] = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}


def die_with_parent_hook(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` making the child receive SIGINT (fast shutdown) when its parent dies.

    CPython's _posixsubprocess runs preexec_fn *after* setgroups/setregid/setreuid, which
    matters: the kernel clears PDEATHSIG whenever the effective uid/gid changes, so setting it
    before the switch to the server's user would silently do nothing. It survives the execve (postgres is
    not set-uid).

    Linux delivers it when the *thread* that forked the child exits, not the process; hence
    every long-running child is forked from _SPAWNER's thread, which lives as long as the
    process does.
    """

    def hook() -> None:
        set_parent_death_signal(signal.SIGINT)
        # The parent may have died between fork() and prctl(); the signal would never come.
        if os.getppid() != parent_pid:
            raise OSError(errno.ESRCH, "parent exited before the child started")

    return hook


class _Spawner:
    """Runs process launches on one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the forking *thread* exits. A server started from a short-lived
    thread (a thread-per-request web server, a thread pool worker that is retired) would be shut
    down as soon as that thread ended. Forking from a dedicated thread that only ends with the
    process means callers may call start() from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None]] | None = None
        self._pid = -1

    def reset_after_fork(self) -> None:
        # The thread does not exist in a forked child, and the lock may have been held by a
        # thread that does not exist either.
        self._lock = threading.Lock()
        self._jobs = None
        self._pid = -1

    def call(self, function: Callable[[], _T]) -> _T:
        with self._lock:
            if self._jobs is None or self._pid != os.getpid():
                self._jobs = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(
                    target=self._run, args=(self._jobs,), name="pgqueue-pg-spawner", daemon=True
                ).start()
            jobs = self._jobs
        result: Future[_T] = Future()

        def job() -> None:
            try:
                result.set_result(function())
            except BaseException as exc:
                result.set_exception(exc)

        jobs.put(job)
        return result.result()

    @staticmethod
    def _run(jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            jobs.get()()


_SPAWNER: Final = _Spawner()


def spawn_server(
    args: list[str], *, run_as: RunAs | None, cwd: Path, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start ``args`` from the spawner thread, as ``run_as``, writing its output to ``log``."""

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            env=dict(CHILD_ENV),
            # Own session: a Ctrl-C in the terminal goes to the application (which may still
            # need the database while it shuts down gracefully), not straight to postgres.
            start_new_session=True,
            preexec_fn=die_with_parent_hook(os.getpid()),
            **identity_kwargs(run_as),
        )

    return _SPAWNER.call(launch)


# A forked child has no spawner thread, and a vanished thread may have held the lock at fork.
os.register_at_fork(after_in_child=_SPAWNER.reset_after_fork)
