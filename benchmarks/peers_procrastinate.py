"""procrastinate as a peer: its schema installer, its defer API and its worker, no-op jobs.

Everything goes through procrastinate's documented public API with its ``PsycopgConnector``:
``schema_manager.apply_schema_async()`` for the schema, ``task.defer_async`` (one job, one
transaction) and ``task.batch_defer_async`` (its batch insert), and ``App.run_worker_async``
for the worker, in a child process: ``python -m benchmarks.peers_procrastinate drain URL
SETTING`` runs with ``wait=False`` (it exits when no job is left); ``listen URL SETTING STARTS``
waits for jobs until SIGTERM and appends ``index wall-time`` for each probe job's handler start
to the file ``STARTS``.

procrastinate keeps finished jobs and records each status change in ``procrastinate_events``
(``at`` is the changing transaction's ``now()``), so the drain is timed from the first
``started`` event to the ``succeeded`` ones, by the database clock as for pgqueue.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import procrastinate
import psycopg

NAME = "procrastinate"
NOOP = "noop"
PROBE = "probe"
# ``procrastinate worker``'s defaults: one job at a time.
DEFAULT: dict[str, int] = {"concurrency": 1}
SWEEP: tuple[dict[str, int], ...] = ({"concurrency": 10}, {"concurrency": 50})
# Its drain runs at a few hundred jobs/s here: a tenth of the suite's drain size keeps a
# steady window of many seconds without spending minutes per point.
DRAIN_FRACTION = 0.1


def _app(conninfo: str, out: IO[str] | None = None) -> procrastinate.App:
    """An app with the no-op and the probe task on ``conninfo``."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name=NOOP)
    async def noop(n: int = 0) -> None:
        """Does nothing: the queue's own overhead per job."""

    @app.task(name=PROBE)
    async def probe(n: int = 0) -> None:
        """Records when the handler started, for the latency workload."""
        now = time.time()
        assert out is not None
        out.write(f"{n} {now}\n")

    return app


def _task(app: procrastinate.App, name: str) -> Any:
    return app.tasks[name]


async def _install(conninfo: str) -> None:
    app = _app(conninfo)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


def install(conninfo: str) -> None:
    asyncio.run(_install(conninfo))


async def _enqueue1(conninfo: str, n: int) -> float:
    app = _app(conninfo)
    async with app.open_async():
        task = _task(app, NOOP)
        for i in range(20):  # warm-up
            await task.defer_async(n=i)
        start = time.perf_counter()
        for i in range(n):
            await task.defer_async(n=i)
        return n / (time.perf_counter() - start)


def enqueue1(conninfo: str, n: int) -> float:
    """Jobs/s for ``n`` single defers, each its own transaction."""
    return asyncio.run(_enqueue1(conninfo, n))


async def _enqueue_bulk(conninfo: str, n: int) -> float:
    app = _app(conninfo)
    async with app.open_async():
        task = _task(app, NOOP)
        await task.batch_defer_async(*({"n": i} for i in range(10)))  # warm-up
        items = [{"n": i} for i in range(n)]
        start = time.perf_counter()
        ids = await task.batch_defer_async(*items)
        rate = n / (time.perf_counter() - start)
        assert len(ids) == n
        return rate


def enqueue_bulk(conninfo: str, n: int) -> float:
    """Jobs/s for one batch defer of ``n`` jobs."""
    return asyncio.run(_enqueue_bulk(conninfo, n))


async def _fill(conninfo: str, n: int) -> None:
    app = _app(conninfo)
    async with app.open_async():
        task = _task(app, NOOP)
        for start in range(0, n, 50_000):
            await task.batch_defer_async(*({"n": i} for i in range(start, min(n, start + 50_000))))


def fill(conninfo: str, n: int) -> None:
    asyncio.run(_fill(conninfo, n))


def span(conninfo: str) -> dict[str, Any]:
    """Succeeded and total jobs, first start -> last success, and the 10th -> 90th percentile
    of success times (the steady window), from procrastinate's jobs and events tables."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM procrastinate_jobs"
            "  WHERE task_name = %s AND status = 'succeeded'),"
            " (SELECT count(*) FROM procrastinate_jobs WHERE task_name = %s),"
            " extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')"
            " - min(e.at) FILTER (WHERE e.type = 'started'))::float8,"
            " extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY e.at)"
            " FILTER (WHERE e.type = 'succeeded')"
            " - percentile_disc(0.1) WITHIN GROUP (ORDER BY e.at)"
            " FILTER (WHERE e.type = 'succeeded'))::float8"
            " FROM procrastinate_events AS e JOIN procrastinate_jobs AS j ON j.id = e.job_id"
            " WHERE j.task_name = %s",
            (NOOP, NOOP, NOOP),
        ).fetchone()
    assert row is not None
    return {"succeeded": row[0], "total": row[1], "span_s": row[2], "steady_s": row[3]}


async def _probes(conninfo: str, indexes: Iterator[int]) -> dict[int, float]:
    sent: dict[int, float] = {}
    app = _app(conninfo)
    async with app.open_async():
        task = _task(app, PROBE)
        for i in indexes:
            await task.defer_async(n=i)
            sent[i] = time.time()  # commit acknowledged
    return sent


def probes(conninfo: str, indexes: Iterator[int]) -> dict[int, float]:
    """Defer a probe job per index (as the iterator paces them); index -> commit time."""
    return asyncio.run(_probes(conninfo, indexes))


async def _work(conninfo: str, setting: dict[str, int], starts: str | None) -> None:
    with open(starts or os.devnull, "a", buffering=1) as out:
        app = _app(conninfo, out)
        async with app.open_async():
            await app.run_worker_async(
                concurrency=setting.get("concurrency", 1), wait=starts is not None
            )


if __name__ == "__main__":
    command, url, setting_json = sys.argv[1:4]
    asyncio.run(_work(url, json.loads(setting_json), sys.argv[4] if command == "listen" else None))
