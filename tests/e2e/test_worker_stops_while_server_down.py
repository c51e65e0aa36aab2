"""A ``pgqueue worker`` told to stop while its database server is down stops with no traceback (a
lost connection is the expected state then, not a bug), and with a job still running it says
so in one line: the release could not be written, and when the job's lease expires. It does not
wait for the server beyond a few seconds."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_until
from support.processes import pgqueue_command, pgqueue_env

from pgqueue import JobState, PgQueue
from pgqueue.database_urls import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres

APP = """
import os
import time

from pgqueue import PgQueue

pgq = PgQueue(os.environ["DB_URL"])


@pgq.task(name="slow")
def slow():
    open("slow.started", "w").close()
    time.sleep(120)
"""


WORKER = pgqueue_command("worker", "down_app:pgq", "--shutdown-timeout", "1")


@pytest.fixture
def own_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A migrated database on a server of the test's own (stopping the session's shared one
    would break every other test), and its URL, the same across restarts."""
    root = Path(tempfile.mkdtemp(prefix="pgqueue-down-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    try:
        url = normalize_database_url(server.url()).render_as_string(hide_password=False)
        owner = PgQueue(url)
        owner.migrate()
        owner.dispose()
        yield server, url
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts ``pgqueue worker down_app:pgq --shutdown-timeout 1 OPTIONS`` with its stderr in
    ``tmp_path / "worker.log"``; kills it (by PID) if the test left it running."""
    workers: list[subprocess.Popen[str]] = []
    (tmp_path / "down_app.py").write_text(APP)

    def start(url: str, *options: str, **env_vars: str) -> subprocess.Popen[str]:
        env = pgqueue_env()
        env.update(DB_URL=url, PYTHONPATH=str(tmp_path), **env_vars)
        with (tmp_path / "worker.log").open("w") as out:
            worker = subprocess.Popen(
                [*WORKER, *options],
                cwd=tmp_path,
                env=env,
                stderr=out,
                text=True,
            )
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        if worker.poll() is None:
            worker.kill()


def test_sigterm_while_the_server_is_down_logs_no_traceback(
    own_server: tuple[EmbeddedPostgres, str], start_worker: Any, tmp_path: Path
) -> None:
    server, url = own_server
    # Maintenance passes run (and retry their lost connection) often, as in production over
    # the minutes a server may be down.
    worker = start_worker(url, PGQUEUE_RESCUE_INTERVAL="0.2")
    log = tmp_path / "worker.log"
    # Started (a worker that cannot reach its database as it starts exits instead).
    wait_until(
        lambda: " started: " in log.read_text() or worker.poll() is not None,
        30,
        "the worker to start",
        0.1,
    )
    assert worker.poll() is None, log.read_text()
    server.stop()
    time.sleep(4)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    stderr = log.read_text()
    assert worker.returncode == 0, stderr
    assert " started: " in stderr and " stopped: " in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_sigterm_with_a_job_running_while_the_server_is_down_logs_one_line(
    own_server: tuple[EmbeddedPostgres, str], start_worker: Any, tmp_path: Path
) -> None:
    server, url = own_server
    owner = PgQueue(url)
    job_id = owner.task(name="slow")(lambda: None).enqueue()
    worker = start_worker(url, "--lease-seconds", "20")
    # Running in the worker, not only claimed: a claim whose answer the server's stop cuts off
    # leaves its job to its lease, which is not what this test is about.
    wait_until(
        lambda: (tmp_path / "slow.started").exists() or worker.poll() is not None,
        30,
        "the job to run in the worker",
        0.1,
    )
    assert worker.poll() is None
    assert owner.get_job(job_id).state is JobState.RUNNING
    owner.dispose()
    server.stop()
    time.sleep(3)
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    stopped_in = time.monotonic() - signalled
    stderr = (tmp_path / "worker.log").read_text()
    server.start()
    owner = PgQueue(url)
    job = owner.get_job(job_id)
    owner.dispose()
    assert worker.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    # One second for the job, a few for the server: not the 30 s a write may take otherwise.
    assert stopped_in < 12, (stopped_in, stderr)
    lines = stderr.strip().splitlines()
    signal_line = next(i for i, line in enumerate(lines) if "signal 15: stopping" in line)
    after = lines[signal_line + 1 :]
    assert " stopped: " in after[-1], stderr
    assert len(after) == 3, stderr
    assert after[0].endswith(f" INFO pgqueue.worker: waiting up to 1s for job {job_id} to finish")
    line = after[1]
    assert " WARNING " in line, line
    assert "shutdown: database unavailable (" in line, line
    assert f"could not write the outcome of 1 job: {job_id} (slow, still running)" in line, line
    expiry = re.search(r"its lease expires by (\S+ \S+) UTC", line)
    assert expiry is not None, line
    said = dt.datetime.fromisoformat(expiry.group(1)).replace(tzinfo=dt.UTC)
    # The release was never written: the job waits for its lease, which ends by the time said.
    assert job.state is JobState.RUNNING
    assert job.lease_expires_at is not None and job.lease_expires_at <= said, (job, line)
