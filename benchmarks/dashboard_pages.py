"""Dashboard page times with a long history: ``python -m benchmarks.dashboard_pages URL``.

URL is a server's maintenance database (``postgresql+psycopg://.../postgres``). A fresh database
is migrated and given 1,000,000 finished jobs by ``generate_series`` (four queues, six tasks,
about 1 % failed and 1 % cancelled, 0.1 % running; finished evenly over the last ten days,
each having waited 0 to 6 s past its ``run_at``) plus a few waiting and rare ones, four
workers holding 40 of the running jobs, a workflow, a dozen audit records and a schedule; then
every dashboard page (the job searches by argument, error text and time range among them), and
the live fragments the pages poll, is requested through Flask's test client, first with the table only analyzed (a busy table whose visibility map lags), then after
``VACUUM`` (the steady state autovacuum keeps). Prints the median (p50) and the 95th percentile
(p95) of the timed requests per page, in milliseconds, and writes them to
``benchmarks/results/<timestamp>-dashboard-pages.json``.

``--layout partitioned`` serves the dashboard with ``history="partitioned"``: the finished jobs
of all but the last minute sit in ``pgqueue_job_history``'s day partitions, the rest in
``pgqueue_jobs``, as the mover leaves them.

``--enqueue`` also times single-job enqueues (one transaction each) with the dashboard's
indexes and without them, in alternating rounds, to show what the indexes cost writes.
"""

from __future__ import annotations

import argparse
import datetime as dt
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
from pgqueue import Settings, chord
from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.sql import history as history_sql

DAYS = 10
# Job i finished i * step seconds ago (``step``: ten days over the jobs), after waiting i % 7
# seconds past its run_at; the rows with ``WHERE`` keep go to ``table``.
FILL = """INSERT INTO {table} ({id}task_name, queue, state, attempts, max_attempts, priority,
                           run_at, created_at, started_at, finished_at, updated_at, args,
                           kwargs, result, errors, cancel_requested, atomic, awaited, snoozes)
   SELECT {i}'task.' || (i % 6), 'queue' || (i % 4),
          CASE WHEN i % 1009 = 0 AND {running} THEN 'running' WHEN i % 97 = 0 THEN 'failed'
               WHEN i % 89 = 0 THEN 'cancelled' ELSE 'succeeded' END,
          1, 3, 0, t - make_interval(secs => i % 7), t - make_interval(secs => i % 7), t,
          t + interval '2 ms', now(), json_build_array(i, 'x'), '{{}}', to_json(i), '[]',
          false, false, false, 0
   FROM generate_series(1, :n) AS i,
        LATERAL (SELECT now() - make_interval(secs => i * :step) AS t) AS ts
   WHERE {where}"""
HISTORY_SQL = text(FILL.format(table="pgqueue_jobs", id="", i="", running="true", where="true"))
# Partitioned: the last minute's jobs (and the running ones) in pgqueue_jobs, the rest moved.
LIVE_SQL = text(
    FILL.format(
        table="pgqueue_jobs", id="", i="", running="true", where="i * :step <= 60 OR i % 1009 = 0"
    )
)
MOVED_SQL = text(
    FILL.format(
        table="pgqueue_job_history",
        id="id, ",
        i="i, ",
        running="false",
        where="i * :step > 60 AND i % 1009 <> 0",
    )
)
WORKERS_SQL = text(
    """INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version)
       SELECT 'bench-' || w, 'bench-host', 1000 + w, ARRAY['queue0', 'queue1', 'queue2', 'queue3'],
              10, 'bench'
       FROM generate_series(1, 4) AS w"""
)
# The 40 newest running jobs, held by those workers (10 each) under a lease that has not expired.
LEASED_SQL = text(
    """UPDATE pgqueue_jobs SET lease_owner = 'bench-' || (1 + id % 4),
                              lease_expires_at = now() + interval '1 hour'
       WHERE id IN (SELECT id FROM pgqueue_jobs WHERE state = 'running'
                    ORDER BY id DESC LIMIT 40)"""
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
    "/pgqueue/jobs?queue=queue1&before={middle}",
    "/pgqueue/jobs/{middle}",
    # Searches (the form's default 24-hour window): by an argument, found and not, by error text.
    "/pgqueue/jobs?json=args.0%3D{recent}",
    "/pgqueue/jobs?json=args.0%3D-1",
    "/pgqueue/jobs?json=args%3D%5B{recent}%5D&match=contains",
    "/pgqueue/jobs?error=no+such+error",
    "/pgqueue/jobs?queue=queue1&since={two_hours_ago}&until={an_hour_ago}&time=finished_at",
    "/pgqueue/queues",
    "/pgqueue/workers",
    "/pgqueue/schedules",
    "/pgqueue/audit",
    "/pgqueue/workflows/{workflow}",
    # What live.js polls every second on each page that is open.
    "/pgqueue/?fragment=overview",
    "/pgqueue/jobs?fragment=jobs",
    "/pgqueue/jobs?queue=queue1&state=failed&fragment=jobs",
    "/pgqueue/jobs/{middle}?fragment=job",
    "/pgqueue/workflows/{workflow}?fragment=workflow",
]


