"""The chaos run's moving parts: its database, an optional PgBouncer, and the worker processes.

Everything here is started by the harness and stopped by PID (never by name): the machine is
shared. Worker processes are real ``python -m pgqueue worker chaosapp:pgq`` subprocesses, one of
them a ``--processes 2`` supervisor, whose children the fault injector signals directly, and one
a ``--pool process`` worker, whose handlers run in children of its fork server (the injector
signals those children, or the worker itself, and the harness samples their memory).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from pgqueue import migrations

from .app import (
    APP_SOURCE,
    LEDGER_DDL,
    MEMORY_CAP_MB,
    QUEUE_ATOMIC_SOLO,
    QUEUE_PROCESS,
    SHARED_QUEUES,
    TASKS_PER_CHILD,
)

LEASE_SECONDS = 3.0
RESCUE_INTERVAL = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def create_database(server: URL, name: str) -> URL:
    """A fresh database ``name`` on ``server``, migrated to pgqueue's head, with the ledger."""
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = server.set(database=name)
    engine = create_engine(url)
    with engine.begin() as connection:
        migrations.upgrade(connection)
        connection.execute(text(LEDGER_DDL))
    engine.dispose()
    return url


def drop_database(server: URL, name: str) -> None:
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def write_app(directory: Path) -> None:
    (directory / "chaosapp.py").write_text(APP_SOURCE)


def process_parents() -> dict[int, int]:
    """Every live process's parent (from /proc, one pass: a pass costs milliseconds)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            found[int(name)] = int(fields[1])
    return found


def children_of(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Live child processes of ``pid`` (from /proc, or from ``parents`` already read)."""
    parents = process_parents() if parents is None else parents
    return sorted(child for child, parent in parents.items() if parent == pid)


