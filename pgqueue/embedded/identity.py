"""Who the embedded server runs as, and the files and directories made for it.

PostgreSQL refuses to run as root, so a root process runs ``initdb``/``postgres`` as a system
account of its own, ``pgqueue-embedded``, created the first time it is needed (no home, no login
shell). Not ``nobody``: other daemons share that uid (PgBouncer often runs as ``nobody``), and
any of them could read a data directory it owns. Where the account cannot be created (no
``useradd``, a read-only ``/etc``), the server runs as ``nobody`` after one WARNING. This module
resolves that identity, checks that it can traverse a path, and creates files and directories
with the ownership and modes that identity needs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pgqueue.errors import EmbeddedPostgresError, pgqueue_logger

log = pgqueue_logger("pgqueue.embedded")

# The server's own account, and the shared one used when that cannot be created.
ACCOUNT = "pgqueue-embedded"
FALLBACK_ACCOUNT: Final = "nobody"
# How the account is created: a system account with a group of its own, no home, no login.
USERADD: tuple[str, ...] = (
    "useradd",
    "--system",
    "--user-group",
    "--no-create-home",
    "--home-dir",
    "/nonexistent",
    "--shell",
    "/usr/sbin/nologin",
)
# The environment of useradd: root's usual PATH, whatever this process was started with.
_USERADD_ENV: Final = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


@dataclass(frozen=True)
class RunAs:
    """The unprivileged identity initdb/postgres run as when this process is root."""

    name: str
    uid: int
    gid: int


# The identity chosen for this process (resolved once: one useradd, at most one WARNING).
_chosen: RunAs | None = None
_chosen_lock = threading.Lock()


def run_as() -> RunAs | None:
    """The identity to run the server as: the server's own account (created if missing) when
    this process is root, ``nobody`` when that account cannot be created; None when not root."""
    global _chosen
    if os.geteuid() != 0:
        return None
    with _chosen_lock:
        if _chosen is None:
            _chosen = _own_account() or _fallback_account()
        return _chosen


def _identity(name: str) -> RunAs | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    # The account's primary group. With extra_groups=[] the child has exactly this one group,
    # which is what blocking_ancestor's mode-bit check assumes.
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def _own_account() -> RunAs | None:
    """``ACCOUNT``, created with ``USERADD`` if it does not exist; None if it cannot be."""
    found = _identity(ACCOUNT)
    if found is not None:
        return found
    try:
        result = subprocess.run(
            [*USERADD, ACCOUNT],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            cwd="/",
            env=dict(_USERADD_ENV),
        )
        problem = (result.stderr or result.stdout).strip() or f"exit code {result.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        problem = str(exc)
    # Looked up again whatever useradd said: another process may have created it meanwhile.
    found = _identity(ACCOUNT)
    if found is None:
        log.warning(
            "the embedded PostgreSQL server runs as %r, a uid other daemons may share and "
            "that can then read its data directory: its own account %r could not be created "
            "(%s); create it with `%s %s`",
            FALLBACK_ACCOUNT,
            ACCOUNT,
            problem,
            " ".join(USERADD),
            ACCOUNT,
        )
    return found


def _fallback_account() -> RunAs:
    found = _identity(FALLBACK_ACCOUNT)
    if found is None:
        raise EmbeddedPostgresError(
            f"running as root, and PostgreSQL refuses root; neither {ACCOUNT!r} (which could "
            f"not be created) nor {FALLBACK_ACCOUNT!r} exists to run it as"
        )
    return found


def identity_kwargs(run_as: RunAs | None) -> dict[str, Any]:
    """The :mod:`subprocess` keyword arguments that make a child run as ``run_as``."""
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


def blocking_ancestor(path: Path, run_as: RunAs) -> Path | None:
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


def write_private(path: Path, text: str, run_as: RunAs | None) -> None:
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


def make_dirs(path: Path) -> None:
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
