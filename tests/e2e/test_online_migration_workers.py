"""``pgqueue migrate`` down and up across ``pgqueue_0025`` while a real worker runs jobs and the
application enqueues them: while each online index build waits for a transaction older than it,
new jobs are enqueued, claimed and completed; at the end every job ran exactly once.
"""

from __future__ import annotations

import subprocess
import threading
import time

from conftest import App
from sqlalchemy import create_engine
from support.locks import lock_waiters
from support.migration_runs import revision_of
from support.polling import wait_until
from support.processes import pgqueue_command

from pgqueue import migrations

BATCH = 50


def _migrate(app: App, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        pgqueue_command("migrate", *args),
        cwd=app.directory,
        env=app.env(database_url=app.url_string),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _build_waiting(app: App) -> bool:
    return bool(lock_waiters(app.engine, "CREATE INDEX CONCURRENTLY"))


def _older_transaction(app: App, started: threading.Event, release: threading.Event) -> None:
    """A transaction that writes a job and stays open until ``release``: each concurrent build
    that starts meanwhile waits for it."""
    # Not app.engine: its connections are in autocommit mode.
    engine = create_engine(app.url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO pgqueue_jobs (task_name, queue, state)"
                " VALUES ('other', 'q', 'succeeded')"
            )
            started.set()
            release.wait(120)
    finally:
        engine.dispose()


def _migrate_while_jobs_run(app: App, ids: list[int], *args: str) -> None:
    """Run ``pgqueue migrate ARGS`` held at its first concurrent build by an older transaction;
    meanwhile enqueue ``BATCH`` jobs and wait until the worker has completed them."""
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_older_transaction, args=(app, started, release))
    holder.start()
    try:
        assert started.wait(30)
        migration = _migrate(app, *args)
        try:
            wait_until(
                lambda: _build_waiting(app) or migration.poll() is not None,
                60,
                "a concurrent build waiting",
            )
            assert migration.poll() is None, migration.communicate()[0]
            batch = [app.module.work.enqueue() for _ in range(BATCH)]
            ids.extend(batch)
            # Claimed and completed while the build waits: the worker's writes are not held up.
            app.wait_final(batch, timeout=60)
            assert _build_waiting(app), "the build was still waiting"
        finally:
            release.set()
            holder.join(timeout=30)
        output, _ = migration.communicate(timeout=120)
    finally:
        release.set()
    assert migration.returncode == 0, output


def test_jobs_run_exactly_once_while_pgqueue_migrate_swaps_indexes_online(app: App) -> None:
    worker = app.start_worker("--concurrency", "4")
    app.wait_listening()
    ids = [app.module.work.enqueue() for _ in range(BATCH)]
    app.wait_final(ids, timeout=60)

    _migrate_while_jobs_run(app, ids, "downgrade", "pgqueue_0024", "--yes")
    assert revision_of(app.url) == "pgqueue_0024"
    _migrate_while_jobs_run(app, ids, "upgrade")
    assert revision_of(app.url) == migrations.head()

    # And after the swaps, through the new indexes.
    later = [app.module.work.enqueue() for _ in range(BATCH)]
    ids.extend(later)
    jobs = app.wait_final(ids, timeout=60)
    assert {job.state for job in jobs.values()} == {"succeeded"}
    assert {job.attempts for job in jobs.values()} == {1}
    assert app.done_counts() == dict.fromkeys(ids, 1)
    assert worker.popen.poll() is None, worker.log()
    time.sleep(0.2)
    log = worker.log()
    assert "ERROR" not in log and "Traceback" not in log, log
