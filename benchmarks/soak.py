"""The soak: bursts of a steady enqueue rate separated by quiet periods, for minutes, watching
the claim, the ticket table and the first jobs after each quiet period.

5 minutes of load at 500 jobs/s against one worker, in bursts of a minute with ``quiet``
seconds (default 40) of no enqueue between them: longer than every periodic duty of an idle
worker (the prepared-statement plan refresh, maintenance, the registry heartbeat), so each burst
starts on a worker that sat idle through all of them. Per minute of load, the claim
statement's p95 (timed inside the worker by ``benchmarks.soak_worker``) must stay within 2x of
the first minute's, and ``pgqueue_message_queue`` (``pg_total_relation_size``: heap, indexes,
TOAST) must stay under 10 MB. After each quiet period the first jobs must be picked up within
``PICKUP_AFTER_QUIET_S``, and no claim of the worker may fail. Enqueueing is paced in batches of
``rate / 10`` every 100 ms with ``enqueue_many`` (one transaction each), so the enqueuer keeps
up on a busy machine.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from benchmarks import app
from benchmarks.server import Server, libpq, sqlalchemy_url
from benchmarks.workloads import percentiles, process, wait_until, worker_env

CONCURRENCY = 50
TICKS_PER_SECOND = 10
LIMIT_TICKETS_MB = 10.0
BURST_SECONDS = 60.0
SAMPLE_SECONDS = 5.0
# A listening worker starts a job within milliseconds of its commit; the poll (1 s) is the
# fallback, so a first job claimed later than that after a quiet period was not claimed at once.
PICKUP_AFTER_QUIET_S = 1.0


def run(server: Server, *, seconds: float, rate: float, quiet: float = 40.0) -> dict[str, Any]:
    per_tick = max(1, round(rate / TICKS_PER_SECOND))
    bursts = max(1, math.ceil(seconds / BURST_SECONDS))
    with server.fresh_database("soak") as url, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "claims.json"
        pgq = app.build(sqlalchemy_url(url))
        task = pgq.registry.get(app.NOOP)
        sizes: list[tuple[float, float, float, int]] = []  # (t, tickets MB, jobs MB, backlog)
        first_batches: list[list[int]] = []  # the first jobs of each burst
        command = [sys.executable, "-m", "benchmarks.soak_worker", str(out), str(CONCURRENCY)]
        enqueued = 0
        try:
            with (
                process(command, worker_env(url)) as child,
                psycopg.connect(libpq(url), autocommit=True) as conn,
            ):
                wait_until(lambda: _listening(conn), 60, "the soak worker's LISTEN")
                start = time.time()
                next_sample = start

                def sample() -> None:
                    nonlocal next_sample
                    if time.time() >= next_sample:
                        sizes.append((time.time() - start, *_sizes(conn)))
                        next_sample += SAMPLE_SECONDS

                for burst in range(bursts):
                    if burst:
                        quiet_until = time.time() + quiet
                        while time.time() < quiet_until:
                            time.sleep(min(0.5, max(0.0, quiet_until - time.time())))
                            sample()
                    burst_start = time.time()
                    length = min(BURST_SECONDS, seconds - burst * BURST_SECONDS)
                    tick = 0
                    while time.time() - burst_start < length:
                        pause = burst_start + tick / TICKS_PER_SECOND - time.time()
                        if pause > 0:
                            time.sleep(pause)
                        ids = task.enqueue_many([{"n": enqueued + i} for i in range(per_tick)])
                        if tick == 0:
                            first_batches.append(list(ids))
                        enqueued += per_tick
                        tick += 1
                        sample()
                wait_until(lambda: _sizes(conn)[2] == 0, 120, "the backlog to drain")
                sizes.append((time.time() - start, *_sizes(conn)))
                child.terminate()
                child.wait(60)
            claims = json.loads(out.read_text())
            finished = _finished_by_minute(url, start)
            after_quiet = _first_pickups(url, first_batches[1:])
        finally:
            pgq.dispose()
    result = _summarize(claims, sizes, finished, start, seconds, rate, enqueued)
    result["quiet"] = quiet
    result["bursts"] = bursts
    result["pickup_after_quiet_ms"] = after_quiet
    result["claim_failures"] = claims["claim_failures"]
    result["ok_after_quiet"] = claims["claim_failures"] == 0 and all(
        ms <= PICKUP_AFTER_QUIET_S * 1000 for ms in after_quiet
    )
    return result


def _first_pickups(url: Any, batches: list[list[int]]) -> list[float]:
    """For each batch, the longest wait (ms, enqueue -> claim) of its jobs."""
    if not batches:
        return []
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        return [
            float(
                conn.execute(
                    "SELECT max(extract(epoch FROM started_at - created_at)) * 1000"
                    " FROM pgqueue_jobs WHERE id = ANY(%s)",
                    (batch,),
                ).fetchone()[0]  # type: ignore[index]
            )
            for batch in batches
        ]


def _listening(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pgqueue-listener' AND query ILIKE 'LISTEN%%'"
    ).fetchone()
    return bool(row and row[0])


def _sizes(conn: psycopg.Connection[Any]) -> tuple[float, float, int]:
    row = conn.execute(
        "SELECT pg_total_relation_size('pgqueue_message_queue') / 1048576.0,"
        " pg_total_relation_size('pgqueue_jobs') / 1048576.0,"
        " (SELECT count(*) FROM pgqueue_message_queue)"
    ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1]), int(row[2])


def _finished_by_minute(url: Any, start: float) -> dict[int, dict[str, Any]]:
    """Per minute of the soak: jobs finished and their pickup delay (enqueue -> claim) p95."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT floor((extract(epoch FROM finished_at) - %s) / 60)::int AS minute,"
            " count(*), count(*) FILTER (WHERE state = 'succeeded'),"
            " percentile_cont(0.95) WITHIN GROUP"
            " (ORDER BY extract(epoch FROM started_at - created_at) * 1000)"
            " FROM pgqueue_jobs GROUP BY 1 ORDER BY 1",
            (start,),
        ).fetchall()
    return {m: {"finished": n, "succeeded": ok, "pickup_p95_ms": p95} for m, n, ok, p95 in rows}


