"""Migrations on a live database: they run without pgqueue's ``statement_timeout`` (a long
index build completes), give up within ``migration_lock_timeout`` when another session holds a
lock they need (naming it in one line), and a downgrade that would delete data is refused
unless ``--yes`` is given. ``pgqueue migrate`` runs as a user runs it: a subprocess."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL
from support.migration_runs import lock_held, migrate, revision_of

from pgqueue import migrations

# A revision before 0006, whose upgrade builds indexes on pgqueue_jobs.
BEFORE_INDEXES = "pgqueue_0005"


@pytest.mark.slow
def test_a_migration_statement_longer_than_statement_timeout_completes(
    empty_database_url: URL, tmp_path: Path
) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, BEFORE_INDEXES)
    engine.dispose()
    # The index build of 0006 waits 1.5 s for a lock on pgqueue_jobs: longer than a 300 ms
    # statement_timeout, shorter than the lock timeout.
    with lock_held(empty_database_url, "LOCK TABLE pgqueue_jobs IN ROW EXCLUSIVE MODE", 1.5):
        result = migrate([], empty_database_url, tmp_path, PGQUEUE_STATEMENT_TIMEOUT_MS="300")
    assert result.returncode == 0, result.stderr
    assert revision_of(empty_database_url) == migrations.head()

    # The same from code, on a connection whose session statement_timeout is 300 ms.
    tiny = create_engine(empty_database_url, connect_args={"options": "-c statement_timeout=300"})
    try:
        with tiny.begin() as connection:
            migrations.downgrade(connection, BEFORE_INDEXES)
        with (
            lock_held(empty_database_url, "LOCK TABLE pgqueue_jobs IN ROW EXCLUSIVE MODE", 1.5),
            tiny.begin() as connection,
        ):
            migrations.upgrade(connection)
            # The caller's own settings are back once the revisions ran.
            assert connection.execute(text("SHOW statement_timeout")).scalar() == "300ms"
    finally:
        tiny.dispose()
    assert revision_of(empty_database_url) == migrations.head()


def test_a_lock_held_by_another_session_fails_migrate_within_the_lock_timeout(
    empty_database_url: URL, tmp_path: Path
) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, BEFORE_INDEXES)
    engine.dispose()
    # A transaction that wrote to pgqueue_jobs and stays open holds ROW EXCLUSIVE on it; the
    # index build of 0006 needs SHARE, so without a lock timeout it would wait the whole 20 s
    # (and block every worker queued behind it).
    with lock_held(empty_database_url, "LOCK TABLE pgqueue_jobs IN ROW EXCLUSIVE MODE", 20) as pid:
        started = time.monotonic()
        result = migrate([], empty_database_url, tmp_path, PGQUEUE_MIGRATION_LOCK_TIMEOUT="1")
        elapsed = time.monotonic() - started
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(output) == 1, output
    (line,) = output
    assert line.startswith("error: pgqueue migrate: waited 1 s"), line
    assert f"pid {pid}" in line, line
    assert "'report-job'" in line and "idle in transaction" in line, line
    assert elapsed < 10, elapsed  # the lock timeout, not the holder's 20 s
    assert revision_of(empty_database_url) == BEFORE_INDEXES  # nothing changed


def _history_rows(url: URL) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(text("SELECT count(*) FROM pgqueue_job_history")).scalar_one()
            )
    finally:
        engine.dispose()


@pytest.mark.slow
def test_downgrade_that_drops_history_rows_needs_yes(database_url: URL, tmp_path: Path) -> None:
    # Losing nothing needs no --yes: 0015's columns of the (empty) worker registry.
    result = migrate(["downgrade", "pgqueue_0014"], database_url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert revision_of(database_url) == "pgqueue_0014"
    engine = create_engine(database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection)
        connection.execute(
            text(
                """INSERT INTO pgqueue_job_history
                     (id, finished_at, task_name, queue, args, kwargs, state, priority, attempts,
                      max_attempts, run_at, created_at, updated_at, errors, cancel_requested,
                      atomic, awaited, snoozes)
                   VALUES (nextval('pgqueue_jobs_id_seq'), now(), 'history.kept', 'default',
                           '[]', '{}', 'succeeded', 0, 1, 3, now(), now(), now(), '[]', false,
                           false, false, 0)"""
            )
        )
    engine.dispose()

    refused = migrate(["downgrade", "pgqueue_0012"], database_url, tmp_path)
    output = (refused.stdout + refused.stderr).strip().splitlines()
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert len(output) == 1 and "Traceback" not in refused.stderr, output
    assert "pgqueue_0013 drops table pgqueue_job_history, which holds rows" in output[0]
    assert "--yes" in output[0]
    assert revision_of(database_url) == migrations.head()
    assert _history_rows(database_url) == 1

    done = migrate(["downgrade", "pgqueue_0012", "--yes"], database_url, tmp_path)
    assert done.returncode == 0, done.stderr
    assert revision_of(database_url) == "pgqueue_0012"
    engine = create_engine(database_url)
    try:
        assert "pgqueue_job_history" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
