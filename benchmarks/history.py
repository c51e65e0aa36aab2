"""History at scale: ``python -m benchmarks.history --rows N --layout in_place|partitioned``.

Two fresh databases on one server (``$PGQUEUE_DATABASE_URL``, else an embedded one): ``full``
holds ``N`` finished jobs spread evenly over the ten UTC days before today (four queues, six
tasks, about 1 % failed and 1 % cancelled), written by one ``INSERT ... SELECT
generate_series`` straight into the layout's table (``pgqueue_jobs`` for ``in_place``;
``pgqueue_job_history``'s day partitions for ``partitioned``), then ``VACUUM ANALYZE``d;
``empty`` holds none. Then, in alternating rounds, the same work on both, and the ratio
full / empty per round (median over rounds):

- claim: the wall time of one ``data.claim.claim`` of 10 jobs in its own transaction (the
  client's view: the statement's server time plus one round trip; the commit's WAL flush,
  a measure of the disk, left out), median of many calls;
- enqueue1: ``task.enqueue`` one job per transaction; enqueue_many: 20,000 jobs in one call;
  each timed part starts after a full garbage collection of the benchmark's process;
- drain: ``pgqueue worker --drain`` (concurrency 10, success lines off) on 20,000 no-op jobs,
  jobs/s between the 10th and the 90th percentile of completions;
- the Flask dashboard's pages on ``full`` (the layout's settings), median and slowest: as the
  drains left ``pgqueue_jobs`` (with what the planner then knew of it: the rows changed since
  its last ANALYZE), again after an ``ANALYZE`` of it, and under ``partitioned`` once every
  finished job was moved;
- pruning one day (the oldest, N/10 jobs): ``pgq.maintain_history`` dropping its partition
  (``partitioned``) or ``pgq.prune`` deleting its rows in batches (``in_place``): time, the
  dead tuples left, and the table's size before and after.

Prints the report and writes it to ``benchmarks/results/<timestamp>-history.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import statistics
import time
from typing import Any

import psycopg
from flask import Flask
from sqlalchemy import create_engine
from sqlalchemy.engine import URL

from benchmarks import app
from benchmarks.dashboard_pages import PAGES
from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq, sqlalchemy_url
from benchmarks.workloads import (
    STEADY_COLUMNS,
    WORKER_TIMEOUT,
    fill_pgqueue,
    process,
    steady_counts,
    steady_throughput,
    worker_command,
    worker_env,
)
from pgqueue import PgQueue, Settings
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.data import claim as claim_data
from pgqueue.data import history as history_data
from pgqueue.db import executor_for
from pgqueue.sql import history as history_sql

DAYS = 10
COLUMNS = """task_name, queue, state, attempts, max_attempts, priority, run_at, created_at,
    started_at, finished_at, updated_at, args, kwargs, result, errors, cancel_requested, atomic,
    awaited, snoozes"""
VALUES = """'task.' || (g %% 6), 'queue' || (g %% 4),
    CASE WHEN g %% 97 = 0 THEN 'failed' WHEN g %% 89 = 0 THEN 'cancelled' ELSE 'succeeded' END,
    1, 3, 0, t, t, t, t + interval '2 ms', t + interval '2 ms', json_build_array(g, 'x'), '{}',
    to_json(g), '[]', false, false, false, 0"""
SPREAD = """FROM generate_series(1, %(n)s) AS g, LATERAL (
    SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
           - interval '10 days' + (g - 0.5) * (interval '10 days' / %(n)s) AS t) AS ts"""


def settings_for(layout: str) -> Settings:
    return Settings(history=layout, log_successes=False)


def fill_history(url: URL, rows: int, layout: str) -> None:
    """``rows`` finished jobs, ten days of them, in the layout's table; VACUUM ANALYZE."""
    if layout == "partitioned":
        engine = create_engine(sqlalchemy_url(url))
        today = dt.datetime.now(dt.UTC).date()
        with engine.begin() as connection:
            for back in range(DAYS, 0, -1):
                connection.execute(
                    history_sql.create_day_partition(today - dt.timedelta(days=back))
                )
        engine.dispose()
        pgq = PgQueue(sqlalchemy_url(url), settings=settings_for(layout))
        pgq.maintain_history(days_ahead=1, retention_days=30)
        pgq.dispose()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        if layout == "partitioned":
            conn.execute(
                f"INSERT INTO pgqueue_job_history (id, {COLUMNS}) SELECT g, {VALUES} {SPREAD}",
                {"n": rows},
            )
            conn.execute("SELECT setval('pgqueue_jobs_id_seq', %s)", (rows,))
            conn.execute("VACUUM ANALYZE pgqueue_job_history")
            conn.execute("CHECKPOINT")  # the fill's writes, flushed before anything is timed
        else:
            conn.execute(
                f"INSERT INTO pgqueue_jobs ({COLUMNS}) SELECT {VALUES} {SPREAD}", {"n": rows}
            )
            conn.execute("VACUUM ANALYZE pgqueue_jobs")
            conn.execute("CHECKPOINT")


