"""Databases on the test server and the example applications' own test runs, shared by the
tiers' conftest files and tests (imported as a top-level module: ``tests`` is on the path, and a
name other than ``conftest`` is not shadowed by the e2e tier's)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from support.polling import wait_until

_counter = itertools.count()


def admin_engine(server_url: URL) -> Engine:
    """An autocommit engine on the server, for CREATE/DROP DATABASE."""
    return create_engine(server_url, isolation_level="AUTOCOMMIT")


def count_on(url: URL, sql: str, **params: object) -> int:
    """The integer ``sql`` returns on ``url``, read on a connection of its own in autocommit."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            return int(connection.execute(text(sql), params).scalar_one())
    finally:
        engine.dispose()


def wait_until_backend_gone(url: URL, pid: int) -> None:
    """Wait up to 10 s for the server of ``url`` to have no backend ``pid``."""
    wait_until(
        lambda: (
            not count_on(url, "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid", pid=pid)
        ),
        10,
        f"backend {pid} to end",
        interval=0.02,
    )


def run_example_tests(example: Path, server_url: str) -> subprocess.CompletedProcess[str]:
    """``pytest`` run in the example application ``example``, as its README says, making its
    databases on the server ``server_url``; asserts it passed and returns it."""
    env = dict(os.environ, PGQUEUE_TEST_DATABASE_URL=server_url)
    env.pop("DATABASE_URL", None)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=example,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed


def create_database(server_url: URL, template: str | None) -> URL:
    name = f"pgqueue_test_{os.getpid()}_{next(_counter)}"
    admin = admin_engine(server_url)
    with admin.connect() as connection:
        clause = f' TEMPLATE "{template}"' if template else ""
        connection.execute(text(f'CREATE DATABASE "{name}"{clause}'))
    admin.dispose()
    return server_url.set(database=name)


def drop_database(server_url: URL, url: URL) -> None:
    admin = admin_engine(server_url)
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()
