"""Where a bulk enqueue spends its time: each step's cost per job, beside a raw COPY's.

``python -m benchmarks.enqueue_steps [--jobs 50000] [--rounds 3]`` on ``$PGQUEUE_DATABASE_URL``
(or a durable embedded server) enqueues ``--jobs`` jobs of the benchmark's no-op task with
``enqueue_many`` and prints one table, in microseconds per job (medians over the rounds):

- client steps, no database: binding the arguments to the task's signature, JSON encoding,
  building the jobs (both, plus the per-job record), building the COPY text;
- the statements of the bulk insert, timed one by one inside a real ``enqueue_many``
  transaction (id allocation, the jobs' COPY, the tickets, the wake-up, the commit);
- the server's share of each table: the same COPY text sent into scratch copies of the jobs and
  ticket tables, first with no index, then with each index added (its cost is the difference),
  so each index's and each table's part of the whole can be read off;
- the raw COPY of ``benchmarks.baseline`` (one table, one partial index) as the suite runs it.

``--paired-round SINGLES`` prints one round of a before/after comparison as JSON instead (run it
alternately from two checkouts): ``enqueue_many`` and the raw COPY, ``SINGLES`` single
``enqueue`` calls and as many raw one-row INSERTs, in jobs/s, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import app, baseline
from benchmarks.server import Server, libpq, sqlalchemy_url, start
from pgqueue import codec, uow
from pgqueue.data import copy_rows
from pgqueue.data import enqueue as enqueue_data
from pgqueue.jobs import Plan
from pgqueue.sql import enqueue
from pgqueue.tasks import ConfiguredTask, EnqueueOptions


class TimedExecutor:
    """An ``Executor`` that times each statement it runs (and builds COPY text before sending,
    so the build and the send are timed apart)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.times: list[tuple[str, float]] = []

    @property
    def tables(self) -> Any:
        return self.inner.tables

    def rows(self, statement: Any, params: Any = None) -> Sequence[Any]:
        start = time.perf_counter()
        rows = self.inner.rows(statement, params)
        self.times.append((_statement_name(statement), time.perf_counter() - start))
        return rows

    def copy(self, statement: Any, chunks: Iterable[str]) -> None:
        start = time.perf_counter()
        built = list(chunks)
        sent = time.perf_counter()
        self.inner.copy(statement, built)
        done = time.perf_counter()
        table = "jobs" if "pgqueue_jobs" in repr(statement) else "tickets"
        self.times.append((f"build COPY text ({table})", sent - start))
        self.times.append((f"COPY {table} (send + server)", done - sent))


_STATEMENTS = {
    "allocate_job_ids": "allocate ids",
    "allocate_jobs_with_tickets": "allocate ids + tickets INSERT + wake-up",
    "allocate": "allocate ids",
    "insert_tickets": "tickets INSERT + wake-up",
    "notify_tickets": "wake-up (NOTIFY)",
}


def _statement_name(statement: Any) -> str:
    # Names of either version of the bulk insert (this script also times an older checkout).
    for name, label in _STATEMENTS.items():
        builder = getattr(enqueue, name, None)
        if builder is not None and statement is builder():
            return label
    return "other statement"


def _median_per_job(samples: list[float], n: int) -> float:
    return statistics.median(samples) / n * 1e6


