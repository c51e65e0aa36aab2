"""The ``pgqueue`` command run as a user runs it (a subprocess, the database named by
``PGQUEUE_DATABASE_URL``), for the tests that check what it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from sqlalchemy.engine import URL


def shown_as_json(database_url: URL, job_id: int) -> dict[str, Any]:
    """``pgqueue show JOB_ID --json``'s record of the job; the command must succeed."""
    shown = subprocess.run(
        [sys.executable, "-m", "pgqueue", "show", str(job_id), "--json"],
        env={
            **os.environ,
            "PGQUEUE_DATABASE_URL": database_url.render_as_string(hide_password=False),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    record: dict[str, Any] = json.loads(shown.stdout)
    return record
