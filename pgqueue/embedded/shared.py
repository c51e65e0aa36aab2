"""One embedded server per data directory, shared by every process that asks for it.

:func:`shared_server` is what the demo, the CLI and an unconfigured application use: the first
process to need the server starts (and owns) it, the others reuse it while it is alive.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
from sqlalchemy import NullPool, create_engine, make_url
from sqlalchemy.exc import ProgrammingError

from pgqueue.embedded.identity import make_dirs
from pgqueue.embedded.server import EmbeddedPostgres, serves_data_dir, socket_url
from pgqueue.sql.server import create_database
from pgqueue.sqlstates import sqlstate_of

DUPLICATE_DATABASE = "42P04"


def default_data_dir() -> Path:
    """Where :func:`shared_server` keeps its cluster when no data directory is given.

    ``~/.local/share/pgqueue/postgres`` for normal users; ``/var/lib/pgqueue/postgres`` for
    root, whose server runs as another user (``identity``), which cannot traverse ``/root``.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/pgqueue/postgres")
    return Path.home() / ".local" / "share" / "pgqueue" / "postgres"


# The servers this process started through shared_server, by data directory.
_SHARED: dict[Path, EmbeddedPostgres] = {}
_SHARED_LOCK = threading.Lock()


def shared_server(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    bin_dir: str | os.PathLike[str] | None = None,
) -> str:
    """URL of the server on ``data_dir`` (default :func:`default_data_dir`), starting it if needed.

    Thread-safe and process-safe: under an ``fcntl`` lock beside the data directory, a live
    server already running on it (in this or another process) is reused; otherwise one is
    started, owned by this process and stopped when it exits. A process that merely reuses a
    server does not own it: if the owner exits, the server goes with it, and the next call here
    starts a new one. The URL is the server's Unix socket (no TCP): a development server for
    this user on this host, never one to share between hosts.
    """
    directory = (
        Path(os.path.abspath(os.fspath(data_dir))) if data_dir is not None else default_data_dir()
    )
    with _SHARED_LOCK:
        owned = _SHARED.get(directory)
        if owned is not None and owned._is_running():
            return owned.url()
        make_dirs(directory.parent)
        with _file_lock(directory.parent / f".{directory.name}.lock"):
            running = _running_server(directory)
            if running is not None:
                return socket_url(running[0], running[1], "postgres")
            server = EmbeddedPostgres(directory, bin_dir=bin_dir)
            server.start()
            _SHARED[directory] = server
            return server.url()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # O_CLOEXEC (and Popen's close_fds) keep the fd out of the postgres child: a server holding
    # the lock fd would keep the lock for its whole life.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _running_server(data_dir: Path) -> tuple[Path, int] | None:
    """Socket directory and port of a live server on ``data_dir`` (per its postmaster.pid)."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        pid, port, socket_dir = int(lines[0]), int(lines[3]), Path(lines[4])
    except (IndexError, ValueError):
        return None  # being written or truncated: treat as not running
    if not lines[4] or not _pid_alive(pid):
        return None  # no socket, or a stale file from a crash (postgres handles that on start)
    try:
        alive = serves_data_dir(socket_dir, port, data_dir, connect_timeout=2)
    except psycopg.Error:
        return None
    return (socket_dir, port) if alive else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _after_fork_in_child() -> None:
    # A forked child does not own its parent's servers, and a vanished thread may have held
    # the lock at fork time.
    global _SHARED_LOCK
    _SHARED.clear()
    _SHARED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def app_database(server_url: str, name: str) -> str:
    """URL of database ``name`` on the server of ``server_url`` (a URL of its ``postgres``
    database), created when missing: each application on the shared server gets its own."""
    url = make_url(server_url)
    admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            try:
                connection.execute(create_database(name))
            except ProgrammingError as exc:
                # Made already, by an earlier run or by a process racing this one.
                if sqlstate_of(exc) != DUPLICATE_DATABASE:
                    raise
    finally:
        admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)
