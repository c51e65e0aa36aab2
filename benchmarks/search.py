"""Job search with a long history: ``python -m benchmarks.search --jobs N [--history partitioned]``.

A fresh database on ``$PGQUEUE_DATABASE_URL`` (else a durable embedded server) gets ``N``
finished jobs spread evenly over the ten UTC days before today, by one ``INSERT ... SELECT
generate_series`` into the layout's table (``pgqueue_jobs``, or ``pgqueue_job_history``'s day
partitions for ``partitioned``), then ``VACUUM ANALYZE``. Job ``g`` has ``args`` ``[g, "x"]``,
``kwargs`` ``{"order": g}``, result ``g``; about 1 % failed with the error ``ValueError: order g
failed``. Then each search of ``pgq.admin.list_jobs`` runs 20 times (after one untimed run):
by an argument value that is found and one that is not, by error text, and by id, on a window
of the last day on ``created_at`` and on ``finished_at``. Prints p50 and p95 in milliseconds,
how many jobs each search read and whether its bound cut it short, and the executed plan of
the walk of the search that is not found (the most it reads). Writes the report to
``benchmarks/results/<timestamp>-search.json``.

``--index-cost ROUNDS`` measures instead what the index a content search would need costs the
enqueue: on a fresh database, in alternating rounds, ``enqueue1`` (500 jobs, one transaction
each) and ``enqueue_many`` (20,000 jobs in one call) of jobs with a small order's arguments,
with and without GIN indexes on ``args::jsonb`` and ``kwargs::jsonb`` (what Oban and River keep
on their args); the median per job of each, and their ratio.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import event

from benchmarks.history import DAYS, settings_for
from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq, sqlalchemy_url
from pgqueue import PgQueue
from pgqueue.admin import JobPage, JsonMatch
from pgqueue.sql import history as history_sql

COLUMNS = """task_name, queue, state, attempts, max_attempts, priority, run_at, created_at,
    started_at, finished_at, updated_at, args, kwargs, result, errors, last_error,
    cancel_requested, atomic, awaited, snoozes"""
VALUES = """'task.' || (g %% 6), 'queue' || (g %% 4),
    CASE WHEN g %% 97 = 0 THEN 'failed' ELSE 'succeeded' END,
    1, 3, 0, t, t, t, t + interval '2 ms', t + interval '2 ms', json_build_array(g, 'x'),
    json_build_object('order', g), to_json(g), '[]',
    CASE WHEN g %% 97 = 0 THEN 'ValueError: order ' || g || ' failed' END,
    false, false, false, 0"""
SPREAD = """FROM generate_series(1, %(n)s) AS g, LATERAL (
    SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
           - interval '10 days' + (g - 0.5) * (interval '10 days' / %(n)s) AS t) AS ts"""
RUNS = 20


def fill(server_url: Any, jobs: int, layout: str) -> float:
    """``jobs`` finished jobs in the layout's table, analysed; the seconds it took."""
    start = time.perf_counter()
    if layout == "partitioned":
        pgq = PgQueue(sqlalchemy_url(server_url), settings=settings_for(layout))
        today = dt.datetime.now(dt.UTC).date()
        with pgq.engine.begin() as connection:
            for back in range(DAYS, 0, -1):
                connection.execute(
                    history_sql.create_day_partition(today - dt.timedelta(days=back))
                )
        pgq.maintain_history(days_ahead=1, retention_days=30)
        pgq.dispose()
    table = "pgqueue_job_history" if layout == "partitioned" else "pgqueue_jobs"
    with psycopg.connect(libpq(server_url), autocommit=True) as conn:
        if layout == "partitioned":
            conn.execute(
                f"INSERT INTO {table} (id, {COLUMNS}) SELECT g, {VALUES} {SPREAD}", {"n": jobs}
            )
            conn.execute("SELECT setval('pgqueue_jobs_id_seq', %s)", (jobs,))
        else:
            conn.execute(f"INSERT INTO {table} ({COLUMNS}) SELECT {VALUES} {SPREAD}", {"n": jobs})
        conn.execute(f"VACUUM ANALYZE {table}")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - start


def timed(search: Callable[[], JobPage]) -> dict[str, Any]:
    page = search()  # untimed: the pool, the statement caches
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        page = search()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    extent = page.search
    return {
        "p50_ms": round(statistics.median(samples), 1),
        "p95_ms": round(samples[int(0.95 * (len(samples) - 1) + 0.5)], 1),
        "found": len(page.jobs),
        "scanned": None if extent is None else extent.scanned,
        "cut_short": None if extent is None else extent.cut_short,
    }