def time_claims(pgq: PgQueue, calls: int) -> float:
    """Median wall time (us) of ``calls`` claims of 10 jobs, each in its own transaction: the
    statement's round trip only, not the commit after it (a WAL flush, which measures the
    disk, the same for any history)."""
    samples = []
    gc.collect()
    for _ in range(calls):
        with pgq.sessions() as session, session.begin():
            session.connection()  # the transaction's BEGIN, outside the timing
            start = time.perf_counter()
            claimed = claim_data.claim(
                executor_for(session),
                worker_id="bench-claimer",
                limit=10,
                queues=["default"],
                lease_seconds=600.0,
                task_leases={},
                limits=claim_data.LimitsSeen(),
            )
            samples.append((time.perf_counter() - start) * 1e6)
        assert len(claimed) == 10
    return statistics.median(samples)


def time_enqueue1(pgq: PgQueue, n: int) -> float:
    task = pgq.registry.get(app.NOOP)
    gc.collect()
    start = time.perf_counter()
    for i in range(n):
        task.enqueue(n=i)
    return n / (time.perf_counter() - start)


def time_enqueue_many(pgq: PgQueue, n: int) -> float:
    task = pgq.registry.get(app.NOOP)
    items = [{"n": i} for i in range(n)]
    # A full collection first, on both databases' side alike: otherwise a collection of
    # everything this process holds lands inside some of these calls and not others, and that
    # decides the ratio, which is meant to measure the server's history.
    gc.collect()
    start = time.perf_counter()
    task.enqueue_many(items)
    return n / (time.perf_counter() - start)


def drain(url: URL, layout: str, n: int) -> float:
    """Jobs/s of ``pgqueue worker --drain`` (concurrency 10, success lines off) over ``n``
    new jobs (only jobs created after the call count)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute("SELECT last_value FROM pgqueue_jobs_id_seq").fetchone()
        assert row is not None
        first = int(row[0])
    fill_pgqueue(url, n)
    env = worker_env(url)
    env["PGQUEUE_LOG_SUCCESSES"] = "false"
    env["PGQUEUE_HISTORY"] = layout
    start = time.perf_counter()
    with process(worker_command(10), env) as child:
        code = child.wait(WORKER_TIMEOUT)
        if code != 0:
            raise RuntimeError(f"pgqueue worker exited with {code}")
    wall = time.perf_counter() - start
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        counted = conn.execute(
            f"SELECT {STEADY_COLUMNS} FROM pgqueue_jobs WHERE id > %s", (first,)
        ).fetchone()
    result = steady_throughput(n, steady_counts(counted), wall)
    assert result["ok"], result
    return float(result["jobs_per_s"])


def dashboard_pages(
    url: URL, layout: str, rounds: int, rows: int
) -> dict[str, tuple[float, float]]:
    pgq = FlaskPgQueue()
    flask_app = Flask("history_bench")
    flask_app.config.update(
        SECRET_KEY="bench", PGQUEUE_DATABASE_URL=sqlalchemy_url(url), PGQUEUE_HISTORY=layout
    )
    pgq.init_app(flask_app)
    init_dashboard(flask_app, public=True)
    client = flask_app.test_client()
    times: dict[str, tuple[float, float]] = {}
    try:
        # dashboard_pages' pages, with one job's page for a job of this history.
        pages = [p for p in PAGES if not p.startswith("/pgqueue/jobs/")]
        for page in [*pages, f"/pgqueue/jobs/{rows // 2}"]:
            assert client.get(page).status_code == 200, page
            samples = []
            for _ in range(rounds):
                start = time.perf_counter()
                response = client.get(page)
                samples.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, page
            times[page] = (round(statistics.median(samples), 1), round(max(samples), 1))
    finally:
        pgq.state(flask_app).queue.dispose()
    return times


def _table_figures(url: URL, table: str) -> dict[str, int]:
    """Rows, dead tuples and total size of ``table`` (all its partitions when partitioned)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            """SELECT coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0),
                      coalesce(sum(pg_total_relation_size(t.relid)), 0)
               FROM (SELECT relid FROM pg_partition_tree(%s)
                     UNION SELECT CAST(%s AS regclass)) AS t
               JOIN pg_stat_user_tables AS s ON s.relid = t.relid""",
            (table, table),
        ).fetchone()
    assert row is not None
    return {"live_rows": int(row[0]), "dead_rows": int(row[1]), "bytes": int(row[2])}


