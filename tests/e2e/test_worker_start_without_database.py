"""A ``pgqueue worker`` started while its database cannot be reached: by default one line naming
the connection and exit code 2 (a process manager restarts it); with ``--wait-for-database`` it
waits, one line per failed try at a bounded rate, and checks the schema once the server answers.
Its own embedded server, stopped and started by the test; real worker subprocesses."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgqueue import JobState, PgQueue
from pgqueue.database_urls import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres
from pgqueue.testing import wait_for_states

APP = """
import os

from pgqueue import PgQueue

pgq = PgQueue(os.environ["DB_URL"])


@pgq.task(name="noop")
def noop():
    return None
"""


@pytest.fixture
def stopped_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A server of the test's own (stopping the session's would break other tests), created,
    then stopped; and its URL, which stays the same across restarts (a socket in its data
    directory)."""
    root = Path(tempfile.mkdtemp(prefix="pgqueue-start-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    url = normalize_database_url(server.url()).render_as_string(hide_password=False)
    server.stop()
    try:
        yield server, url
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _worker(tmp_path: Path, url: str, *options: str) -> subprocess.Popen[str]:
    (tmp_path / "start_app.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    env.update(DB_URL=url, PYTHONPATH=str(tmp_path))
    return subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "worker", "start_app:pgq", *options],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def _waiting_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "waiting for the database: " in line]


def _read_until_waiting(worker: subprocess.Popen[str], count: int) -> str:
    """The worker's output up to its ``count``-th line saying it waits for the database (all of
    it, if it ends sooner)."""
    assert worker.stderr is not None
    read: list[str] = []
    while len(_waiting_lines("".join(read))) < count:
        line = worker.stderr.readline()
        if not line:
            break
        read.append(line)
    return "".join(read)


def test_by_default_a_worker_exits_2_with_one_line(
    stopped_server: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    _, url = stopped_server
    worker = _worker(tmp_path, url)
    try:
        _, stderr = worker.communicate(timeout=60)
    finally:
        worker.kill()
    assert worker.returncode == 2, stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith("error: pgqueue connection to "), line
    assert "/postgres failed: " in line, line


def test_a_waiting_worker_starts_once_the_server_is_up_and_checks_the_schema(
    stopped_server: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    server, url = stopped_server
    # The database is not migrated yet: once the server is up, the worker refuses to start.
    worker = _worker(tmp_path, url, "--wait-for-database")
    try:
        early = _read_until_waiting(worker, 3)
        assert worker.poll() is None, early + worker.communicate()[1]
        # One line per try, each pause twice the last: after 0.5, 1, 2 and 4 s, then every 5 s.
        pauses = [line.rsplit("next try in ", 1)[1] for line in _waiting_lines(early)]
        assert pauses == ["0.5s", "1.0s", "2.0s"], early
        server.start()
        stderr = early + worker.communicate(timeout=60)[1]
    finally:
        worker.kill()
    assert worker.returncode == 2, stderr
    waiting = _waiting_lines(stderr)
    assert 3 <= len(waiting) <= 6, stderr
    assert all("pgqueue connection to " in line for line in waiting), waiting
    refusal = stderr.strip().splitlines()[-1]
    assert refusal.startswith("error: pgqueue's tables are missing"), refusal
    assert "run `pgqueue migrate`" in refusal
    assert " started: " not in stderr

    # Migrated, it runs jobs once the server is back.
    owner = PgQueue(url)
    owner.migrate()
    noop = owner.task(name="noop")(lambda: None)
    job = noop.enqueue()
    owner.dispose()
    server.stop()
    worker = _worker(tmp_path, url, "--wait-for-database", "60")
    try:
        early = _read_until_waiting(worker, 1)
        assert worker.poll() is None, early + worker.communicate()[1]
        server.start()
        checker = PgQueue(url)
        wait_for_states(checker, [job], {JobState.SUCCEEDED}, timeout=60)
        checker.dispose()
        worker.send_signal(signal.SIGTERM)
        stderr = early + worker.communicate(timeout=60)[1]
    finally:
        worker.kill()
    assert worker.returncode == 0, stderr
    assert _waiting_lines(stderr), stderr
    assert " started: " in stderr and " stopped: " in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_a_worker_waits_at_most_the_seconds_given(
    stopped_server: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    _, url = stopped_server
    began = time.monotonic()
    worker = _worker(tmp_path, url, "--wait-for-database", "3")
    try:
        _, stderr = worker.communicate(timeout=60)
    finally:
        worker.kill()
    ended = time.time()
    assert worker.returncode == 2, stderr
    assert time.monotonic() - began >= 3, stderr
    # The bound counts from the first failed connection, as the wait does: the interpreter's
    # start before it takes seconds on a loaded machine.
    first_warning = dt.datetime.strptime(
        _waiting_lines(stderr)[0][:23], "%Y-%m-%d %H:%M:%S,%f"
    ).timestamp()
    assert ended - first_warning < 10, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: pgqueue connection to "), last
    assert "Traceback" not in stderr, stderr
