"""The embedded server's cluster: ``initdb``, and the configuration written around it.

A data directory is created once, by ``initdb`` into a temporary sibling renamed into place,
with a random superuser password for TCP kept in a 0600 file beside it. ``pg_hba.conf`` and
``pg_ident.conf`` are rewritten at every start, so no older, laxer one survives; the server's
settings are passed as ``-c`` options rather than written to ``postgresql.conf``.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pgqueue.embedded.binaries import has_pg_stat_statements, major_version, server_version
from pgqueue.embedded.children import CHILD_ENV, die_with_parent_hook
from pgqueue.embedded.identity import (
    RunAs,
    blocking_ancestor,
    identity_kwargs,
    make_dirs,
    write_private,
)
from pgqueue.errors import EmbeddedPostgresError

HOST: Final = "127.0.0.1"
SUPERUSER: Final = "postgres"
# The pg_ident.conf map that lets root (the only client of a server it runs as another user) in.
_PEER_MAP: Final = "pgqueue"

LOG_TAIL_CHARS: Final = 4000
# sun_path is 108 bytes including the NUL; PostgreSQL refuses longer socket paths.
_MAX_SOCKET_PATH: Final = 107


def write_hba(data_dir: Path, bin_dir: Path, run_as: RunAs | None) -> None:
    """Write who may connect, replacing whatever ``pg_hba.conf`` the cluster had.

    A server root runs as another user admits root, the process that started it, and no one
    else: ``peer`` with a map. That matters most when it runs as ``nobody``, whose uid other
    daemons share and who could all reach its socket.
    Otherwise the socket directory's 0700 mode already limits clients to the server's user.
    """
    if run_as is None:
        local = "trust"
        ident = ""
    else:
        local = f"peer map={_PEER_MAP}"
        major = major_version(server_version(bin_dir))
        # "all" as the database user in pg_ident.conf exists from PostgreSQL 16 on.
        ident = f"{_PEER_MAP} root {'all' if major >= 16 else SUPERUSER}\n"
    hba = (
        "# Written by pgqueue at every start of its embedded server; edits are lost.\n"
        f"local all all {local}\n"
        f"host all all {HOST}/32 scram-sha-256\n"
    )
    write_private(data_dir / "pg_hba.conf", hba, run_as)
    write_private(data_dir / "pg_ident.conf", ident, run_as)


def choose_socket_dir(data_dir: Path, current: Path | None, run_as: RunAs | None) -> Path:
    """The directory for the server's socket: ``data_dir`` unless its path is too long.

    A too-long path gets a private temporary directory, ``current`` if it still exists.
    """
    # The longest port number: a port chosen later must fit as well.
    if len(str(data_dir)) + len("/.s.PGSQL.65535.lock") <= _MAX_SOCKET_PATH:
        return data_dir
    if current is not None and current.is_dir():
        return current
    # mkdtemp's 0700 keeps other users out, as the data directory does.
    directory = Path(tempfile.mkdtemp(prefix="pgqueue-"))
    if run_as is not None:
        os.chown(directory, run_as.uid, run_as.gid)
    return directory


def prepare_data_dir(
    data_dir: Path,
    bin_dir: Path,
    run_as: RunAs | None,
    deadline: float,
    *,
    durable: bool,
    password_file: Path,
) -> None:
    """Check that ``data_dir`` holds a cluster ``run_as`` can run, or create one with initdb."""
    make_dirs(data_dir.parent)
    if run_as is not None:
        blocker = blocking_ancestor(data_dir.parent.resolve(), run_as)
        if blocker is not None:
            raise EmbeddedPostgresError(
                f"this process is root, so PostgreSQL runs as {run_as.name!r}, which cannot "
                f"traverse {blocker} (mode {stat.filemode(blocker.stat().st_mode)}) to reach "
                f"the data directory {data_dir}; choose a data directory it can reach"
            )
    if (data_dir / "PG_VERSION").is_file():
        if run_as is not None and data_dir.stat().st_uid != run_as.uid:
            raise EmbeddedPostgresError(
                f"data directory {data_dir} is owned by uid {data_dir.stat().st_uid}, but the "
                f"server must run as {run_as.name!r} (uid {run_as.uid}) because this process "
                f"is root; to keep its data, stop its server and run `chown -R "
                f"{run_as.name}: {data_dir}`"
            )
        return
    if data_dir.is_dir() and any(data_dir.iterdir()):
        raise EmbeddedPostgresError(
            f"{data_dir} exists, is not empty and is not a PostgreSQL data directory"
        )
    _initdb(data_dir, bin_dir, run_as, deadline, durable=durable, password_file=password_file)


def _initdb(
    data_dir: Path,
    bin_dir: Path,
    run_as: RunAs | None,
    deadline: float,
    *,
    durable: bool,
    password_file: Path,
) -> None:
    # initdb into a temporary sibling and rename it into place: a data directory is either
    # absent or complete, even if this process is killed half way, and two processes
    # initialising the same directory at once cannot mix their files.
    building = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.initdb-", dir=data_dir.parent))
    # The password initdb sets for TCP clients; initdb (maybe another user) reads it from a file
    # in a 0700 directory of its own, deleted once initdb is done.
    password = secrets.token_urlsafe(32)
    secret_dir = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.pw-", dir=data_dir.parent))
    secret_file = secret_dir / "password"
    try:
        if run_as is not None:
            os.chown(building, run_as.uid, run_as.gid)
        write_private(secret_file, password + "\n", run_as)
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
            SUPERUSER,
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not durable:
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
                env=dict(CHILD_ENV),
                # The calling thread waits for initdb, so the per-thread PDEATHSIG caveat
                # does not apply; initdb removes its directory on SIGINT.
                preexec_fn=die_with_parent_hook(os.getpid()),
                **identity_kwargs(run_as),
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedPostgresError(f"initdb for {data_dir} timed out") from exc
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb for {data_dir} failed with exit code {result.returncode}:\n"
                + (result.stdout + result.stderr).strip()[-LOG_TAIL_CHARS:]
            )
        # Written before the cluster appears: a data directory never exists without it.
        # The client's file, not the server's: owned by this process's user.
        write_private(password_file, password + "\n", None)
        try:
            # rename(2) also replaces an existing *empty* directory.
            os.rename(building, data_dir)
        except OSError as exc:
            concurrent = exc.errno in (errno.EEXIST, errno.ENOTEMPTY)
            if not (concurrent and (data_dir / "PG_VERSION").is_file()):
                raise
        if durable:
            _fsync_dir(data_dir.parent)  # make the rename itself durable
    finally:
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)


def server_args(
    bin_dir: Path,
    data_dir: Path,
    port: int,
    socket_dir: Path,
    *,
    tcp: bool,
    durable: bool,
    server_settings: Mapping[str, str],
) -> list[str]:
    """The ``postgres`` command line, its settings given as ``-c`` options."""
    settings: dict[str, str] = {
        "max_connections": "200",
        # The directory is private already; the socket's own mode says so too.
        "unix_socket_permissions": "0700",
    }
    if has_pg_stat_statements(bin_dir):
        settings["shared_preload_libraries"] = "pg_stat_statements"
    if not durable:
        settings.update({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"})
    settings.update(server_settings)
    args = [
        str(bin_dir / "postgres"),
        "-D",
        str(data_dir),
        "-h",
        HOST if tcp else "",
        "-p",
        str(port),
        "-k",
        str(socket_dir),
    ]
    for key, value in settings.items():
        args += ["-c", f"{key}={value}"]
    return args


def read_password(path: Path) -> str:
    """The superuser's TCP password from the password file beside the data directory."""
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