def client_steps(pgq: Any, n: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per round of each client step (no database)."""
    task = pgq.registry.get(app.NOOP)
    settings = pgq.settings
    configured = ConfiguredTask(task, EnqueueOptions())
    ids = list(range(1, n + 1))
    stamp = "2026-01-01T00:00:00+00:00"

    def validate(items: list[dict[str, int]]) -> object:
        return [task.check_arguments((), item) for item in items]

    def encode(items: list[dict[str, int]]) -> object:
        limit, depth = settings.max_payload_bytes, settings.max_json_depth
        return [codec.encode_args((), i, max_bytes=limit, max_depth=depth) for i in items]

    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        items = [{"n": i} for i in range(n)]
        _timed(out, "validate arguments (signature)", validate, items)
        _timed(out, "JSON encode (args, kwargs)", encode, items)
        jobs = _timed(out, "build jobs (validate + encode + record)", configured._build_many, items)
        _, lines = copy_rows.lines(ids, jobs, None, None, None, stamp)
        _timed(out, "build COPY text (jobs)", lambda lines: list(copy_rows.chunks(lines)), lines)
    return out


def _timed(out: dict[str, list[float]], name: str, fn: Callable[[Any], Any], arg: Any) -> Any:
    start = time.perf_counter()
    value = fn(arg)
    out.setdefault(name, []).append(time.perf_counter() - start)
    return value


def statement_steps(pgq: Any, n: int, rounds: int) -> tuple[dict[str, list[float]], list[float]]:
    """Seconds per round of each statement of a real bulk enqueue, and of the whole call."""
    task = pgq.registry.get(app.NOOP)
    configured = ConfiguredTask(task, EnqueueOptions())
    out: dict[str, list[float]] = {}
    totals: list[float] = []
    for _ in range(rounds):
        items = [{"n": i} for i in range(n)]
        jobs = configured._build_many(items)
        timer: list[TimedExecutor] = []
        start = time.perf_counter()
        ids = uow.run(pgq.database, partial(_timed_copy, timer, jobs))
        whole = time.perf_counter() - start
        assert ids is not None and len(ids) == n
        steps = timer[-1].times
        for name, seconds in steps:
            out.setdefault(name, []).append(seconds)
        out.setdefault("commit (and transaction overhead)", []).append(
            whole - sum(s for _, s in steps)
        )
        items = [{"n": i} for i in range(n)]
        start = time.perf_counter()
        assert len(task.enqueue_many(items)) == n
        totals.append(time.perf_counter() - start)
    return out, totals


def _timed_copy(timer: list[TimedExecutor], jobs: Any, db: Any) -> Any:
    executor = TimedExecutor(db)
    timer.append(executor)
    return enqueue_data.write(executor, Plan(jobs), may_copy=True).ids


def server_tables(conninfo: str, pgq: Any, n: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per round of COPY + commit of the enqueue's own text into scratch copies of the
    two tables: bare (no index), then with each of the real table's indexes added alone."""
    task = pgq.registry.get(app.NOOP)
    jobs = ConfiguredTask(task, EnqueueOptions())._build_many([{"n": i} for i in range(n)])
    ids = list(range(1, n + 1))
    stamp = "2026-01-01T00:00:00+00:00"
    job_columns, lines = copy_rows.lines(ids, jobs, None, None, None, stamp)
    texts = {
        "pgqueue_jobs": "".join(lines),
        # The tickets as COPY text whichever way the enqueue inserts them: the per-index
        # costs are the table's either way.
        "pgqueue_message_queue": "".join(f"{i}\tdefault\t0\t{stamp}\tf\n" for i in ids),
    }
    columns = {
        "pgqueue_jobs": job_columns,
        "pgqueue_message_queue": ("job_id", "queue", "priority", "run_at", "atomic"),
    }
    out: dict[str, list[float]] = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for table, text in texts.items():
            indexes = [
                (name, definition)
                for name, definition in conn.execute(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s"
                    " ORDER BY indexname",
                    [table],
                ).fetchall()
            ]
            scratch = f"scratch_{table}"
            copy_sql = f"COPY {scratch} ({', '.join(columns[table])}) FROM STDIN"
            short = "jobs" if table == "pgqueue_jobs" else "tickets"
            variants: list[tuple[str, list[str]]] = [
                (f"server: {short} heap (send, parse, defaults, checks)", []),
                *((f"server: {short} heap + index {name}", [d]) for name, d in indexes),
                (f"server: {short} heap + all indexes", [d for _, d in indexes]),
            ]
            # Interleaved: every round times each variant once, so drift in the machine's load
            # spreads over all of them instead of skewing the ones measured last.
            for _ in range(rounds):
                for label, definitions in variants:
                    conn.execute(f"DROP TABLE IF EXISTS {scratch}")
                    # Defaults and CHECK constraints as the real table's; no identity.
                    conn.execute(
                        f"CREATE TABLE {scratch} (LIKE {table}"
                        " INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                    )
                    for definition in definitions:
                        conn.execute(
                            definition.replace(f" ON public.{table} ", f" ON public.{scratch} ")
                            .replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX scratch_")
                            .replace("CREATE INDEX ", "CREATE INDEX scratch_")
                        )
                    out.setdefault(label, []).append(_copy_text(conn, copy_sql, text))
            conn.execute(f"DROP TABLE {scratch}")
    return out


def _copy_text(conn: psycopg.Connection[Any], statement: str, text: str) -> float:
    """Seconds to COPY ``text`` (in 1 MB writes) and commit."""
    with conn.transaction():
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(statement) as copy:
            for offset in range(0, len(text), 1 << 20):
                copy.write(text[offset : offset + (1 << 20)])
    return time.perf_counter() - start


def raw_copy(server: Server, n: int, rounds: int) -> dict[str, list[float]]:
    """The suite's raw COPY (``baseline.enqueue_copy``), and the same rows as prebuilt text."""
    out: dict[str, list[float]] = {}
    with server.fresh_database("steps_raw", migrate=False) as url:
        conninfo = libpq(url)
        baseline.create_schema(conninfo)
        baseline.enqueue_copy(conninfo, 10)
        text = "".join(f"noop\t[{i}]\n" for i in range(n))
        for _ in range(rounds):
            out.setdefault("raw COPY, write_row per row (the suite's ceiling)", []).append(
                baseline.enqueue_copy(conninfo, n)
            )
            with psycopg.connect(conninfo) as conn:
                start = time.perf_counter()
                with (
                    conn.cursor() as cur,
                    cur.copy("COPY baseline_jobs (task, args) FROM STDIN") as copy,
                ):
                    copy.write(text)
                conn.commit()
                out.setdefault("raw COPY, prebuilt text (server + send)", []).append(
                    time.perf_counter() - start
                )
    return out


def paired_round(server: Server, n: int, singles: int) -> dict[str, float]:
    """One round of the before/after comparison, in jobs/s: ``enqueue_many`` of ``n`` jobs and
    the raw COPY of ``n`` rows, then ``singles`` single ``enqueue`` calls (one transaction each)
    and as many raw one-row INSERTs, each pair measured back to back in fresh databases."""
    out: dict[str, float] = {}
    with server.app_beside_baseline("pair") as (pgq, conninfo):
        task = pgq.registry.get(app.NOOP)
        task.enqueue_many([{"n": i} for i in range(2000)])  # warm-up (compiles)
        task.enqueue(n=0)
        baseline.enqueue_copy(conninfo, 10)
        items = [{"n": i} for i in range(n)]
        begin = time.perf_counter()
        assert len(task.enqueue_many(items)) == n
        out["enqueue_many"] = n / (time.perf_counter() - begin)
        out["raw_copy"] = n / baseline.enqueue_copy(conninfo, n)
        begin = time.perf_counter()
        for i in range(singles):
            task.enqueue(n=i)
        out["enqueue1"] = singles / (time.perf_counter() - begin)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            begin = time.perf_counter()
            for i in range(singles):
                baseline.insert_one(conn, i)
            out["raw_insert1"] = singles / (time.perf_counter() - begin)
    out["load1"] = float(Path("/proc/loadavg").read_text().split()[0])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--paired-round",
        type=int,
        metavar="SINGLES",
        help="print one round of the before/after comparison as JSON (SINGLES single enqueues)",
    )
    args = parser.parse_args(argv)
    n, rounds = args.jobs, args.rounds
    if args.paired_round is not None:
        with start(os.environ.get("PGQUEUE_DATABASE_URL")) as server:
            print(json.dumps(paired_round(server, n, args.paired_round)))
        return
    with start(os.environ.get("PGQUEUE_DATABASE_URL")) as server:
        version = server.settings()["server_version"]
        raw = raw_copy(server, n, rounds)
        with server.fresh_database("steps") as url:
            pgq = app.build(sqlalchemy_url(url))
            try:
                app_task = pgq.registry.get(app.NOOP)
                app_task.enqueue_many([{"n": i} for i in range(2000)])  # warm-up (compiles)
                client = client_steps(pgq, n, rounds)
                statements, totals = statement_steps(pgq, n, rounds)
                tables = server_tables(libpq(url), pgq, n, rounds)
            finally:
                pgq.dispose()
    raw_total = _median_per_job(raw["raw COPY, write_row per row (the suite's ceiling)"], n)
    print(f"enqueue_many of {n} no-op jobs, PostgreSQL {version}, {rounds} rounds (medians)")
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"{'step':<62} {'us/job':>8} {'x raw':>7}")
    for section in (client, statements, tables, raw):
        for name, samples in section.items():
            per_job = _median_per_job(samples, n)
            print(f"{name:<62} {per_job:>8.2f} {per_job / raw_total:>7.2f}")
        print()
    total = _median_per_job(totals, n)
    print(f"{'enqueue_many total':<62} {total:>8.2f} {total / raw_total:>7.2f}")
    print(f"{'ratio (raw COPY time / enqueue_many time)':<62} {raw_total / total:>8.2f}")


if __name__ == "__main__":
    main()
