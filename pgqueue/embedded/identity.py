"""Who the embedded server runs as, and the files and directories made for it.

PostgreSQL refuses to run as root, so a root process runs ``initdb``/``postgres`` as
``nobody``. This module resolves that identity, checks that it can traverse a path, and
creates files and directories with the ownership and modes that identity needs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pgqueue.errors import EmbeddedPostgresError

RUN_AS_USER: Final = "nobody"


@dataclass(frozen=True)
class RunAs:
    """The unprivileged identity initdb/postgres run as when this process is root."""

    uid: int
    gid: int


def run_as() -> RunAs | None:
    """The identity to run the server as: ``nobody`` when this process is root, else None."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(RUN_AS_USER)
    except KeyError:
        raise EmbeddedPostgresError(
            f"running as root, and PostgreSQL refuses root; no {RUN_AS_USER!r} user to run it as"
        ) from None
    # nobody's primary group (Debian: nogroup). With extra_groups=[] the child has exactly this
    # one group, which is what blocking_ancestor's mode-bit check assumes.
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


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
