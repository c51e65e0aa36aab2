"""The embedded server process: :class:`EmbeddedPostgres` starts, waits for, and stops it.

The server dies with its parent (``PR_SET_PDEATHSIG``) and is stopped at interpreter exit;
stopping is SIGINT (PostgreSQL's "fast shutdown") and a wait. A process forked from the owner
forgets the servers it inherited, so its exit does not stop them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Final
from urllib.parse import quote

import psycopg

from pgqueue.embedded.binaries import find_bin_dir, usable_bin_dir
from pgqueue.embedded.children import spawn_server
from pgqueue.embedded.cluster import (
    HOST,
    LOG_TAIL_CHARS,
    SUPERUSER,
    choose_socket_dir,
    prepare_data_dir,
    read_password,
    server_args,
    write_hba,
)
from pgqueue.embedded.identity import RunAs, run_as
from pgqueue.errors import EmbeddedPostgresError
from pgqueue.sql.server import data_directory

_LOG_ROTATE_BYTES: Final = 10 * 1024 * 1024
_BIND_FAILURE_MARKERS: Final = ("could not bind", "could not create any TCP/IP sockets")
_PORT_ATTEMPTS: Final = 3
_DEFAULT_PORT: Final = 5432


class _BindFailed(Exception):
    """The auto-chosen port was taken between choosing and binding it."""


class EmbeddedPostgres:
    """One PostgreSQL server process owned by this Python process, for development and tests.

    ``start()`` runs ``initdb`` once if ``data_dir`` holds no cluster, then starts the server and
    waits until it accepts connections; ``stop()`` (also registered with :mod:`atexit`) shuts it
    down. The server also gets SIGINT if this process dies without running atexit handlers.

    It listens on a Unix socket in ``data_dir`` only (a private directory under the temp dir
    when that path is too long for a socket), reachable by this process's user and root alone;
    :meth:`url` is a socket URL. With ``tcp=True`` it also listens on 127.0.0.1, where
    ``scram-sha-256`` asks for the superuser's random password (kept in the 0600 file
    :attr:`password_file`, created with the cluster); :meth:`tcp_url` carries it.

    ``durable=False`` trades crash safety for speed (fsync, synchronous_commit and
    full_page_writes off, initdb --no-sync): for tests and throwaway queues.

    Server output goes to ``<data_dir>.log`` beside the data directory. When this process is
    root the server runs as its own system account (``identity``), which must be able to
    traverse every parent of ``data_dir``.

    ``start()`` may be called from any thread: the server is forked from a module-owned thread
    that lives as long as the process, because Linux sends the parent-death signal when the
    *forking thread* exits.

    In a process forked from the owner (multiprocessing, pre-fork servers) the object does not
    own the server: ``stop()`` and the atexit hook do nothing there.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        durable: bool = True,
        bin_dir: str | os.PathLike[str] | None = None,
        server_settings: Mapping[str, str] | None = None,
        tcp: bool = False,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port}")
        self._data_dir = Path(os.path.abspath(os.fspath(data_dir)))
        # Without TCP the socket sits in a directory of its own, so any number is free.
        self._port = port if port is not None or tcp else _DEFAULT_PORT
        self._tcp = tcp
        self._socket_dir: Path | None = None
        self._durable = durable
        self._bin_dir_argument = bin_dir
        self._server_settings = dict(server_settings or {})
        self._lock = threading.RLock()
        self._process: subprocess.Popen[bytes] | None = None
        self._owner_pid = -1

    def __repr__(self) -> str:
        state = "running" if self._is_running() else "stopped"
        return f"<EmbeddedPostgres {str(self._data_dir)!r} port={self._port} {state}>"

    @property
    def port(self) -> int:
        """The port: in the socket's name, and on 127.0.0.1 with ``tcp`` (chosen by ``start()``
        unless given)."""
        if self._port is None:
            raise EmbeddedPostgresError("the server has not been started: no port chosen yet")
        return self._port

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (absolute)."""
        return self._data_dir

    @property
    def socket_dir(self) -> Path:
        """The directory holding the server's Unix socket (known once started)."""
        if self._socket_dir is None:
            raise EmbeddedPostgresError("the server has not been started: no socket yet")
        return self._socket_dir

    @property
    def password_file(self) -> Path:
        """The 0600 file, beside the data directory, holding the superuser's TCP password."""
        return self._data_dir.with_name(self._data_dir.name + ".password")

    @property
    def _log_path(self) -> Path:
        # Beside the data dir, opened by this process and handed to the child as an fd, so it
        # works whether or not the server's user could create files there; initdb insists on
        # an empty data directory, so the log cannot live inside it.
        return self._data_dir.with_name(self._data_dir.name + ".log")

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` on this server, through its Unix socket."""
        return socket_url(self.socket_dir, self.port, database)

    def tcp_url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` over TCP, with the password (needs ``tcp=True``)."""
        if not self._tcp:
            raise EmbeddedPostgresError("this server does not listen on TCP; pass tcp=True")
        password = quote(read_password(self.password_file), safe="")
        return f"postgresql+psycopg://{SUPERUSER}:{password}@{HOST}:{self.port}/{database}"

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _is_running(self) -> bool:
        process = self._process
        return process is not None and self._owner_pid == os.getpid() and process.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Initialise the data directory if needed, start the server, wait until it is ready.

        Does nothing if this object's server is already running. A server started again
        after ``stop()`` comes back on the port it had, so URLs handed out stay valid.
        """
        with self._lock:
            if self._is_running():
                return
            deadline = time.monotonic() + timeout
            identity = run_as()
            bin_dir = usable_bin_dir(find_bin_dir(self._bin_dir_argument), identity)
            prepare_data_dir(
                self._data_dir,
                bin_dir,
                identity,
                deadline,
                durable=self._durable,
                password_file=self.password_file,
            )
            if self._tcp:
                read_password(self.password_file)  # fail now, not at the first TCP client
            write_hba(self._data_dir, bin_dir, identity)
            self._socket_dir = choose_socket_dir(self._data_dir, self._socket_dir, identity)
            # A restart (or an explicit port) binds that one port or fails; a fresh free port is
            # only chosen on the first start.
            fixed_port = self._port
            attempts = 1 if fixed_port is not None else _PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                port = fixed_port or _free_port()
                try:
                    process = self._launch(bin_dir, identity, port, deadline, timeout)
                except _BindFailed as exc:
                    if attempt < attempts:
                        continue  # someone took the free port between our probe and its bind
                    raise EmbeddedPostgresError(
                        f"PostgreSQL could not bind {HOST}:{port} ({self._data_dir}):\n{exc}"
                    ) from None
                self._process = process
                self._port = port
                self._owner_pid = os.getpid()
                _register_owned(self)
                return

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT) and wait; SIGKILL after ``timeout`` seconds. Idempotent."""
        with self._lock:
            process, self._process = self._process, None
            _unregister_owned(self)
            if process is None or self._owner_pid != os.getpid():
                return
            # SIGINT is PostgreSQL's "fast shutdown": abort open transactions, disconnect
            # clients, checkpoint, exit. SIGTERM ("smart") would wait for clients to leave.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if self._socket_dir is not None and self._socket_dir != self._data_dir:
                shutil.rmtree(self._socket_dir, ignore_errors=True)
                self._socket_dir = None

    def _launch(
        self, bin_dir: Path, identity: RunAs | None, port: int, deadline: float, timeout: float
    ) -> subprocess.Popen[bytes]:
        log_path = self._log_path
        _rotate_log(log_path)
        # 0600: the log can contain statements and data from failed queries.
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with open(log_fd, "ab") as log:
            offset = log.seek(0, os.SEEK_END)
            args = server_args(
                bin_dir,
                self._data_dir,
                port,
                self.socket_dir,
                tcp=self._tcp,
                durable=self._durable,
                server_settings=self._server_settings,
            )
            process = spawn_server(args, run_as=identity, cwd=self._data_dir, log=log)
        # The child holds its own copy of the log fd; ours is closed by the with block.
        try:
            _wait_until_ready(process, self.socket_dir, port, self._data_dir, deadline)
        except _StartupExited as exc:
            tail = _read_tail(log_path, offset)
            if any(marker in tail for marker in _BIND_FAILURE_MARKERS):
                raise _BindFailed(tail) from None
            raise EmbeddedPostgresError(
                f"PostgreSQL ({self._data_dir}) exited with code {exc.returncode} while "
                f"starting; {log_path}:\n{tail}"
            ) from None
        except _StartupTimeout as exc:
            _kill(process)
            raise EmbeddedPostgresError(
                f"PostgreSQL ({self._data_dir}) did not accept connections on port {port} "
                f"within {timeout:g}s (last error: {exc}); {log_path}:\n"
                + _read_tail(log_path, offset)
            ) from None
        except BaseException:
            _kill(process)
            raise
        return process


class _StartupExited(Exception):
    def __init__(self, returncode: int) -> None:
        super().__init__(returncode)
        self.returncode = returncode


class _StartupTimeout(Exception):
    pass


def _wait_until_ready(
    process: subprocess.Popen[bytes], socket_dir: Path, port: int, data_dir: Path, deadline: float
) -> None:
    last_error = "no attempt"
    while True:
        returncode = process.poll()
        if returncode is not None:
            raise _StartupExited(returncode)
        try:
            if serves_data_dir(socket_dir, port, data_dir, connect_timeout=1):
                return
            # Another cluster answers in this socket directory (a stale or shared directory);
            # ours is still starting or will exit, which the poll above reports.
            last_error = f"another PostgreSQL answers in {socket_dir} on port {port}"
        except psycopg.Error as exc:
            last_error = str(exc).strip() or type(exc).__name__
        if time.monotonic() >= deadline:
            raise _StartupTimeout(last_error)
        time.sleep(0.02)


def serves_data_dir(socket_dir: Path, port: int, data_dir: Path, *, connect_timeout: int) -> bool:
    """Whether the server on ``socket_dir``/``port`` accepts connections and runs on ``data_dir``."""
    with psycopg.connect(
        host=str(socket_dir),
        port=port,
        user=SUPERUSER,
        dbname="postgres",
        connect_timeout=connect_timeout,
        autocommit=True,
    ) as connection:
        row = connection.execute(data_directory()).fetchone()
    return row is not None and os.path.realpath(str(row[0])) == os.path.realpath(data_dir)


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that is free at the time of the call."""
    # Racy by nature (the port is free now, not necessarily at bind time): start() retries.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def socket_url(socket_dir: Path, port: int, database: str) -> str:
    """SQLAlchemy URL of ``database`` on the server listening in ``socket_dir`` on ``port``."""
    host = quote(str(socket_dir), safe="")
    return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={host}&port={port}"


def _rotate_log(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))


def _read_tail(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return text[-LOG_TAIL_CHARS:].strip()


# The servers this process owns, stopped at interpreter exit.
_OWNED: set[EmbeddedPostgres] = set()
_OWNED_LOCK = threading.Lock()
_atexit_registered = False


def _register_owned(server: EmbeddedPostgres) -> None:
    global _atexit_registered
    with _OWNED_LOCK:
        _OWNED.add(server)
        if not _atexit_registered:
            atexit.register(_stop_owned_servers)
            _atexit_registered = True


def _unregister_owned(server: EmbeddedPostgres) -> None:
    with _OWNED_LOCK:
        _OWNED.discard(server)


def _stop_owned_servers() -> None:
    with _OWNED_LOCK:
        servers = list(_OWNED)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


def _after_fork_in_child() -> None:
    # A forked child inherits our bookkeeping but not our servers (they are our children, not
    # its): forget them so its atexit does not stop them, and replace a lock that a vanished
    # thread may have held at fork time.
    global _OWNED_LOCK
    _OWNED.clear()
    _OWNED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
