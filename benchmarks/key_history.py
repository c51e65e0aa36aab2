"""Claim cost against the number of concurrency keys ever used: a fresh database vs one whose key
table holds a long history of idle keys.

``python -m benchmarks.key_history [--rounds 3] [--history 1000000] [--jobs 3000] [--keys 100]
[--batch 10]`` on ``$PGQUEUE_DATABASE_URL`` (or a durable embedded server). Each round makes two
scratch databases, ``fresh`` and ``history`` (``--history`` idle key rows inserted by SQL and
analyzed, as months of keys made of customer ids would leave them), in alternating order, and
in each times, claim by claim, the worker's own claim (``WorkerStore.claim``, autocommit, the
flow form in both: a key row exists in both) of ``--batch`` jobs until none is left:

- ``plain``: ``--jobs`` jobs without a key;
- ``keyed``: ``--jobs`` jobs over ``--keys`` keys (no key limit, so every claim is full);
- ``raw SQL``: the same number of claims of the hand-written ``SKIP LOCKED`` baseline
  (``benchmarks.baseline``) in the same database, for the ratio the performance contract asks.

Reports the mean time per claim, the ratio ``history / fresh`` per kind (acceptance: at most
1.2) and each against the raw-SQL claim of the same database; medians over the rounds. Writes
the JSON to ``benchmarks/results/<timestamp>-key-history.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy.engine import URL

from benchmarks import baseline
from benchmarks.run import RESULTS_DIR, standalone
from benchmarks.server import Server, libpq, sqlalchemy_url
from pgqueue import PgQueue
from pgqueue.jobs import ClaimRequest
from pgqueue.worker.store import WorkerStore

ENQUEUE_CHUNK = 1_000
KINDS = ("plain", "keyed", "raw SQL")


def _insert_history(url: URL, n: int) -> None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue_concurrency_keys (key, key_limit)"
            " SELECT 'customer:' || g, 1 FROM generate_series(1, %s) AS g",
            [n],
        )
        # One live key in every database, so both claim with the flow form.
        conn.execute("INSERT INTO pgqueue_concurrency_keys (key) VALUES ('sentinel')")
        conn.execute("VACUUM ANALYZE pgqueue_concurrency_keys")


def _timed_claims(claim: Any, batch: int) -> list[float]:
    """Seconds per call of ``claim(batch)`` until one comes back short."""
    took: list[float] = []
    while True:
        start = time.perf_counter()
        got = claim(batch)
        took.append(time.perf_counter() - start)
        if got < batch:
            return took


def _one_database(url: URL, args: argparse.Namespace, history: int) -> dict[str, float]:
    _insert_history(url, history)
    pgq = PgQueue(sqlalchemy_url(url))

    @pgq.task(name="bench.plain")
    def plain(n: int) -> None: ...

    @pgq.task(name="bench.keyed", concurrency_key=lambda key, n: key)
    def keyed(key: str, n: int) -> None: ...

    store = WorkerStore(pgq.engine, stopping=threading.Event())

    def claim_pgqueue(limit: int) -> int:
        claimed = store.claim(
            ClaimRequest(
                worker_id="bench", limit=limit, queues=None, lease_seconds=300.0, task_leases={}
            )
        )
        return len(claimed)

    def enqueue(task: Any, items: list[dict[str, Any]]) -> None:
        for at in range(0, len(items), ENQUEUE_CHUNK):
            task.enqueue_many(items[at : at + ENQUEUE_CHUNK])
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute("ANALYZE pgqueue_message_queue")

    means: dict[str, float] = {}
    try:
        enqueue(plain, [{"n": n} for n in range(args.jobs)])
        claim_pgqueue(args.batch)  # the claimer sees the keys: the flow form from here on
        means["plain"] = statistics.fmean(_timed_claims(claim_pgqueue, args.batch))
        keyed_items = [{"key": f"live:{n % args.keys}", "n": n} for n in range(args.jobs)]
        enqueue(keyed, keyed_items)
        means["keyed"] = statistics.fmean(_timed_claims(claim_pgqueue, args.batch))
    finally:
        pgq.engine.dispose()
    conninfo = libpq(url)
    baseline.create_schema(conninfo)
    baseline.fill(conninfo, args.jobs)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ANALYZE baseline_jobs")

        def claim_raw(limit: int) -> int:
            return len(conn.execute(baseline.CLAIM, [limit]).fetchall())

        means["raw SQL"] = statistics.fmean(_timed_claims(claim_raw, args.batch))
    return means


def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, float]]] = []
    for index in range(args.rounds):
        order = [("fresh", 0), ("history", args.history)]
        if index % 2:
            order.reverse()
        results: dict[str, dict[str, float]] = {}
        for label, history in order:
            with server.fresh_database(f"keys_{label}") as url:
                results[label] = _one_database(url, args, history)
        rounds.append(results)
        print(f"round {index + 1}: {json.dumps(results)}", flush=True)

    def median(label: str, kind: str) -> float:
        return statistics.median(r[label][kind] for r in rounds)

    def median_ratio(kind: str) -> float:
        return statistics.median(r["history"][kind] / r["fresh"][kind] for r in rounds)

    def to_raw(label: str, kind: str) -> float:
        return statistics.median(r[label][kind] / r[label]["raw SQL"] for r in rounds)

    summary = {
        kind: {
            "fresh_ms": median("fresh", kind) * 1000,
            "history_ms": median("history", kind) * 1000,
            "history_over_fresh": median_ratio(kind),
            "fresh_over_raw": to_raw("fresh", kind),
            "history_over_raw": to_raw("history", kind),
        }
        for kind in KINDS
    }
    return {"rounds": rounds, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=3_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()
    report = standalone(run, args)
    print(f"| claim of {args.batch} | fresh ms | {args.history:,} keys ms | ratio | vs raw SQL |")
    print("|---|---|---|---|---|")
    for kind, row in report["summary"].items():
        print(
            f"| {kind} | {row['fresh_ms']:.2f} | {row['history_ms']:.2f} "
            f"| {row['history_over_fresh']:.2f}x "
            f"| {row['fresh_over_raw']:.2f}x / {row['history_over_raw']:.2f}x |"
        )
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{stamp}-key-history.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
