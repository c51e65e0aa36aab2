"""End-to-end fixtures: real ``python -m pgqueue worker`` subprocesses against a fresh database.

``app`` writes a small application module (``e2eapp.py``) into ``tmp_path``, creates a ``ledger``
table that its handlers write to, and returns an :class:`App`: the same module imported in the
test process (to enqueue with the very same task objects), plus helpers to start, signal and
reap worker processes. Every worker started here is killed (by PID) when the test ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from server_databases import create_database, drop_database
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from support.network import free_port
from support.polling import wait_until
from support.processes import pgqueue_command, pgqueue_env
from support.serving_modes import MODES, Mounted, mounted

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from pgqueue import PgQueue

APP_SOURCE = '''
"""Tasks run by the e2e worker subprocesses. Every handler leaves rows in ``ledger``."""

import asyncio
import gc
import os
import random
import threading
import time

from sqlalchemy import text

from pgqueue import PgQueue, Settings, backoff

pgq = PgQueue(os.environ["DB_URL"], settings=Settings.from_env())

INSERT = text(
    "INSERT INTO ledger (job_id, attempt, tag, pid, info) VALUES (:job, :attempt, :tag, :pid, :info)"
)


def mark(ctx, tag, info=""):
    """Committed at once on its own connection: visible while the handler still runs."""
    with pgq.handler_engine.begin() as connection:
        connection.execute(
            INSERT,
            {"job": ctx.job_id, "attempt": ctx.attempt, "tag": tag, "pid": os.getpid(), "info": info},
        )


@pgq.task(name="record", pass_context=True)
def record(ctx, secret=""):
    # In the handler's session: committed by pgqueue when the handler returns.
    ctx.session.execute(
        INSERT,
        {"job": ctx.job_id, "attempt": ctx.attempt, "tag": "done", "pid": os.getpid(), "info": ""},
    )
    return {"pid": os.getpid()}


STARTS = text("SELECT count(*) FROM ledger WHERE job_id = :job AND tag = 'start'")


@pgq.task(name="sleep", pass_context=True, max_attempts=5)
def sleep(ctx, seconds, first_run_only=False):
    mark(ctx, "start")
    with pgq.handler_engine.connect() as connection:
        runs = connection.execute(STARTS, {"job": ctx.job_id}).scalar_one()
    if not first_run_only or runs == 1:
        time.sleep(seconds)
    mark(ctx, "end")
    return {"pid": os.getpid(), "attempt": ctx.attempt}


# Registered only where E2E_ATOMIC=1 (the test process, and the workers of the tests that use
# it): a worker with an atomic task also claims atomic work on each poll, which the idle-load
# test does not count on.
if os.environ.get("E2E_ATOMIC") == "1":
    @pgq.task(name="atomic_sleep", atomic=True, pass_context=True, max_attempts=2)
    def atomic_sleep(ctx, seconds):
        """An atomic job: a committed 'start' mark, a sleep on its first run only, a 'done'
        row in its own transaction."""
        mark(ctx, "start")
        with pgq.handler_engine.connect() as connection:
            runs = connection.execute(STARTS, {"job": ctx.job_id}).scalar_one()
        if runs == 1:
            time.sleep(seconds)
        ctx.session.execute(
            INSERT,
            {"job": ctx.job_id, "attempt": ctx.attempt, "tag": "done", "pid": os.getpid(), "info": ""},
        )


@pgq.task(name="die", pass_context=True, max_attempts=3)
def die(ctx):
    mark(ctx, "start")
    os._exit(1)


@pgq.task(name="healthy", pass_context=True, max_attempts=10)
def healthy(ctx):
    mark(ctx, "done")


@pgq.task(name="slow_sync", pass_context=True, max_attempts=1, timeout=0.5)
def slow_sync(ctx):
    """Deaf to its timeout: returns 3 s after it (in a thread; in a child it is stopped)."""
    mark(ctx, "start")
    time.sleep(3.5)
    mark(ctx, "after deadline")


@pgq.task(name="work", pass_context=True, max_attempts=25, retry=backoff.constant(0.2))
def work(ctx, seconds=0.0, start_mark=False):
    """The fault tests' job: an optional committed 'start' mark, a sleep, a 'done' row."""
    if start_mark:
        mark(ctx, "start")
    if seconds:
        time.sleep(seconds)
    ctx.session.execute(
        INSERT,
        {"job": ctx.job_id, "attempt": ctx.attempt, "tag": "done", "pid": os.getpid(), "info": ""},
    )


