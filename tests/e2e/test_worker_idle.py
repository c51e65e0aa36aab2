"""An idle listening worker: wake-up latency, queries per second while idle, connections used."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:
    from conftest import App


def _enqueue_and_time(app: App) -> tuple[int, float]:
    """Enqueue one job; return its id and the database clock just before the commit.

    The clock is read inside the enqueuing transaction, so the measured latency includes the
    commit itself (it can only be over-, never under-estimated).
    """
    with app.module.pgq.sessions() as session, session.begin():
        job_id = app.module.record.configure(session=session).enqueue()
        before_commit = session.execute(text("SELECT extract(epoch FROM clock_timestamp())"))
        committed_at = float(before_commit.scalar_one())
    return job_id, committed_at


def test_idle_worker_wakes_within_50ms_and_stays_quiet(app: App) -> None:
    # Default poll interval (1 s) and rescue interval (5 s): what a user runs.
    worker = app.start_worker("--concurrency", "4", rescue_interval=5)
    app.wait_listening()

    # Warm up (first handler session, first statements prepared), then let it go idle.
    warm_id, _ = _enqueue_and_time(app)
    app.wait_final([warm_id], timeout=30)

    latencies = []
    for _ in range(50):
        job_id, committed_at = _enqueue_and_time(app)
        started = app.wait_until(
            lambda job_id=job_id: app.scalars(
                "SELECT extract(epoch FROM at) FROM ledger WHERE job_id = :job", job=job_id
            ),
            timeout=10,
            what=f"job {job_id} to start",
            interval=0.01,
        )
        latencies.append(float(started[0]) - committed_at)
        app.wait_final([job_id], timeout=10)
        time.sleep(0.05)  # the worker is idle again (waiting on LISTEN) before the next job
    median_ms = statistics.median(latencies) * 1000
    print(f"wake-up latency: median {median_ms:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    assert median_ms < 50, sorted(latencies)

    # Idle load: statements from the worker's backends over a quiet window. pg_stat_statements
    # counts BEGIN/COMMIT too (track_utility); the worker sends none, its statements autocommit.
    app.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    time.sleep(1.5)  # the last outcome's follow-up claim is done
    app.execute("SELECT pg_stat_statements_reset()")
    # Twice the longest period of the idle duties (rescue, limits look, prepared-statement
    # reset: 5 s), so that where the window starts moves the count by little.
    window = 10.0
    time.sleep(window)
    rows = app.rows(
        "SELECT query, calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
        "WHERE d.datname = current_database() AND query NOT ILIKE '%pg_stat_statements%' "
        "ORDER BY calls DESC"
    )
    calls = sum(row.calls for row in rows)
    print(f"idle statements in {window}s: {calls}: {[(r.calls, r.query[:60]) for r in rows]}")
    drops = sum(row.calls for row in rows if row.query.strip().upper() == "DISCARD PLANS")
    # A claim per poll interval (1 s), the maintenance pass's reads and the registry's refresh.
    assert (calls - drops) / window <= 1.8, rows
    # Plans of prepared statements are dropped once 5 s old: the claim connection's every 5 s, and each
    # pooled connection's (at most 4) once, at its first checkout after the jobs used it.
    assert drops <= window / 5 + 1 + 4, rows
    assert not any(row.query.strip().upper() in ("BEGIN", "COMMIT") for row in rows), rows

    # Connections of this one worker process, by role (application_name).
    by_role = dict(
        app.rows(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name LIKE 'pgqueue%' GROUP BY application_name"
        )
    )
    print(f"connections while idle after 51 jobs: {by_role}")
    assert by_role.get("pgqueue-listener") == 1
    assert 1 <= by_role.get("pgqueue", 0) <= 4  # claim loop, completer, heartbeat, maintenance
    assert by_role.get("pgqueue-handler", 0) <= 4  # at most one per slot (concurrency 4)
    assert worker.popen.poll() is None
