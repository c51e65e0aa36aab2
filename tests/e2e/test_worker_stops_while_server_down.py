"""A ``pgqueue worker`` told to stop while its database server is down stops with warning lines
(its stop and stopped lines, the failures it retried), and no traceback: a lost connection is
the expected state then, not a bug."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pgqueue import PgQueue
from pgqueue.config import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres

APP = """
import os

from pgqueue import PgQueue

pgq = PgQueue(os.environ["DB_URL"])
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
        worker = subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "worker", "down_app:pgq", "--shutdown-timeout", "1"],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)
        server.stop()
        time.sleep(4)
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert worker.returncode == 0, stderr
    assert " started: " in stderr and " stopped: " in stderr, stderr
    assert "Traceback" not in stderr, stderr