def _summarize(
    claims: dict[str, Any],
    sizes: list[tuple[float, float, float, int]],
    finished: dict[int, dict[str, Any]],
    start: float,
    seconds: float,
    rate: float,
    enqueued: int,
) -> dict[str, Any]:
    minutes: list[dict[str, Any]] = []
    # Wall-clock minutes from the start: with quiet periods the soak lasts longer than its load.
    wall = max(seconds, sizes[-1][0] if sizes else 0.0)
    for minute in range(max(1, math.ceil(wall / 60))):
        window = [
            d * 1000
            for t, d, n in claims["claims"]
            if n > 0 and minute * 60 <= t - start < (minute + 1) * 60
        ]
        in_minute = [s for s in sizes if minute * 60 <= s[0] < (minute + 1) * 60]
        minutes.append(
            {
                "minute": minute + 1,
                "claims": len(window),
                "claim_p50_ms": percentiles(window)["p50"] if window else None,
                "claim_p95_ms": percentiles(window)["p95"] if window else None,
                "tickets_max_mb": max((s[1] for s in in_minute), default=None),
                "jobs_table_mb": max((s[2] for s in in_minute), default=None),
                "backlog_max": max((s[3] for s in in_minute), default=None),
                **finished.get(minute, {}),
            }
        )
    first = minutes[0]["claim_p95_ms"] or 0.0
    worst = max((m["claim_p95_ms"] or 0.0) for m in minutes)
    tickets_max = max(s[1] for s in sizes)
    return {
        "seconds": seconds,
        "rate": rate,
        "enqueued": enqueued,
        "processed": claims["processed"],
        "minutes": minutes,
        "claim_p95_worst_over_first": worst / first if first else None,
        "tickets_max_mb": tickets_max,
        "ok_claim": bool(first) and worst <= 2 * first,
        "ok_tickets": tickets_max < LIMIT_TICKETS_MB,
        "sizes": sizes,
    }


def print_report(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"soak: {result['rate']:.0f} jobs/s for {result['seconds']:.0f} s")
    for name in (
        "minute",
        "claims",
        "claim p50",
        "claim p95",
        "pickup p95",
        "tickets MB",
        "backlog",
    ):
        table.add_column(name, justify="right")
    for m in result["minutes"]:
        table.add_row(
            str(m["minute"]),
            str(m["claims"]),
            f"{m['claim_p50_ms']:.2f} ms" if m["claim_p50_ms"] is not None else "-",
            f"{m['claim_p95_ms']:.2f} ms" if m["claim_p95_ms"] is not None else "-",
            f"{m['pickup_p95_ms']:.1f} ms" if m.get("pickup_p95_ms") is not None else "-",
            f"{m['tickets_max_mb']:.2f}" if m["tickets_max_mb"] is not None else "-",
            str(m["backlog_max"]),
        )
    console.print(table)
    after = ", ".join(f"{ms:.1f}" for ms in result["pickup_after_quiet_ms"]) or "-"
    console.print(
        f"{result['bursts']} bursts with {result['quiet']:.0f} s quiet between them: first jobs "
        f"after each quiet period picked up in at most [{after}] ms (<= "
        f"{PICKUP_AFTER_QUIET_S * 1000:.0f}); claim failures {result['claim_failures']} "
        f"({'ok' if result['ok_after_quiet'] else 'NOT OK'})"
    )
    console.print(
        f"enqueued {result['enqueued']:,}, processed {result['processed']:,}; claim p95 worst/first "
        f"minute = {result['claim_p95_worst_over_first'] or 0:.2f} (<= 2: "
        f"{'yes' if result['ok_claim'] else 'no'}); ticket table max "
        f"{result['tickets_max_mb']:.2f} MB (< 10: {'yes' if result['ok_tickets'] else 'no'})"
    )