def prune_one_day(url: URL, layout: str) -> dict[str, Any]:
    """Prune the oldest day of the history; time, dead tuples and size before and after."""
    table = "pgqueue_job_history" if layout == "partitioned" else "pgqueue_jobs"
    before = _table_figures(url, table)
    today = dt.datetime.now(dt.UTC).date()
    oldest = today - dt.timedelta(days=DAYS)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        target = table if layout == "in_place" else history_sql.partition_name(oldest)
        row = conn.execute(
            f"SELECT count(*) FROM {target} WHERE finished_at < %s",
            (history_sql.day_start(oldest + dt.timedelta(days=1)),),
        ).fetchone()
        assert row is not None
        day_rows = int(row[0])
    if layout == "partitioned":
        pgq = PgQueue(sqlalchemy_url(url), settings=settings_for(layout))
        start = time.perf_counter()
        report = pgq.maintain_history(days_ahead=1, retention_days=DAYS - 1)
        seconds = time.perf_counter() - start
        assert report.dropped == (history_sql.partition_name(oldest),), report
        removed = day_rows
    else:
        cutoff = dt.datetime.now(dt.UTC) - history_sql.day_start(oldest + dt.timedelta(days=1))
        age = cutoff.total_seconds()
        pgq = PgQueue(
            sqlalchemy_url(url),
            settings=Settings(succeeded_retention=age, failed_retention=age),
        )
        start = time.perf_counter()
        removed = pgq.prune()
        seconds = time.perf_counter() - start
    pgq.dispose()
    after = _table_figures(url, table)
    return {
        "day_rows": day_rows,
        "removed": removed,
        "seconds": round(seconds, 3),
        "before": before,
        "after": after,
    }


