"""Start and stop Debian's packaged PostgreSQL with its default settings, for the test matrix.

``python tests/debian_postgres.py start DIR`` runs ``initdb`` into ``DIR/data`` (as the
``postgres`` user when run as root: PostgreSQL refuses root) and starts the server on a free
port of 127.0.0.1 with password authentication, changing nothing else: JIT stays on, as on a
server installed with ``apt-get install postgresql``. It prints a ``postgresql+psycopg://`` URL
of the maintenance database. ``python tests/debian_postgres.py stop DIR`` stops it.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


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
    shutil.chown(root, "postgres", "postgres")
    for path in root.rglob("*"):
        shutil.chown(path, "postgres", "postgres")
    return {"user": "postgres", "group": "postgres"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    password = secrets.token_hex(12)
    (root / "pw").write_text(password + "\n")
    user = as_postgres(root)
    data = root / "data"
    initdb = [bin_dir() / "initdb", "-D", data, "-U", "postgres", "-A", "scram-sha-256"]
    subprocess.run(
        [*initdb, "--pwfile", root / "pw"],
        check=True,
        capture_output=True,
        **user,
    )
    port = free_port()
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    subprocess.run(
        [bin_dir() / "pg_ctl", "-D", data, "-w", "-l", root / "log", "-o", options, "start"],
        check=True,
        capture_output=True,
        **user,
    )
    return f"postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/postgres"


def stop(root: Path) -> None:
    user = {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}
    subprocess.run(
        [bin_dir() / "pg_ctl", "-D", root / "data", "-m", "fast", "stop"],
        capture_output=True,
        **user,
    )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in {"start", "stop"}:
        raise SystemExit("usage: python tests/debian_postgres.py start|stop DIR")
    if sys.argv[1] == "start":
        print(start(Path(sys.argv[2])))
    else:
        stop(Path(sys.argv[2]))