def descendants_of(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Live children of ``pid``, their children, and so on."""
    parents = process_parents() if parents is None else parents
    found: list[int] = []
    generation = children_of(pid, parents)
    while generation:
        found += generation
        generation = [c for p in generation for c in children_of(p, parents)]
    return found


def resident_megabytes(pid: int) -> float | None:
    """The resident memory of ``pid`` in MB (None: it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1_048_576
    except (OSError, ValueError, IndexError):
        return None


class Bouncer:
    """A PgBouncer in transaction mode in front of one database (config as tests/e2e's
    ``bouncer`` fixture), restartable on the same port. ``server_login_retry`` is 1 s, not the
    default 15 s: after a server restart, PgBouncer would otherwise hold every client's query
    for 15 s before it tries the server again (README, "PgBouncer")."""

    def __init__(self, server: URL, database: str) -> None:
        self.server = server.set(database=database)
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="pgqueue-chaos-bouncer-"))
        self.directory.chmod(0o755)
        self.process: subprocess.Popen[bytes] | None = None
        password = f" password={self.server.password}" if self.server.password else ""
        (self.directory / "pgbouncer.ini").write_text(
            f"""[databases]
{database} = host={self.server.host or "127.0.0.1"} port={self.server.port} user={self.server.username}{password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory}/users.txt
pool_mode = transaction
max_client_conn = 300
default_pool_size = 20
server_login_retry = 1
"""
        )
        (self.directory / "users.txt").write_text(f'"{self.server.username}" ""\n')

    @property
    def url(self) -> URL:
        return self.server.set(host="127.0.0.1", port=self.port, password=None, query={})

    def start(self) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        as_nobody = {"user": "nobody", "group": "nogroup"} if os.geteuid() == 0 else {}
        self.process = subprocess.Popen(
            [binary, str(self.directory / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=(self.directory / "log").open("ab"),
            **as_nobody,  # type: ignore[arg-type]
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError((self.directory / "log").read_text()) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: PgBouncer's immediate shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class WorkerSpec:
    """One ``pgqueue worker`` command line the harness keeps running."""

    name: str
    queues: list[str]
    concurrency: int
    processes: int = 1
    newer: bool = False  # registers ``chaos.newer`` (``CHAOS_NEWER=1``)
    pool: str = "thread"  # "process": ``--pool process``, children recycled as below


@dataclass
class Worker:
    spec: WorkerSpec
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def pids(self, parents: dict[int, int] | None = None) -> list[int]:
        """The processes that run handlers: the children of a supervisor, else the worker, and
        a process-pool worker's children (those of its fork server) too."""
        if not self.alive or self.popen is None:
            return []
        if self.spec.processes > 1:
            return children_of(self.popen.pid, parents)
        if self.spec.pool == "process":
            return [self.popen.pid, *self.pool_children(parents)]
        return [self.popen.pid]

    def pool_children(self, parents: dict[int, int] | None = None) -> list[int]:
        """A process-pool worker's children: those of its fork server (its only child)."""
        if self.spec.pool != "process" or not self.alive or self.popen is None:
            return []
        parents = process_parents() if parents is None else parents
        servers = children_of(self.popen.pid, parents)
        return [c for server in servers for c in children_of(server, parents)]


SPECS = [
    WorkerSpec("w0-supervisor", SHARED_QUEUES, 4, processes=2),
    # The process pool: every sync leased handler it claims runs in a child, those of the
    # process-only queue (hangs, leaks, crashes) included; atomic and async ones in the worker.
    WorkerSpec("w1-process", [*SHARED_QUEUES, QUEUE_PROCESS], 4, pool="process"),
    WorkerSpec("w2", SHARED_QUEUES, 3, newer=True),
    WorkerSpec("w3-solo", [QUEUE_ATOMIC_SOLO], 1),
]


@dataclass
class Workers:
    """The worker processes of one run, started in ``directory`` with ``env``."""

    directory: Path
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)
    known_pids: set[int] = field(default_factory=set)
    newer_pids: set[int] = field(default_factory=set)  # processes that register chaos.newer

    def start_all(self) -> None:
        for spec in SPECS:
            worker = Worker(spec)
            self.workers.append(worker)
            self.start(worker)

    def start(self, worker: Worker) -> None:
        spec = worker.spec
        log = (self.directory / f"{spec.name}.log").open("ab")
        command = [sys.executable, "-m", "pgqueue", "worker", "chaosapp:pgq"]
        command += ["--queues", ",".join(spec.queues), "--concurrency", str(spec.concurrency)]
        command += ["--processes", str(spec.processes), "--lease-seconds", str(LEASE_SECONDS)]
        command += ["--shutdown-timeout", "5", "--poll-interval", "0.5"]
        if spec.pool == "process":
            command += ["--pool", "process", "--max-tasks-per-child", str(TASKS_PER_CHILD)]
            command += ["--max-memory-per-child", str(MEMORY_CAP_MB)]
        # As a service manager would run it: a worker (re)started while the server restarts
        # waits for it instead of exiting.
        command += ["--wait-for-database"]
        env = {**self.env, "CHAOS_NEWER": "1" if spec.newer else "0"}
        worker.popen = subprocess.Popen(
            command, cwd=self.directory, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        worker.starts += 1
        # Known at once, not at the fault loop's next look: a worker started when the faults
        # stop (a pending restart, the drain's restart of the dead) is never looked at again,
        # and its runs of the newer task would read as runs where the task is not registered.
        self.handler_pids()

    def handler_pids(self) -> dict[int, Worker]:
        parents = process_parents()
        found = {pid: worker for worker in self.workers for pid in worker.pids(parents)}
        self.known_pids.update(found)
        self.newer_pids.update(pid for pid, worker in found.items() if worker.spec.newer)
        return found

    def restart_dead(self) -> list[str]:
        restarted = []
        for worker in self.workers:
            if not worker.alive:
                self.start(worker)
                restarted.append(worker.spec.name)
        return restarted

    def continue_all(self) -> None:
        """SIGCONT every process (a stopped one must run again before it can stop or drain)."""
        for worker in self.workers:
            if worker.popen is None:
                continue
            for pid in [worker.popen.pid, *descendants_of(worker.popen.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def stop_all(self, timeout: float = 30.0) -> list[str]:
        """SIGTERM every worker and wait; SIGKILL what is left. Returns the ones killed."""
        self.continue_all()
        for worker in self.workers:
            if worker.alive and worker.popen is not None:
                worker.popen.send_signal(signal.SIGTERM)
        killed = []
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.popen is None:
                continue
            try:
                worker.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(worker.spec.name)
                self.kill_tree(worker)
        return killed

    def kill_tree(self, worker: Worker) -> None:
        if worker.popen is None:
            return
        for pid in [*descendants_of(worker.popen.pid), worker.popen.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.popen.wait(10)

    def reap(self) -> list[int]:
        """SIGKILL every worker process of this run still alive, however it lost its parent
        (the children of a killed supervisor, a stopped one never continued): every process
        whose working directory is this run's. Returns their PIDs."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if Path(os.readlink(entry / "cwd")) != self.directory:
                    continue
            except OSError:
                continue
            pid = int(entry.name)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                found.append(pid)
        for worker in self.workers:
            if worker.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.popen.wait(10)
        return found

    def logs(self) -> dict[str, str]:
        return {
            spec.name: (self.directory / f"{spec.name}.log").read_text(errors="replace")
            for spec in (w.spec for w in self.workers)
            if (self.directory / f"{spec.name}.log").exists()
        }
