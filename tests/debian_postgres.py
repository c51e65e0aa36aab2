"""Start and stop a real PostgreSQL server with its default settings, for the test matrix.

``python tests/debian_postgres.py start DIR [BIN_DIR] [--locale NAME]`` runs ``initdb`` into
``DIR/data`` (as the ``postgres`` user when run as root: PostgreSQL refuses root) and starts the
server on a free port of 127.0.0.1 with password authentication, changing nothing else: JIT
stays on, as on a server installed with ``apt-get install postgresql``. ``BIN_DIR`` defaults to
the newest Debian package's ``/usr/lib/postgresql/<major>/bin``; another build's bin dir (the
PostgreSQL wheels ``tests/run`` installs for the other major versions) runs the same way.
``start()`` may also give the server settings of its own (``tests/tiers.py`` turns flushing off
for the matrix's other versions). ``--locale`` gives the cluster that locale (its collation orders text), as a machine whose
system locale it is gives a packaged server; without it ``initdb`` takes the environment's. It
prints a ``postgresql+psycopg://`` URL of the maintenance database.
``python tests/debian_postgres.py restart DIR`` restarts it (fast: open transactions aborted)
on the same port; ``python tests/debian_postgres.py stop DIR`` stops it and removes ``DIR``.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.network import free_port


def bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<major>/bin`` (Debian's layout)."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        raise SystemExit(
            "Debian's postgresql package is not installed (apt-get install postgresql)"
        )
    return Path(max(found, key=lambda path: int(path.split("/")[4]))).parent


def as_postgres(root: Path) -> dict[str, Any]:
    """``subprocess`` arguments that run a server command as ``postgres`` when root (which
    PostgreSQL refuses), with ``root`` and everything in it handed to that user."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")
    for path in [root, *root.rglob("*")]:
        os.lchown(path, account.pw_uid, account.pw_gid)
    return {"user": "postgres", "group": "postgres"}


def _reachable_bin_dir(binaries: Path, root: Path) -> Path:
    """``binaries``, or a copy of its install tree inside ``root`` when the ``postgres`` user
    cannot execute it where it is (a clone under ``/root`` is closed to other users)."""
    if os.geteuid() != 0:
        return binaries
    try:
        subprocess.run(
            [binaries / "postgres", "--version"],
            capture_output=True,
            user="postgres",
            group="postgres",
            check=True,
        )
        return binaries
    except (OSError, subprocess.CalledProcessError):
        pass
    # A relocatable build finds its lib and share directories relative to its bin directory,
    # so the whole install tree moves together.
    copy = root / "server"
    shutil.copytree(binaries.parent, copy, symlinks=True)
    return copy / binaries.name


def _run(command: list[Any], user: dict[str, Any], log: Path | None = None) -> None:
    """Run a server command; on failure exit with its output (and the server log), which is
    all a CI log will show of why a build did not start (a missing shared library, say)."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, **user)
    if result.returncode != 0:
        detail = result.stdout + result.stderr
        if log is not None and log.is_file():
            detail += log.read_text(errors="replace")
        raise SystemExit(f"{command[0]} failed ({result.returncode}):\n{detail}")


def start(
    root: Path,
    binaries: Path | None = None,
    locale: str | None = None,
    settings: dict[str, str] | None = None,
) -> str:
    """Start a server in ``root`` (see the module), with ``settings`` (name -> value) given
    on its command line; its URL."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    binaries = _reachable_bin_dir((binaries or bin_dir()).resolve(), root)
    # stop() must use the same build's pg_ctl.
    (root / "bin_dir").write_text(str(binaries) + "\n")
    password = secrets.token_hex(12)
    (root / "pw").write_text(password + "\n")
    user = as_postgres(root)
    data = root / "data"
    initdb = [binaries / "initdb", "-D", data, "-U", "postgres", "-A", "scram-sha-256"]
    if locale is not None:
        initdb.append(f"--locale={locale}")
    _run([*initdb, "--pwfile", root / "pw"], user)
    port = free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    options += "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
    _run(
        [binaries / "pg_ctl", "-D", data, "-w", "-l", root / "log", "-o", options, "start"],
        user,
        log=root / "log",
    )
    return f"postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/postgres"


def stop(root: Path) -> None:
    user = {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}
    recorded = root / "bin_dir"
    binaries = Path(recorded.read_text().strip()) if recorded.is_file() else bin_dir()
    if (root / "data" / "postmaster.pid").is_file():
        subprocess.run(
            [binaries / "pg_ctl", "-D", root / "data", "-m", "fast", "stop"],
            capture_output=True,
            check=False,
            **user,
        )
    shutil.rmtree(root, ignore_errors=True)


def restart(root: Path) -> None:
    """Fast restart (open transactions aborted, clients disconnected) on the same port, as a
    server restart in production would look to its clients."""
    user = {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}
    binaries = Path((root / "bin_dir").read_text().strip())
    pg_ctl = [binaries / "pg_ctl", "-D", root / "data", "-w", "-m", "fast", "-l", root / "log"]
    _run([*pg_ctl, "restart"], user, log=root / "log")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    locale = None
    if len(arguments) >= 2 and arguments[-2] == "--locale":
        locale, arguments = arguments[-1], arguments[:-2]
    if not (
        (len(arguments) in {2, 3} and arguments[0] == "start")
        or (len(arguments) == 2 and arguments[0] in {"stop", "restart"} and locale is None)
    ):
        raise SystemExit(
            "usage: python tests/debian_postgres.py start DIR [BIN_DIR] [--locale NAME]"
            " | restart DIR | stop DIR"
        )
    if arguments[0] == "start":
        binaries = Path(arguments[2]) if len(arguments) == 3 else None
        print(start(Path(arguments[1]), binaries, locale))
    elif arguments[0] == "restart":
        restart(Path(arguments[1]))
    else:
        stop(Path(arguments[1]))