def run(server: Server, rows: int, layout: str, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {"rows": rows, "layout": layout, "server": server.settings()}
    with server.fresh_database("hist_full") as full, server.fresh_database("hist_empty") as empty:
        start = time.perf_counter()
        fill_history(full, rows, layout)
        result["fill_seconds"] = round(time.perf_counter() - start, 1)
        queues = {
            name: app.build(sqlalchemy_url(url), settings_for(layout))
            for name, url in (("full", full), ("empty", empty))
        }
        try:
            for pgq in queues.values():  # warm-up: pool, statement caches
                time_enqueue1(pgq, 50)
                fill_pgqueue_via(pgq, 100)
                time_claims(pgq, 5)
            samples: dict[str, list[tuple[float, float]]] = {
                "claim_us": [],
                "enqueue1_per_s": [],
                "enqueue_many_per_s": [],
                "drain_per_s": [],
            }
            for round_number in range(rounds):
                pair: dict[str, dict[str, float]] = {"full": {}, "empty": {}}
                # Each database goes first in every other round: whatever the server still
                # does in the background (the fill's checkpoint writes, autovacuum) weighs on
                # both sides alike.
                order = ("full", "empty") if round_number % 2 == 0 else ("empty", "full")
                for name in order:
                    pgq = queues[name]
                    fill_pgqueue_via(pgq, 600)  # what the claims take (earlier ones drained)
                    pair[name]["claim_us"] = time_claims(pgq, 60)
                    pair[name]["enqueue1_per_s"] = time_enqueue1(pgq, 500)
                    pair[name]["enqueue_many_per_s"] = time_enqueue_many(pgq, 20_000)
                for name in order:
                    url = full if name == "full" else empty
                    # What enqueue_many left is drained first (not timed), then 20,000 timed.
                    drain_untimed(url, layout)
                    pair[name]["drain_per_s"] = drain(url, layout, 20_000)
                for key in samples:
                    samples[key].append((pair["full"][key], pair["empty"][key]))
            result["paired"] = {
                key: {
                    "full": round(statistics.median(f for f, _ in values), 1),
                    "empty": round(statistics.median(e for _, e in values), 1),
                    # claim is a time: empty / full, so that above 1 is better for all four
                    "ratio": round(
                        statistics.median(
                            (e / f) if key == "claim_us" else (f / e) for f, e in values
                        ),
                        3,
                    ),
                    "rounds": values,
                }
                for key, values in samples.items()
            }
        finally:
            for pgq in queues.values():
                pgq.dispose()
        # As the drains left it (under ``partitioned``, their last minute of finished jobs
        # still in pgqueue_jobs, since a drained worker exits before moving them), and, for
        # ``partitioned``, once the move has caught up (an idle system a minute later).
        result["statistics_before_dashboard"] = job_statistics(full)
        result["dashboard_ms"] = dashboard_pages(full, layout, 10, rows)
        # The same pages once pgqueue_jobs has statistics of what the drains left (what
        # autovacuum's next ANALYZE gives), which is what the planner chose from above.
        with psycopg.connect(libpq(full), autocommit=True) as conn:
            conn.execute("ANALYZE pgqueue_jobs")
        result["dashboard_ms_analysed"] = dashboard_pages(full, layout, 10, rows)
        if layout == "partitioned":
            result["moved_before_dashboard"] = move_all_finished(full)
            result["dashboard_ms_moved"] = dashboard_pages(full, layout, 10, rows)
        result["prune_one_day"] = prune_one_day(full, layout)
    with open("/proc/loadavg") as loadavg:
        result["loadavg"] = loadavg.read().split()[:3]
    return result


def job_statistics(url: URL) -> dict[str, Any]:
    """What the planner knows of ``pgqueue_jobs``: the rows changed since its last ANALYZE, and
    how many seconds ago that was (None: never)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            """SELECT n_mod_since_analyze, n_live_tup, n_dead_tup,
                      extract(epoch FROM now() - greatest(last_analyze, last_autoanalyze))
               FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'"""
        ).fetchone()
    assert row is not None
    changed, live, dead, seconds = row
    return {
        "changed_since_analyze": changed,
        "live_rows": live,
        "dead_rows": dead,
        "analysed_seconds_ago": None if seconds is None else round(float(seconds), 1),
    }


def move_all_finished(url: URL) -> int:
    """Move every finished job into the history, as the workers' maintenance does once they
    are ``history_move_after`` past the last; how many were moved."""
    pgq = PgQueue(sqlalchemy_url(url), settings=settings_for("partitioned"))
    moved = 0
    try:
        while True:
            with pgq.sessions() as session, session.begin():
                batch = history_data.move_to_history(executor_for(session), age=0.0, limit=50_000)
            moved += batch
            if batch < 50_000:
                return moved
    finally:
        pgq.dispose()


def fill_pgqueue_via(pgq: PgQueue, n: int) -> None:
    task = pgq.registry.get(app.NOOP)
    for first in range(0, n, 10_000):
        task.enqueue_many([{"n": i} for i in range(first, min(n, first + 10_000))])


def drain_untimed(url: URL, layout: str) -> None:
    env = worker_env(url)
    env["PGQUEUE_LOG_SUCCESSES"] = "false"
    env["PGQUEUE_HISTORY"] = layout
    with process(worker_command(10), env) as child:
        if child.wait(WORKER_TIMEOUT) != 0:
            raise RuntimeError("pgqueue worker failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--layout", choices=("in_place", "partitioned"), default="partitioned")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report = standalone(lambda server, a: run(server, a.rows, a.layout, a.rounds), args)
    report["mode"] = "history"
    print(json.dumps(report, indent=1, default=str))
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