def _p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20, method="inclusive")[-1]


def _fill_the_other_pages(url: str, layout: str) -> int:
    """What the pages besides the finished jobs show: three queued jobs of a rare task and
    queue, four live workers holding running jobs, a workflow of three jobs, and a dozen
    audited edits of the rare jobs. Returns the workflow's id."""
    pgq = CorePgQueue(url, settings=Settings(history=layout))
    rare = pgq.task(name="rare.task", queue="rare")(lambda: None)
    part = pgq.task(name="bench.part", queue="queue0")(lambda n: n)
    total = pgq.task(name="bench.total", queue="queue0")(lambda parts: sum(parts))
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(WORKERS_SQL)
            connection.execute(LEASED_SQL)
        rare_ids = [rare.enqueue() for _ in range(3)]
        for round_ in range(4):
            for job_id in rare_ids:
                pgq.admin.set_priority(job_id, round_, actor="bench")
        workflow = chord([part.s(n) for n in range(2)], total.s()).enqueue()
        return workflow.id
    finally:
        pgq.dispose()
        engine.dispose()


def _pages(history: int, workflow: int) -> list[str]:
    """``PAGES`` with their blanks filled: ``middle``, the job that finished five days ago;
    ``recent``, one that finished 12 hours ago (in a search's default 24-hour window)."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None)
    blanks = {
        "middle": history // 2,
        "recent": history // 20,
        "workflow": workflow,
        "two_hours_ago": (now - dt.timedelta(hours=2)).isoformat(),
        "an_hour_ago": (now - dt.timedelta(hours=1)).isoformat(),
    }
    return [page.format(**blanks) for page in PAGES]


def _time_pages(
    url: str, rounds: int, layout: str, pages: list[str]
) -> dict[str, tuple[float, float]]:
    pgq = PgQueue()
    app = Flask("dashboard_bench")
    app.config.update(SECRET_KEY="bench", PGQUEUE_DATABASE_URL=url, PGQUEUE_HISTORY=layout)
    pgq.init_app(app)
    init_dashboard(app, public=True)
    # The schedules page lists the schedules of the code with their ticks.
    core = pgq.state(app).queue
    core.periodic("*/5 * * * *", tz="Europe/Oslo", name="bench.refresh")(
        core.task(name="bench.refresh")(lambda: None)
    )
    client = app.test_client()
    times: dict[str, tuple[float, float]] = {}
    try:
        for page, shown in zip(PAGES, pages, strict=True):
            assert client.get(shown).status_code == 200, shown  # warm the pool and caches
            samples = []
            for _ in range(rounds):
                start = time.perf_counter()
                response = client.get(shown)
                samples.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, shown
            times[page] = (statistics.median(samples), _p95(samples))
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


def _day_partitions(url: str) -> None:
    """``pgqueue_job_history``'s partitions for the fill's days and the ones ahead."""
    engine = create_engine(url)
    today = dt.datetime.now(dt.UTC).date()
    with engine.begin() as connection:
        for back in range(DAYS + 1, 0, -1):
            connection.execute(history_sql.create_day_partition(today - dt.timedelta(days=back)))
    engine.dispose()
    pgq = CorePgQueue(url, settings=Settings(history="partitioned"))
    pgq.maintain_history(days_ahead=1, retention_days=30)
    pgq.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server_url")
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--enqueue", type=int, default=0, help="jobs per enqueue round")
    parser.add_argument("--layout", choices=["in_place", "partitioned"], default="in_place")
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
        fill = {"n": args.history, "step": DAYS * 86_400 / args.history}
        if args.layout == "partitioned":
            _day_partitions(url)
            connection.execute(LIVE_SQL, fill)
            connection.execute(MOVED_SQL, fill)
            connection.execute(text("SELECT setval('pgqueue_jobs_id_seq', :n)"), fill)
        else:
            connection.execute(HISTORY_SQL, fill)
        print(f"PostgreSQL {version}: {args.history:,} jobs in {time.perf_counter() - start:.1f} s")
        connection.execute(text("ANALYZE pgqueue_jobs"))
        connection.execute(text("ANALYZE pgqueue_job_history"))
    pages = _pages(args.history, _fill_the_other_pages(url, args.layout))
    analyzed = _time_pages(url, args.rounds, args.layout, pages)
    with engine.connect() as connection:
        connection.execute(text("VACUUM ANALYZE pgqueue_jobs"))
        connection.execute(text("VACUUM ANALYZE pgqueue_job_history"))
    vacuumed = _time_pages(url, args.rounds, args.layout, pages)
    print("| page | analyzed only: p50 / p95 ms | after VACUUM: p50 / p95 ms |")
    print("|---|---|---|")
    for page in PAGES:
        a, v = analyzed[page], vacuumed[page]
        print(f"| `{page}` | {a[0]:.1f} / {a[1]:.1f} | {v[0]:.1f} / {v[1]:.1f} |")
    report: dict[str, Any] = {
        "mode": "dashboard-pages",
        "machine": machine(),
        "server_version": version,
        "history": args.history,
        "layout": args.layout,
        "rounds": args.rounds,
        "p50_and_p95_ms": {"analyzed": analyzed, "vacuumed": vacuumed},
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
