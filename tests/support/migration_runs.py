"""``pgqueue migrate`` as a user runs it (a subprocess), the revision a database records, and
another session holding a lock meanwhile: shared by the tests of migrations on a live database."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from pgqueue import migrations
from support.processes import pgqueue_env, run_pgqueue


def migrate(
    args: list[str], url: URL, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """``pgqueue migrate ARGS`` on the database at ``url``, with ``env`` added."""
    return run_pgqueue("migrate", *args, env={**pgqueue_env(url), **env}, cwd=tmp_path)


def migrated_to(url: URL, revision: str) -> None:
    """Upgrade the database at ``url`` to ``revision``, in a transaction of its own."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            migrations.upgrade(connection, revision)
    finally:
        engine.dispose()


def rows_of(url: URL, sql: str) -> list[Any]:
    """The rows ``sql`` reads from the database at ``url``."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(sql)).all())
    finally:
        engine.dispose()


def revision_of(url: URL) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return migrations.current(connection)
    finally:
        engine.dispose()


@contextmanager
def lock_held(url: URL, statement: str, seconds: float) -> Iterator[int]:
    """Another session (application_name ``report-job``) takes a lock with ``statement`` and
    holds it, idle in its transaction, for ``seconds`` or until the block ends; yields its pid
    once the lock is held."""
    engine = create_engine(url, connect_args={"application_name": "report-job"})
    held = threading.Event()
    release = threading.Event()
    pid: list[int] = []

    def hold() -> None:
        with engine.begin() as connection:
            pid.append(int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            connection.execute(text(statement))
            held.set()
            release.wait(seconds)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert held.wait(30), "the lock was not taken"
        yield pid[0]
    finally:
        release.set()
        thread.join(timeout=30)
        engine.dispose()