def explain_walk(pgq: PgQueue, search: Callable[[], JobPage]) -> list[str]:
    """The executed plans of the statements ``search`` sends that walk a window."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if "walked" in statement:
            sent.append((statement, parameters))

    event.listen(pgq.engine, "before_cursor_execute", record)
    try:
        search()
    finally:
        event.remove(pgq.engine, "before_cursor_execute", record)
    plans = []
    with pgq.engine.connect() as connection:
        for statement, parameters in sent:
            rows = connection.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters
            ).all()
            plans.append("\n".join(row[0] for row in rows))
    return plans


GIN_INDEXES = {
    "ix_search_args": "USING gin ((args::jsonb))",
    "ix_search_kwargs": "USING gin ((kwargs::jsonb))",
}


def order(i: int) -> dict[str, Any]:
    """The keyword arguments of one job: a small order, as a web app enqueues."""
    return {
        "order_id": i,
        "customer": {"id": i % 1000, "email": f"user{i % 1000}@example.com"},
        "items": [{"sku": f"sku-{i % 50}", "quantity": 1 + i % 3}],
        "notify": True,
    }


def index_cost(server: Server, rounds: int) -> dict[str, Any]:
    """Median microseconds per job of enqueue1 and enqueue_many with and without the GIN
    indexes, in alternating rounds on one fresh database."""
    samples: dict[str, dict[str, list[float]]] = {
        "enqueue1_us": {"without": [], "with GIN": []},
        "enqueue_many_us": {"without": [], "with GIN": []},
    }
    with server.fresh_database("search_index_cost") as url:
        pgq = PgQueue(sqlalchemy_url(url))
        task = pgq.task(name="bench.order")(lambda **order: None)
        try:
            task.enqueue_many([order(i) for i in range(2_000)])  # warm-up: pool, caches
            for round_number in range(rounds):
                labels = ["without", "with GIN"]
                if round_number % 2:
                    labels.reverse()
                for label in labels:
                    with psycopg.connect(libpq(url), autocommit=True) as conn:
                        for name, how in GIN_INDEXES.items():
                            conn.execute(f"DROP INDEX IF EXISTS {name}")
                            if label == "with GIN":
                                conn.execute(f"CREATE INDEX {name} ON pgqueue_jobs {how}")
                        conn.execute("TRUNCATE pgqueue_jobs, pgqueue_message_queue CASCADE")
                        conn.execute("CHECKPOINT")
                    start = time.perf_counter()
                    for i in range(500):
                        task.enqueue(**order(i))
                    single = (time.perf_counter() - start) / 500 * 1e6
                    samples["enqueue1_us"][label].append(single)
                    items = [order(i) for i in range(20_000)]
                    start = time.perf_counter()
                    task.enqueue_many(items)
                    many = (time.perf_counter() - start) / 20_000 * 1e6
                    samples["enqueue_many_us"][label].append(many)
                    print(f"round {round_number} {label}: {single:.0f} / {many:.1f} us", flush=True)
        finally:
            pgq.dispose()
    result: dict[str, Any] = {}
    for key, by_label in samples.items():
        medians = {label: round(statistics.median(v), 1) for label, v in by_label.items()}
        ratio = medians["with GIN"] / medians["without"]
        result[key] = {**medians, "ratio": round(ratio, 3), "rounds": by_label}
    return result


def run(server: Server, jobs: int, layout: str) -> dict[str, Any]:
    result: dict[str, Any] = {"jobs": jobs, "layout": layout, "server": server.settings()}
    with server.fresh_database("search") as url:
        result["fill_seconds"] = round(fill(url, jobs, layout), 1)
        print(f"filled {jobs:,} jobs in {result['fill_seconds']} s", flush=True)
        pgq = PgQueue(sqlalchemy_url(url), settings=settings_for(layout))
        try:
            today = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            since = today - dt.timedelta(days=1)
            # A job of the last day among its newest 5 %: within the default bound of the
            # window's 100,000 newest jobs up to 20,000,000 jobs.
            found = jobs - jobs // 200
            searches: dict[str, Callable[[], JobPage]] = {}
            for column in ("created_at", "finished_at"):
                window = {"since": since, "time_column": column}
                searches[f"{column}: args.0 found"] = lambda w=window: pgq.admin.list_jobs(
                    json_match=JsonMatch("args.0", found), **w
                )
                searches[f"{column}: kwargs.order not found"] = lambda w=window: (
                    pgq.admin.list_jobs(json_match=JsonMatch("kwargs.order", -1), **w)
                )
                searches[f"{column}: error text"] = lambda w=window: pgq.admin.list_jobs(
                    error_contains=f"order {found - found % 97} FAILED", **w
                )
            searches["job id"] = lambda: pgq.admin.list_jobs(job_id=found)
            result["searches"] = {}
            for name, search in searches.items():
                result["searches"][name] = figures = timed(search)
                print(f"{name}: {figures}", flush=True)
            result["plans"] = explain_walk(pgq, searches["created_at: kwargs.order not found"])
            result["plans"] += explain_walk(pgq, searches["finished_at: kwargs.order not found"])
            for plan in result["plans"]:
                print(plan, flush=True)
        finally:
            pgq.dispose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--history", choices=("in_place", "partitioned"), default="in_place")
    parser.add_argument("--index-cost", type=int, default=0, metavar="ROUNDS")
    args = parser.parse_args()
    if args.index_cost:
        report = standalone(
            lambda server, a: {"index_cost": index_cost(server, a.index_cost)}, args
        )
    else:
        report = standalone(lambda server, a: run(server, a.jobs, a.history), args)
    report["mode"] = "search"
    print(json.dumps({k: v for k, v in report.items() if k != "plans"}, indent=1, default=str))
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
