"""Dashboard page times with a long history: ``python -m benchmarks.dashboard_pages URL``.

URL is a server's maintenance database (``postgresql+psycopg://.../postgres``). A fresh database
is migrated and given 1,000,000 finished jobs by ``generate_series`` (four queues, six tasks,
about 1 % failed and 1 % cancelled, 0.1 % running) plus a few waiting and rare ones; then every dashboard page
is requested through Flask's test client, first with the table only analyzed (a busy table whose
visibility map lags), then after ``VACUUM`` (the steady state autovacuum keeps). Prints the
median and the slowest of the timed requests per page, in milliseconds, and writes them to
``benchmarks/results/<timestamp>-dashboard-pages.json``.

``--enqueue`` also times single-job enqueues (one transaction each) with the dashboard's
indexes and without them, in alternating rounds, to show what the indexes cost writes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

from flask import Flask
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from benchmarks.run import machine, write_json
from pgqueue import PgQueue as CorePgQueue
from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard

HISTORY_SQL = text(
    """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, created_at, started_at,
                                 finished_at, updated_at, args, result)
       SELECT 'task.' || (i % 6), 'queue' || (i % 4),
              CASE WHEN i % 1009 = 0 THEN 'running' WHEN i % 97 = 0 THEN 'failed'
                   WHEN i % 89 = 0 THEN 'cancelled' ELSE 'succeeded' END,
              1, now() - (i || ' seconds')::interval, now() - (i || ' seconds')::interval,
              now() - (i || ' seconds')::interval, now(), json_build_array(i, 'x'), to_json(i)
       FROM generate_series(1, :n) AS i"""
)
RARE_SQL = text(
    """INSERT INTO pgqueue_jobs (task_name, queue, state, args)
       SELECT 'rare.task', 'rare', 'queued', '[]' FROM generate_series(1, 3)"""
)

PAGES = [
    "/pgqueue/",
    "/pgqueue/jobs",
    "/pgqueue/jobs?queue=queue1",
    "/pgqueue/jobs?queue=rare",
    "/pgqueue/jobs?state=failed",
    "/pgqueue/jobs?state=queued",
    "/pgqueue/jobs?queue=queue2&state=cancelled",
    "/pgqueue/jobs?task=task.3",
    "/pgqueue/jobs?task=rare.task",
    "/pgqueue/jobs?task=task.1&state=failed",
    "/pgqueue/jobs?state=running",
    "/pgqueue/jobs?queue=queue1&state=running",
    "/pgqueue/jobs?queue=queue1&before=500000",
    "/pgqueue/jobs/500000",
]


def _time_pages(url: str, rounds: int) -> dict[str, tuple[float, float]]:
    pgq = PgQueue()
    app = Flask("dashboard_bench")
    app.config.update(SECRET_KEY="bench", PGQUEUE_DATABASE_URL=url)
    pgq.init_app(app)
    init_dashboard(app, public=True)
    client = app.test_client()
    times: dict[str, tuple[float, float]] = {}
    try:
        for page in PAGES:
            assert client.get(page).status_code == 200, page  # warm the pool and caches
            samples = []
            for _ in range(rounds):
                start = time.perf_counter()
                response = client.get(page)
                samples.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, page
            times[page] = (statistics.median(samples), max(samples))
    finally:
        pgq.state(app).queue.dispose()
    return times


def _time_enqueues(url: str, count: int, rounds: int) -> dict[str, float]:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    pgq = CorePgQueue(url)
    task = pgq.task(name="bench.enqueue")(lambda n: None)
    indexes = {
        "ix_pgqueue_jobs_queue_state_id": "(queue, state, id) WHERE state <> 'running'",
        "ix_pgqueue_jobs_task_name_state_id": "(task_name, state, id) WHERE state <> 'running'",
    }
    per_job: dict[str, list[float]] = {"with indexes": [], "without": []}
    try:
        for _ in range(rounds):
            for label in per_job:
                with engine.connect() as connection:
                    for name, columns in indexes.items():
                        connection.execute(text(f"DROP INDEX IF EXISTS {name}"))
                        if label == "with indexes":
                            connection.execute(
                                text(f"CREATE INDEX {name} ON pgqueue_jobs {columns}")
                            )
                start = time.perf_counter()
                for i in range(count):
                    task.enqueue(i)
                per_job[label].append((time.perf_counter() - start) / count * 1e6)
    finally:
        pgq.dispose()
        engine.dispose()
    return {label: statistics.median(values) for label, values in per_job.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server_url")
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--enqueue", type=int, default=0, help="jobs per enqueue round")
    args = parser.parse_args()

    server = make_url(args.server_url)
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    name = "pgqueue_dashboard_bench"
    with admin.connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        connection.execute(text(f"CREATE DATABASE {name}"))
    url = server.set(database=name).render_as_string(hide_password=False)
    subprocess.run([sys.executable, "-m", "pgqueue", "migrate", "--database-url", url], check=True)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        version = connection.execute(text("SHOW server_version")).scalar()
        connection.execute(text("ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)"))
        start = time.perf_counter()
        connection.execute(HISTORY_SQL, {"n": args.history})
        connection.execute(RARE_SQL)
        print(f"PostgreSQL {version}: {args.history:,} jobs in {time.perf_counter() - start:.1f} s")
        connection.execute(text("ANALYZE pgqueue_jobs"))
    analyzed = _time_pages(url, args.rounds)
    with engine.connect() as connection:
        connection.execute(text("VACUUM ANALYZE pgqueue_jobs"))
    vacuumed = _time_pages(url, args.rounds)
    print("| page | analyzed only: median / max ms | after VACUUM: median / max ms |")
    print("|---|---|---|")
    for page in PAGES:
        a, v = analyzed[page], vacuumed[page]
        print(f"| `{page}` | {a[0]:.1f} / {a[1]:.1f} | {v[0]:.1f} / {v[1]:.1f} |")
    report: dict[str, Any] = {
        "mode": "dashboard-pages",
        "machine": machine(),
        "server_version": version,
        "history": args.history,
        "rounds": args.rounds,
        "median_and_max_ms": {"analyzed": analyzed, "vacuumed": vacuumed},
    }
    if args.enqueue:
        result = _time_enqueues(url, args.enqueue, rounds=3)
        print("enqueue, one transaction each (median us per job):", result)
        report["enqueue_us_per_job"] = result
    print(f"wrote {write_json(report, None)}")
    engine.dispose()
    with admin.connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


if __name__ == "__main__":
    main()