@pgq.task(name="member", max_attempts=25, retry=backoff.constant(0.05))
def member(x, seconds=0.0):
    """A workflow member: its argument back, after ``seconds``."""
    if seconds:
        time.sleep(seconds)
    return x


@pgq.task(name="await_go", pass_context=True)
def await_go(ctx):
    """Suspends (holding no slot) until signal 'go' is sent; returns its payload."""
    return ctx.wait_for_signal("go", timeout=3600)


@pgq.task(name="gather", pass_context=True, max_attempts=25, retry=backoff.constant(0.05))
def gather(ctx, results):
    """A chord's callback: a committed 'callback' mark per run, with how many results it got
    and whether they were 0, 1, 2, ... in order."""
    ordered = results == list(range(len(results)))
    mark(ctx, "callback", f"{len(results)} {ordered}")
    return len(results)


@pgq.task(name="flaky", pass_context=True, max_attempts=2, retry=backoff.constant(0.05))
def flaky(ctx, seconds=0.0, fail_ratio=0.5):
    """Fails ``fail_ratio`` of its runs (so some jobs end FAILED), else writes a 'done' row."""
    time.sleep(seconds)
    if random.random() < fail_ratio:
        raise RuntimeError("flaky job failed on purpose")
    ctx.session.execute(
        INSERT,
        {"job": ctx.job_id, "attempt": ctx.attempt, "tag": "done", "pid": os.getpid(), "info": ""},
    )


@pgq.task(name="heap_state", pass_context=True)
def heap_state(ctx):
    """The garbage collector as the handler finds it in its worker process."""
    return {"pid": os.getpid(), "frozen": gc.get_freeze_count(), "enabled": gc.isenabled()}


@pgq.task(name="async_info", pass_context=True)
async def async_info(ctx):
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    info = f"{threading.current_thread().name} {id(loop)}"
    await asyncio.to_thread(mark, ctx, "async", info)
    return info


@pgq.task(name="async_slow", pass_context=True, max_attempts=2, timeout=0.3)
async def async_slow(ctx):
    await asyncio.to_thread(mark, ctx, "start")
    await asyncio.sleep(30)
