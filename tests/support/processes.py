"""The ``pgqueue`` command run as a user runs it, in an environment that names the database and
the settings given and nothing else of the test run's (no ``PGQUEUE_`` variable leaks in), for
the tests that check what it does and shows: in the test's process as a fresh process runs it,
or as a real subprocess of this interpreter where the process itself is the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from support.cli_invoke import invoke


def pgqueue_command(*args: str) -> list[str]:
    """``python -m pgqueue ARGS`` with this interpreter."""
    return [sys.executable, "-m", "pgqueue", *args]


def pgqueue_env(url: URL | str | None = None, **settings: object) -> dict[str, str]:
    """This process's environment without its ``PGQUEUE_`` variables, with
    ``PGQUEUE_DATABASE_URL`` naming ``url`` (when given) and ``PGQUEUE_<NAME>`` for each of
    ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_")}
    if url is not None:
        env["PGQUEUE_DATABASE_URL"] = (
            url.render_as_string(hide_password=False) if isinstance(url, URL) else url
        )
    for name, value in settings.items():
        env[f"PGQUEUE_{name.upper()}"] = str(value)
    return env


def run_pgqueue(
    *args: str,
    url: URL | str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``pgqueue ARGS`` run to its end, its output captured as text, in ``env`` (by default
    ``pgqueue_env(url)``): in this process as a fresh process runs it (``cli_invoke``), or with
    ``process`` in a real one, stopped after ``timeout`` seconds (where the process is the
    point: its signals, its exit, its own logging, a worker beside the test's)."""
    environment = dict(env) if env is not None else pgqueue_env(url)
    if not process:
        return invoke(["-m", "pgqueue", *args], env=environment, cwd=cwd)
    return subprocess.run(
        pgqueue_command(*args),
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def shown_as_json(database_url: URL, job_id: int) -> dict[str, Any]:
    """``pgqueue show JOB_ID --json``'s record of the job; the command must succeed."""
    shown = run_pgqueue("show", str(job_id), "--json", url=database_url)
    assert shown.returncode == 0, shown.stderr[-2000:]
    record: dict[str, Any] = json.loads(shown.stdout)
    return record
