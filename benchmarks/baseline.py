"""The ceiling: the same work done by hand-written SQL on one table, with psycopg directly.

One table ``baseline_jobs`` with a partial index over queued rows (and ``baseline_tickets``, only
for a second bulk ceiling that writes as many rows as pgqueue: a job and a ticket each), the common claim (a CTE that
selects ``FOR UPDATE SKIP LOCKED`` and an ``UPDATE ... RETURNING``), batched claims and batched
completions (``id = ANY(...)``), COPY for bulk enqueue and LISTEN/NOTIFY for wake-ups. No
leases, no heartbeats, no retries, no validation: that is what makes it a ceiling.

The drain runs ``THREADS`` threads, each on its own connection claiming batches of ``BATCH``:
the suite sweeps threads x batch and takes the best point as the ceiling, since one connection
in a loop leaves the server idle while the client completes a batch.

The workers run in a child process like pgqueue's (``python -m benchmarks.baseline drain URL
BATCH [THREADS [async]]`` / ``listen URL BATCH [async]``) so both sides pay the same interprocess
costs. ``async``: claims commit without waiting for their WAL flush (``CLAIM_ASYNC``), which
pgqueue's claims do not (a server crash could undo them); the suite runs the ceilings both ways
and takes the stronger.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

SCHEMA = """
CREATE TABLE baseline_jobs (
    id bigserial PRIMARY KEY,
    task text NOT NULL,
    args jsonb NOT NULL DEFAULT '[]',
    state text NOT NULL DEFAULT 'queued',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    attempts int NOT NULL DEFAULT 0,
    started_at timestamptz,
    finished_at timestamptz,
    result jsonb
);
CREATE INDEX baseline_jobs_ready ON baseline_jobs (priority, run_at, id) WHERE state = 'queued';
CREATE TABLE baseline_tickets (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now()
);
"""

INSERT_ONE = "INSERT INTO baseline_jobs (task, args) VALUES (%s, %s) RETURNING id"

CLAIM = """
WITH cte AS (
    SELECT id FROM baseline_jobs
    WHERE state = 'queued' AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE baseline_jobs AS j
SET state = 'running', attempts = j.attempts + 1, started_at = now()
FROM cte WHERE j.id = cte.id
RETURNING j.id, j.task, j.args
"""

# The same claim committing without waiting for its WAL flush: the strongest form of a bare
# loop, for the ceilings to be the strongest (pgqueue's claims commit durably).
CLAIM_ASYNC = CLAIM.replace(
    "FROM cte WHERE j.id = cte.id",
    "FROM cte WHERE j.id = cte.id"
    " AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL",
)

COMPLETE = """
UPDATE baseline_jobs AS j SET state = 'succeeded', finished_at = now(), result = r.result
FROM unnest(%s::bigint[], %s::jsonb[]) AS r(id, result)
WHERE j.id = r.id AND j.state = 'running'
"""

CHANNEL = "baseline"


def create_schema(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(SCHEMA)


def insert_one(conn: psycopg.Connection[Any], i: int) -> int:
    """One single-row INSERT on an autocommit connection: its own transaction (and fsync)."""
    row = conn.execute(INSERT_ONE, ("noop", Jsonb([i])), prepare=True).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_copy(conninfo: str, n: int) -> float:
    """``n`` rows with one COPY in one transaction; returns seconds."""
    with psycopg.connect(conninfo) as conn:
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY baseline_jobs (task, args) FROM STDIN") as copy:
            for i in range(n):
                copy.write_row(("noop", f"[{i}]"))
        conn.commit()
        return time.perf_counter() - start


def enqueue_copy_two_rows(conninfo: str, n: int) -> float:
    """``n`` jobs as pgqueue lays them out, a job row and a ticket row each, with two COPYs in one
    transaction (the ids are taken from the sequence first, as a client must to link the two);
    returns seconds. The bulk ceiling for as many rows as pgqueue writes."""
    with psycopg.connect(conninfo) as conn:
        start = time.perf_counter()
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT nextval('baseline_jobs_id_seq') FROM generate_series(1, %s)", (n,)
            )
        ]
        with conn.cursor() as cur:
            with cur.copy("COPY baseline_jobs (id, task, args) FROM STDIN") as copy:
                for i, job_id in enumerate(ids):
                    copy.write_row((job_id, "noop", f"[{i}]"))
            with cur.copy("COPY baseline_tickets (job_id) FROM STDIN") as copy:
                for job_id in ids:
                    copy.write_row((job_id,))
        conn.commit()
        return time.perf_counter() - start


def fill(conninfo: str, n: int) -> None:
    enqueue_copy(conninfo, n)


def span(conninfo: str) -> dict[str, Any]:
    """Counts, first claim -> last completion, and the 10th -> 90th percentile of completions."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*),"
            " extract(epoch FROM max(finished_at) - min(started_at))::float8,"
            " extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at)"
            " - percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at))::float8"
            " FROM baseline_jobs"
        ).fetchone()
    assert row is not None
    return {"succeeded": row[0], "total": row[1], "span_s": row[2], "steady_s": row[3]}


def _run_batch(conn: psycopg.Connection[Any], batch: int, async_claims: bool = False) -> int:
    rows = conn.execute(CLAIM_ASYNC if async_claims else CLAIM, (batch,), prepare=True).fetchall()
    if not rows:
        return 0
    ids: list[int] = []
    results: list[Jsonb] = []
    for job_id, _task, _args in rows:
        ids.append(job_id)
        results.append(Jsonb(time.time()))  # the handler: report when it started
    conn.execute(COMPLETE, (ids, results), prepare=True)
    return len(rows)


def drain(conninfo: str, batch: int, threads: int = 1, async_claims: bool = False) -> int:
    """Claim ``batch`` at a time and complete them until nothing is ready, on ``threads``
    connections at once (``async_claims``: claims commit without waiting for their WAL flush);
    returns the count."""
    counts = [0] * threads
    # Every thread connects before any claims, so the first claims do not run alone while the
    # other threads are still connecting.
    ready = threading.Barrier(threads)

    def run(index: int) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            ready.wait()
            while got := _run_batch(conn, batch, async_claims):
                counts[index] += got

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts)


def listen(conninfo: str, batch: int, async_claims: bool = False) -> None:
    """Idle worker: LISTEN, and on each notification claim until empty (``async_claims``: see
    ``drain``). Stops on SIGTERM."""
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        print("listening", flush=True)
        while not stopping:
            while _run_batch(conn, batch, async_claims):
                pass
            # Wait for one NOTIFY (psycopg keeps those that arrived during the claims in a
            # backlog, so none is missed), or poll after a second.
            for _ in conn.notifies(timeout=1.0, stop_after=1):
                pass


def enqueue_notify(conn: psycopg.Connection[Any], i: int) -> None:
    """One job in its own transaction with a NOTIFY (what a trigger would send)."""
    with conn.transaction():
        conn.execute(INSERT_ONE, ("probe", Jsonb([i])), prepare=True)
        conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,), prepare=True)


def probe_results(conninfo: str) -> dict[int, float]:
    """Job id -> handler start wall time (epoch seconds) for completed probes."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, result FROM baseline_jobs WHERE task = 'probe' AND state = 'succeeded'"
        ).fetchall()
    return {job_id: float(result) for job_id, result in rows}


if __name__ == "__main__":
    # drain URL BATCH [THREADS [async]] / listen URL BATCH [async]
    mode, url, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asynchronous = sys.argv[-1] == "async"
    if mode == "drain":
        threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
        print(json.dumps({"processed": drain(url, size, threads, asynchronous)}))
    else:
        listen(url, size, asynchronous)