'''

LEDGER_DDL = """
CREATE TABLE ledger (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    tag text NOT NULL,
    pid int NOT NULL,
    info text NOT NULL DEFAULT '',
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


@dataclass
class WorkerProcess:
    """One ``pgqueue worker`` subprocess and where its output goes."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


@dataclass
class App:
    """The application module, its database, and the worker processes started for it."""

    directory: Path
    url: URL
    module: ModuleType
    engine: Engine
    processes: list[WorkerProcess] = field(default_factory=list)

    @property
    def url_string(self) -> str:
        return self.url.render_as_string(hide_password=False)

    def env(self, **settings: Any) -> dict[str, str]:
        """The workers' environment: ``DB_URL`` for the module, ``PGQUEUE_<SETTING>``s."""
        return {**pgqueue_env(**settings), "DB_URL": self.url_string, "PYTHONUNBUFFERED": "1"}

    def start_worker(self, *args: str, **settings: Any) -> WorkerProcess:
        """``python -m pgqueue worker e2eapp:pgq ARGS`` with ``PGQUEUE_<SETTING>`` variables."""
        return self.start_worker_with_env(self.env(**settings), *args)

    def start_worker_with_env(self, env: dict[str, str], *args: str) -> WorkerProcess:
        """``python -m pgqueue worker e2eapp:pgq ARGS`` in the environment ``env``."""
        log_path = self.directory / f"worker-{len(self.processes)}.log"
        with log_path.open("wb") as out:
            popen = subprocess.Popen(
                pgqueue_command("worker", "e2eapp:pgq", *args),
                cwd=self.directory,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        process = WorkerProcess(popen, log_path)
        self.processes.append(process)
        return process

    def enqueue_stand_in(self, task: str, source: str) -> int:
        """Enqueue ``task`` by name: ``source``, which defines it, is added once to the workers'
        module, and the test process registers a stand-in under that name (only the worker
        processes run the real one)."""
        module = self.directory / "e2eapp.py"
        if source not in module.read_text():
            with module.open("a") as out:
                out.write(source)

        @self.module.pgq.task(name=task, pass_context=True)
        def stand_in(ctx: object) -> None:
            raise AssertionError("runs in the worker processes only")

        return int(stand_in.enqueue())

    def drain_through_bouncer(self, bouncer: URL) -> tuple[int, str]:
        """Two worker processes of eight threads each, through the PgBouncer at ``bouncer``
        (transaction mode, polling), run until nothing is ready: their exit code and output."""
        env = self.env(pooler="transaction")
        env["DB_URL"] = bouncer.render_as_string(hide_password=False)
        log = self.directory / "bouncer-worker.log"
        with log.open("wb") as out:
            finished = subprocess.run(
                pgqueue_command(
                    *("worker", "e2eapp:pgq", "--processes", "2", "--no-listen"),
                    *("--concurrency", "8", "--drain", "--poll-interval", "0.2"),
                ),
                cwd=self.directory,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=240,
            )
        return finished.returncode, log.read_text()

    def wait_listening(self, count: int = 1, timeout: float = 30.0) -> list[int]:
        """Wait until ``count`` listener connections have run LISTEN; return their backend pids."""

        def listening() -> list[int]:
            rows = self.scalars(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'pgqueue-listener' AND query ILIKE 'LISTEN%'"
            )
            return rows if len(rows) >= count else []

        return list(wait_until(listening, timeout, f"{count} listening workers"))

    wait_until = staticmethod(wait_until)
    children_of = staticmethod(lambda pid: children_of(pid))

    def scalars(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as connection:
            return list(connection.execute(text(sql), params).scalars())

    def rows(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as connection:
            return list(connection.execute(text(sql), params).all())

    def execute(self, sql: str, **params: Any) -> None:
        with self.engine.begin() as connection:
            connection.execute(text(sql), params)

    def ledger(self, tag: str | None = None) -> list[Any]:
        if tag is None:
            return self.rows("SELECT job_id, attempt, tag, pid, info, at FROM ledger ORDER BY id")
        return self.rows(
            "SELECT job_id, attempt, tag, pid, info, at FROM ledger WHERE tag = :tag ORDER BY id",
            tag=tag,
        )

    def jobs(self, ids: list[int] | None = None) -> dict[int, Any]:
        rows = self.rows(
            "SELECT id, state, attempts, last_error, errors, result, finished_at, lease_token "
            "FROM pgqueue_jobs" + ("" if ids is None else " WHERE id = ANY(:ids)"),
            **({} if ids is None else {"ids": ids}),
        )
        return {row.id: row for row in rows}

    def wait_final(self, ids: list[int], timeout: float) -> dict[int, Any]:
        def final() -> dict[int, Any] | None:
            jobs = self.jobs(ids)
            done = all(j.state in ("succeeded", "failed", "cancelled") for j in jobs.values())
            return jobs if done and len(jobs) == len(ids) else None

        return dict(wait_until(final, timeout, f"{len(ids)} jobs to finish", interval=0.1))

    def wait_all_final(self, count: int, timeout: float) -> None:
        """Wait until the database holds ``count`` jobs and every one is in a final state.

        Counts in SQL (cheap to poll every 0.2 s with thousands of jobs)."""

        def final() -> bool:
            [(total, open_)] = self.rows(
                "SELECT count(*), count(*) FILTER (WHERE state NOT IN "
                "('succeeded', 'failed', 'cancelled')) FROM pgqueue_jobs"
            )
            return bool(total == count and open_ == 0)

        wait_until(final, timeout, f"{count} jobs to finish", interval=0.2)

    def done_counts(self) -> dict[int, int]:
        """``job_id -> number of committed 'done' rows`` (a run that completed its handler)."""
        return dict(self.rows("SELECT job_id, count(*) FROM ledger WHERE tag = 'done' GROUP BY 1"))

    def kill_all(self) -> None:
        for process in self.processes:
            if process.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGCONT)  # a SIGSTOPped one must die too
                    for child in children_of(process.pid):
                        os.kill(child, signal.SIGKILL)
                    process.popen.kill()
                process.popen.wait(timeout=30)


def children_of(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc; no extra dependency)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces: fields after the last ')' are fixed.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def load_module(directory: Path, url: URL) -> ModuleType:
    """Import ``e2eapp.py`` in the test process under a unique name (one per test)."""
    name = f"e2eapp_{directory.name}_{id(directory)}"
    spec = importlib.util.spec_from_file_location(name, directory / "e2eapp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # The test process enqueues every task, the atomic one included.
    values = {"DB_URL": url.render_as_string(hide_password=False), "E2E_ATOMIC": "1"}
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return module


@contextlib.contextmanager
def running_app(directory: Path, url: URL) -> Iterator[App]:
    """Write the application module for the database at ``url``; kill its workers at the end."""
    (directory / "e2eapp.py").write_text(APP_SOURCE)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(LEDGER_DDL))
    module = load_module(directory, url)
    application = App(directory, url, module, engine)
    try:
        yield application
    finally:
        application.kill_all()
        module.pgq.dispose()
        engine.dispose()


@pytest.fixture
def app(tmp_path: Path, database_url: URL) -> Iterator[App]:
    with running_app(tmp_path, database_url) as application:
        yield application


@pytest.fixture
def app_factory() -> Callable[[Path, URL], contextlib.AbstractContextManager[App]]:
    """``running_app`` for tests that bring their own database (e.g. their own server)."""
    return running_app


@pytest.fixture
def bouncer_login(server_tcp_url: URL) -> URL:
    """Who the ``bouncer`` logs in to the server as, and its clients as: the test server's own
    user. A test module overrides this fixture to go through the pooler as another role."""
    return server_tcp_url


@pytest.fixture
def bouncer(app: App, server_tcp_url: URL, bouncer_login: URL) -> Iterator[URL]:
    """A PgBouncer in transaction mode in front of the test database; yields its URL."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert Path(binary).exists(), "install Debian's pgbouncer (.ci/run does)"
    # Over TCP: under root PgBouncer runs as nobody, which the server's socket does not admit.
    server = server_tcp_url.set(database=app.url.database)
    user = bouncer_login.username
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="pgqueue-bouncer-"))
    directory.chmod(0o755)
    password = f" password={bouncer_login.password}" if bouncer_login.password else ""
    # server_round_robin: each transaction goes to the pool's next idle server session, as on a
    # busy pool, not back to the one the client's last transaction used (PgBouncer's default),
    # so whatever a transaction relies on from an earlier one's session fails here too.
    (directory / "pgbouncer.ini").write_text(
        f"""[databases]
{server.database} = host={server.host or "127.0.0.1"} port={server.port} user={user}{password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/users.txt
pool_mode = transaction
server_round_robin = 1
max_client_conn = 200
default_pool_size = 10
"""
    )
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    as_nobody = {"user": "nobody", "group": "nogroup"} if os.geteuid() == 0 else {}
    process = subprocess.Popen(
        [binary, str(directory / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=(directory / "log").open("wb"),
        **as_nobody,  # type: ignore[arg-type]
    )
    url = app.url.set(host="127.0.0.1", port=port, username=user, password=None, query={})

    def accepting() -> bool:
        if process.poll() is not None:
            raise AssertionError((directory / "log").read_text())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_until(accepting, 10, f"PgBouncer to accept connections on port {port}")
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


# -- the dashboard under each serving mode, for browser tests ----------------------------------
# A module using ``served`` defines ``pgq`` (module-scoped, on ``url``): its tasks and schedules
# are what the FastAPI mode's dashboard knows. Each module gets one database, one browser and one
# server per mode.


@pytest.fixture(scope="module")
def url(server_url: URL, template_name: str) -> Iterator[URL]:
    database = create_database(server_url, template_name)
    yield database
    drop_database(server_url, database)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright
    from support.dashboard import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module", params=MODES)
def served(
    request: pytest.FixtureRequest, url: URL, pgq: PgQueue, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Mounted]]:
    mode = request.param
    for dashboard in mounted(mode, url, pgq, tmp_path_factory.mktemp(mode)):
        yield mode, dashboard


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()
