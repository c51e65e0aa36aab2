"""Retention: finished jobs are pruned after a configurable age, in batches.

Jobs are staged with SQL and their ``finished_at`` backdated by the database clock. Succeeded
jobs go after ``Settings.succeeded_retention`` (default 7 days), failed and cancelled ones after
``failed_retention`` (default 30 days). Pruning runs from ``pgq.prune()``, from a worker's
maintenance loop and from ``pgqueue prune``, deletes in batches, and never touches a waiting or
running job, however old (even one whose ``finished_at`` was set by hand).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import URL
from support.polling import wait_until
from support.processes import pgqueue_env, run_pgqueue
from support.workers import in_thread

from pgqueue import PgQueue, Settings
from pgqueue.worker import Worker

DAY = 86_400.0


def stage(
    engine: Engine,
    state: str,
    finished_age: float | None,
    count: int = 1,
    *,
    created_age: float = 400 * DAY,
) -> list[int]:
    """Insert ``count`` jobs in ``state``, finished ``finished_age`` seconds ago (None: not)."""
    with engine.begin() as connection:
        rows = connection.execute(
            text(
                """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, created_at,
                                             updated_at, run_at, finished_at)
                   SELECT 'retention.task', 'default', :state, 1,
                          now() - make_interval(secs => :created_age),
                          now() - make_interval(secs => :created_age),
                          now() - make_interval(secs => :created_age),
                          CASE WHEN CAST(:finished_age AS float8) IS NULL THEN NULL
                               ELSE now() - make_interval(secs => :finished_age) END
                   FROM generate_series(1, :n)
                   RETURNING id"""
            ),
            {"state": state, "finished_age": finished_age, "created_age": created_age, "n": count},
        )
        return sorted(r[0] for r in rows)


def stage_active(engine: Engine) -> list[int]:
    """Waiting and running jobs created long ago (one with a nonsense old ``finished_at``)."""
    ids = []
    for state in ("queued", "retrying", "running"):
        ids += stage(engine, state, None)
        ids += stage(engine, state, 400 * DAY)  # the state, not the timestamp, protects it
    with engine.begin() as connection:
        # Tickets far in the future (nothing claims them) and a lease that has not expired.
        connection.execute(
            text(
                """INSERT INTO pgqueue_message_queue (job_id, queue, priority, run_at)
                   SELECT id, queue, priority, now() + interval '1 day' FROM pgqueue_jobs
                   WHERE id = ANY(:ids) AND state IN ('queued', 'retrying')"""
            ),
            {"ids": ids},
        )
        connection.execute(
            text(
                """UPDATE pgqueue_jobs SET lease_owner = 'elsewhere',
                          lease_token = gen_random_uuid(),
                          lease_expires_at = now() + interval '1 day'
                   WHERE id = ANY(:ids) AND state = 'running'"""
            ),
            {"ids": ids},
        )
    return sorted(ids)


def remaining(engine: Engine) -> set[int]:
    with engine.connect() as connection:
        return {r[0] for r in connection.execute(text("SELECT id FROM pgqueue_jobs"))}


def ticket_count(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(text("SELECT count(*) FROM pgqueue_message_queue")).scalar_one()
        )


def _queue(database_url: URL, **settings: Any) -> PgQueue:
    return PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.2, **settings),
    )


@pytest.fixture
def default_pgq(database_url: URL) -> Iterator[PgQueue]:
    queue = _queue(database_url)
    yield queue
    queue.dispose()


def test_default_retention_is_7_days_succeeded_30_days_failed(
    default_pgq: PgQueue, engine: Engine
) -> None:
    assert default_pgq.settings.succeeded_retention == 7 * DAY
    assert default_pgq.settings.failed_retention == 30 * DAY
    old = [
        *stage(engine, "succeeded", 7 * DAY + 600, 3),
        *stage(engine, "failed", 30 * DAY + 600, 2),
        *stage(engine, "cancelled", 30 * DAY + 600, 2),
    ]
    kept = [
        *stage(engine, "succeeded", 7 * DAY - 600, 2),
        *stage(engine, "succeeded", 60, 1),
        *stage(engine, "failed", 7 * DAY + 600, 1),  # failed jobs are kept longer
        *stage(engine, "failed", 30 * DAY - 600, 1),
        *stage(engine, "cancelled", 8 * DAY, 1),
    ]
    active = stage_active(engine)
    tickets = ticket_count(engine)

    assert default_pgq.prune() == len(old)
    assert remaining(engine) == set(kept) | set(active)
    assert ticket_count(engine) == tickets
    assert default_pgq.prune() == 0  # nothing left to do


def test_retention_is_configurable(database_url: URL, engine: Engine) -> None:
    pgq = _queue(database_url, succeeded_retention=3600.0, failed_retention=7200.0)
    try:
        old = [*stage(engine, "succeeded", 2 * 3600), *stage(engine, "failed", 3 * 3600)]
        kept = [*stage(engine, "succeeded", 1800), *stage(engine, "failed", 5400)]
        active = stage_active(engine)
        assert pgq.prune() == len(old)
        assert remaining(engine) == set(kept) | set(active)
    finally:
        pgq.dispose()


def test_prune_deletes_in_batches(default_pgq: PgQueue, engine: Engine) -> None:
    old = stage(engine, "succeeded", 10 * DAY, 50)
    kept = stage(engine, "succeeded", DAY, 5)
    deletes: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "DELETE FROM pgqueue_jobs" in statement:  # a CTE since the tickets go too
            deletes.append(statement)

    event.listen(default_pgq.engine, "before_cursor_execute", count)
    try:
        assert default_pgq.prune(batch_size=7) == len(old)
    finally:
        event.remove(default_pgq.engine, "before_cursor_execute", count)
    # 7 full batches of 7, then one of 1 (short: done). One statement per batch.
    assert len(deletes) == 8
    assert remaining(engine) == set(kept)


def test_worker_maintenance_prunes_in_batches(
    database_url: URL, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's maintenance loop prunes (10,000 jobs per pass) without any call from us."""
    pgq = _queue(database_url, prune_interval=1.0, rescue_interval=0.2)
    old = stage(engine, "succeeded", 8 * DAY, 12_000)
    old += stage(engine, "failed", 31 * DAY, 5)
    kept = [*stage(engine, "succeeded", DAY, 3), *stage(engine, "failed", 8 * DAY, 3)]
    active = stage_active(engine)
    caplog.set_level(logging.INFO, logger="pgqueue")
    # The worker listens to a queue with no jobs: only its maintenance loop touches the table.
    try:
        with in_thread(Worker(pgq, queues=["retention-idle"], concurrency=1), join_timeout=60):
            wait_until(
                lambda: len(remaining(engine)) <= len(kept) + len(active),
                60,
                "the old jobs to be pruned",
                interval=0.2,
            )
    finally:
        pgq.dispose()
    assert remaining(engine) == set(kept) | set(active)
    pruned = [
        int(r.getMessage().split()[1])
        for r in caplog.records
        if r.getMessage().startswith("pruned ") and r.name.startswith("pgqueue")
    ]
    assert sum(pruned) == len(old)
    assert max(pruned) == 10_000 and len(pruned) >= 2  # more than one batch


def _cli_prune(database_url: URL, **env: str) -> subprocess.CompletedProcess[str]:
    url = database_url.render_as_string(hide_password=False)
    return run_pgqueue("prune", "--database-url", url, env={**pgqueue_env(), **env})


def test_cli_prune_uses_the_defaults_and_the_environment(database_url: URL, engine: Engine) -> None:
    old = [*stage(engine, "succeeded", 8 * DAY, 4), *stage(engine, "cancelled", 31 * DAY, 2)]
    two_hours = stage(engine, "succeeded", 2 * 3600, 3)
    recent = stage(engine, "succeeded", 600, 1)
    active = stage_active(engine)

    result = _cli_prune(database_url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"pruned {len(old)} jobs"
    assert remaining(engine) == set(two_hours) | set(recent) | set(active)

    result = _cli_prune(database_url, PGQUEUE_SUCCEEDED_RETENTION="3600")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"pruned {len(two_hours)} jobs"
    assert remaining(engine) == set(recent) | set(active)
