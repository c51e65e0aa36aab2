"""pgqueuer as a peer: its schema installer, its enqueue API and its worker, no-op jobs.

Everything goes through pgqueuer's documented public API on its asyncpg driver (the one its
documentation leads with; on its psycopg driver the same drain ran about 3x slower here):
``Queries.install()`` for the schema, ``Queries.enqueue`` with one
entrypoint (one statement, its own transaction on the autocommit connection) or with lists
(its batch insert), and ``pgqueuer.run`` (what ``pgq run`` calls) for the worker, in a child
process: ``python -m benchmarks.peers_pgqueuer drain URL SETTING`` exits when the queue is empty
(``mode=drain``); ``listen URL SETTING STARTS`` waits for jobs until SIGTERM and appends
``index wall-time`` for each probe job's handler start to the file ``STARTS``.

pgqueuer deletes a finished job from its queue table and logs each status change in
``pgqueuer_log`` (``created`` is the logging transaction's ``now()``), so the drain is timed
from the first ``picked`` entry to the ``successful`` ones, by the database clock as for
pgqueue.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import IO, Any

import asyncpg
import pgqueuer
import psycopg
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

NAME = "pgqueuer"
NOOP = "noop"
PROBE = "probe"
# ``pgq run``'s defaults: batches of 10, no cap on concurrent jobs.
DEFAULT: dict[str, int] = {"batch_size": 10}
SWEEP: tuple[dict[str, int], ...] = (
    {"batch_size": 10},
    {"batch_size": 50},
    {"batch_size": 100},
    {"batch_size": 100, "max_concurrent_tasks": 200},
)
DRAIN_FRACTION = 1.0


@asynccontextmanager
async def _queries(conninfo: str) -> AsyncIterator[Queries]:
    conn = await asyncpg.connect(conninfo)
    try:
        yield Queries(AsyncpgDriver(conn))
    finally:
        await conn.close()


async def _install(conninfo: str) -> None:
    async with _queries(conninfo) as queries:
        await queries.install()


def install(conninfo: str) -> None:
    asyncio.run(_install(conninfo))


async def _enqueue1(conninfo: str, n: int) -> float:
    async with _queries(conninfo) as queries:
        for i in range(20):  # warm-up
            await queries.enqueue(NOOP, str(i).encode())
        start = time.perf_counter()
        for i in range(n):
            await queries.enqueue(NOOP, str(i).encode())
        return n / (time.perf_counter() - start)


def enqueue1(conninfo: str, n: int) -> float:
    """Jobs/s for ``n`` single enqueues, each its own transaction."""
    return asyncio.run(_enqueue1(conninfo, n))


async def _enqueue_bulk(conninfo: str, n: int) -> float:
    async with _queries(conninfo) as queries:
        await queries.enqueue([NOOP] * 10, [b"0"] * 10, [0] * 10)  # warm-up
        payloads: list[bytes | None] = [str(i).encode() for i in range(n)]
        start = time.perf_counter()
        ids = await queries.enqueue([NOOP] * n, payloads, [0] * n)
        rate = n / (time.perf_counter() - start)
        assert len(ids) == n
        return rate


def enqueue_bulk(conninfo: str, n: int) -> float:
    """Jobs/s for one batch enqueue of ``n`` jobs."""
    return asyncio.run(_enqueue_bulk(conninfo, n))


async def _fill(conninfo: str, n: int) -> None:
    async with _queries(conninfo) as queries:
        for start in range(0, n, 50_000):
            size = min(n, start + 50_000) - start
            await queries.enqueue([NOOP] * size, [b"0"] * size, [0] * size)


def fill(conninfo: str, n: int) -> None:
    asyncio.run(_fill(conninfo, n))


def span(conninfo: str) -> dict[str, Any]:
    """Succeeded and enqueued counts, first pick -> last success, and the 10th -> 90th
    percentile of success times (the steady window), from pgqueuer's log table."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'),"
            " count(*) FILTER (WHERE status = 'queued'),"
            " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
            " - min(created) FILTER (WHERE status = 'picked'))::float8,"
            " extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY created)"
            " FILTER (WHERE status = 'successful')"
            " - percentile_disc(0.1) WITHIN GROUP (ORDER BY created)"
            " FILTER (WHERE status = 'successful'))::float8"
            " FROM pgqueuer_log WHERE entrypoint = %s",
            (NOOP,),
        ).fetchone()
    assert row is not None
    return {"succeeded": row[0], "total": row[1], "span_s": row[2], "steady_s": row[3]}


async def _probes(conninfo: str, indexes: Iterator[int]) -> dict[int, float]:
    sent: dict[int, float] = {}
    async with _queries(conninfo) as queries:
        for i in indexes:
            await queries.enqueue(PROBE, str(i).encode())
            sent[i] = time.time()  # commit acknowledged
    return sent


def probes(conninfo: str, indexes: Iterator[int]) -> dict[int, float]:
    """Enqueue a probe job per index (as the iterator paces them); index -> commit time."""
    return asyncio.run(_probes(conninfo, indexes))


async def _work(conninfo: str, setting: dict[str, int], starts: str | None) -> None:
    with open(starts or os.devnull, "a", buffering=1) as out:
        await _run(conninfo, setting, out, drain=starts is None)


async def _run(conninfo: str, setting: dict[str, int], out: IO[str], drain: bool) -> None:

    @asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        conn = await asyncpg.connect(conninfo)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(NOOP)
        async def noop(job: Job) -> None:
            """Does nothing: the queue's own overhead per job."""

        @pgq.entrypoint(PROBE)
        async def probe(job: Job) -> None:
            """Records when the handler started, for the latency workload."""
            now = time.time()
            assert job.payload is not None
            out.write(f"{job.payload.decode()} {now}\n")

        try:
            yield pgq
        finally:
            await conn.close()

    await pgqueuer.run(
        factory,
        batch_size=setting.get("batch_size", 10),
        max_concurrent_tasks=setting.get("max_concurrent_tasks"),
        mode=QueueExecutionMode.drain if drain else QueueExecutionMode.continuous,
    )


if __name__ == "__main__":
    command, url, setting_json = sys.argv[1:4]
    asyncio.run(_work(url, json.loads(setting_json), sys.argv[4] if command == "listen" else None))
