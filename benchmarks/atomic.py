"""Atomic jobs drained by a worker, beside the hand-written atomic claim of raw SQL.

``python -m benchmarks.atomic [--rounds 3] [--jobs 2000] [--concurrency 4] [--limit 2]`` on
``$PGQUEUE_DATABASE_URL`` (or a durable embedded server). Each round, on a fresh database each,
in alternating order:

- ``plain``: ``--jobs`` no-op atomic jobs, drained by a worker in this process with
  ``--concurrency`` slots (``PgQueue.run_worker(drain=True)``);
- ``limited``: the same in a queue whose concurrency limit is ``--limit``;
- ``raw SQL``: ``--concurrency`` threads, each on its own connection claiming one job of
  ``benchmarks.baseline``'s table and completing it in the same transaction (the design the
  atomic mode grew from: the work and its completion commit together), until none is left.

Reports jobs/s per kind (medians over the rounds) and each pgqueue kind's ratio to the raw
SQL of its round. Writes the JSON to ``benchmarks/results/<timestamp>-atomic.json`` (``benchmarks.run.write_json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.engine import URL

from benchmarks import baseline
from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq, sqlalchemy_url
from pgqueue import PgQueue, Settings

KINDS = ("plain", "limited", "raw SQL")
QUEUE = "atomic_bench"


def _drain_pgqueue(url: URL, args: argparse.Namespace, limit: int | None) -> float:
    """Jobs per second of a worker draining ``--jobs`` atomic no-op jobs."""
    pgq = PgQueue(sqlalchemy_url(url), settings=Settings())

    @pgq.task(name="bench.atomic_noop", queue=QUEUE, atomic=True)
    def atomic_noop(n: int = 0) -> None:
        """Does nothing: pgqueue's own cost per atomic job."""

    try:
        if limit is not None:
            pgq.set_queue_limit(QUEUE, limit)
        atomic_noop.enqueue_many([[n] for n in range(args.jobs)])
        began = time.perf_counter()
        pgq.run_worker(concurrency=args.concurrency, drain=True)
        took = time.perf_counter() - began
        succeeded = pgq.counts().get(QUEUE, {})
    finally:
        pgq.dispose()
    done = sum(count for state, count in succeeded.items() if state == "succeeded")
    if done != args.jobs:
        raise SystemExit(f"atomic drain: {done} of {args.jobs} jobs succeeded")
    return args.jobs / took


def _claim_and_complete_one(conn: psycopg.Connection[Any]) -> int:
    """One job claimed and completed in one transaction; 0 when none is left."""
    with conn.transaction():
        rows = conn.execute(baseline.CLAIM, (1,), prepare=True).fetchall()
        if rows:
            ids = [row[0] for row in rows]
            conn.execute(baseline.COMPLETE, (ids, [Jsonb(None)] * len(ids)), prepare=True)
    return len(rows)


def _drain_raw(url: URL, args: argparse.Namespace) -> float:
    conninfo = libpq(url)
    baseline.create_schema(conninfo)
    baseline.fill(conninfo, args.jobs)
    ready = threading.Barrier(args.concurrency + 1)

    def run() -> None:
        with psycopg.connect(conninfo) as conn:
            ready.wait()
            while _claim_and_complete_one(conn):
                pass

    threads = [threading.Thread(target=run) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    ready.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    span = baseline.span(conninfo)
    if span["succeeded"] != args.jobs:
        raise SystemExit(f"raw atomic drain: {span['succeeded']} of {args.jobs} jobs succeeded")
    return args.jobs / took


def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, float]] = []
    for index in range(args.rounds):
        order = list(KINDS) if index % 2 == 0 else list(reversed(KINDS))
        results: dict[str, float] = {}
        for kind in order:
            with server.fresh_database(f"atomic_{kind.replace(' ', '_')}") as url:
                if kind == "raw SQL":
                    results[kind] = _drain_raw(url, args)
                else:
                    limit = args.limit if kind == "limited" else None
                    results[kind] = _drain_pgqueue(url, args, limit)
        rounds.append(results)
        print(f"round {index + 1}: {json.dumps(results)}", flush=True)
    summary = {
        kind: {
            "jobs_per_s": statistics.median(r[kind] for r in rounds),
            "vs_raw": statistics.median(r[kind] / r["raw SQL"] for r in rounds),
        }
        for kind in KINDS
    }
    return {"rounds": rounds, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--limit", type=int, default=2)
    args = parser.parse_args()
    report = standalone(run, args)
    print("| atomic drain | jobs/s | vs raw SQL |")
    print("|---|---|---|")
    for kind, row in report["summary"].items():
        print(f"| {kind} | {row['jobs_per_s']:,.0f} | {row['vs_raw']:.2f}x |")
    report["mode"] = "atomic"
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
