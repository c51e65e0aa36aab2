"""A ``pgqueue worker`` told to stop while its database server is down stops with no traceback (a
lost connection is the expected state then, not a bug), and with a job still running it says
so in one line: the release could not be written, and when the job's lease expires. It does not
wait for the server beyond a few seconds."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgqueue import JobState, PgQueue
from pgqueue.config import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres

APP = """
import os
import time

from pgqueue import PgQueue

pgq = PgQueue(os.environ["DB_URL"])


@pgq.task(name="slow")
def slow():
    time.sleep(120)
"""


def test_sigterm_while_the_server_is_down_logs_no_traceback(tmp_path: Path) -> None:
    # Its own server: stopping the session's shared one would break every other test.
    root = Path(tempfile.mkdtemp(prefix="pgqueue-down-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    worker: subprocess.Popen[str] | None = None
    try:
        url = normalize_database_url(server.url()).render_as_string(hide_password=False)
        owner = PgQueue(url)
        owner.migrate()
        owner.dispose()
        (tmp_path / "down_app.py").write_text(APP)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
        # Maintenance passes run (and retry their lost connection) often, as in production
        # over the minutes a server may be down.
        env.update(DB_URL=url, PYTHONPATH=str(tmp_path), PGQUEUE_RESCUE_INTERVAL="0.2")
        log = tmp_path / "worker.log"
        with log.open("w") as out:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pgqueue",
                    "worker",
                    "down_app:pgq",
                    "--shutdown-timeout",
                    "1",
                ],
                cwd=tmp_path,
                env=env,
                stderr=out,
                text=True,
            )
        # Started (a worker that cannot reach its database as it starts exits instead).
        deadline = time.monotonic() + 30
        while " started: " not in log.read_text():
            assert time.monotonic() < deadline and worker.poll() is None, log.read_text()
            time.sleep(0.1)
        server.stop()
        time.sleep(4)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        stderr = log.read_text()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert worker.returncode == 0, stderr
    assert " started: " in stderr and " stopped: " in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_sigterm_with_a_job_running_while_the_server_is_down_logs_one_line(
    tmp_path: Path,
) -> None:
    root = Path(tempfile.mkdtemp(prefix="pgqueue-down-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    worker: subprocess.Popen[str] | None = None
    try:
        url = normalize_database_url(server.url()).render_as_string(hide_password=False)
        owner = PgQueue(url)
        owner.migrate()
        job_id = owner.task(name="slow")(lambda: None).enqueue()
        (tmp_path / "down_app.py").write_text(APP)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
        env.update(DB_URL=url, PYTHONPATH=str(tmp_path))
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgqueue",
                "worker",
                "down_app:pgq",
                "--shutdown-timeout",
                "1",
                "--lease-seconds",
                "20",
            ],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while owner.get_job(job_id).state is not JobState.RUNNING:
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.1)
        owner.dispose()
        server.stop()
        time.sleep(3)
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
        stopped_in = time.monotonic() - signalled
        server.start()
        owner = PgQueue(url)
        job = owner.get_job(job_id)
        owner.dispose()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert worker.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    # One second for the job, a few for the server: not the 30 s a write may take otherwise.
    assert stopped_in < 12, (stopped_in, stderr)
    lines = stderr.strip().splitlines()
    signal_line = next(i for i, line in enumerate(lines) if "signal 15: stopping" in line)
    after = lines[signal_line + 1 :]
    assert " stopped: " in after[-1], stderr
    [line] = after[:-1]
    assert " WARNING " in line, line
    assert "shutdown: database unavailable (" in line, line
    assert f"could not write the outcome of 1 job: {job_id} (slow, still running)" in line, line
    expiry = re.search(r"its lease expires by (\S+ \S+) UTC", line)
    assert expiry is not None, line
    said = dt.datetime.fromisoformat(expiry.group(1)).replace(tzinfo=dt.UTC)
    # The release was never written: the job waits for its lease, which ends by the time said.
    assert job.state is JobState.RUNNING
    assert job.lease_expires_at is not None and job.lease_expires_at <= said, (job, line)
