"""Where a single enqueue's time goes, layer by layer, beside the raw one-row insert.

``python -m benchmarks.enqueue_layers [--calls 1000] [--rounds 11]`` on ``$PGQUEUE_DATABASE_URL``
(or a durable embedded server) times, per call, the wall time and this process's CPU time of:

- ``raw_insert``: the suite's baseline, one prepared single-row ``INSERT`` in autocommit
  (``benchmarks.baseline.insert_one``), in a database of its own;
- ``statement``: pgqueue's single-job insert (``sql.enqueue.insert_one_job``) as the driver
  sends it, on a psycopg connection of its own in autocommit, through one cursor: the server's
  share and psycopg's, with nothing of pgqueue's around it;
- ``held_connection``: the same statement through ``Database.held_connection()`` (the worker
  claimer's connection, kept checked out in autocommit): pgqueue's executor without the pool;
- ``unit_of_work``: the same statement in pgqueue's unit of work (``Database.run``: the pool's
  checkout and return, the dead-connection check, the autocommit switches);
- ``enqueue``: ``task.enqueue(n=i)``, which adds the job's build and the insert's routing.

And from asyncio code, each call awaited in turn on one event loop:

- ``raw_async_insert``: the same raw insert on a psycopg ``AsyncConnection``: the asyncio
  layers' baseline;
- ``aenqueue_pooled``: ``task.aenqueue(n=i)`` on an AsyncEngine the caller gave, so each enqueue
  runs in a connection of the engine's pool through SQLAlchemy's asyncio layer;
- ``aenqueue``: ``task.aenqueue(n=i)`` on the AsyncEngine pgqueue made, whose single enqueues
  run on the connection it keeps between them (``aio.AsyncDatabase.run_single``).

Each round runs the eight in a shuffled order, ``--calls`` each; the report gives each layer's
medians over the rounds and its ratio to its baseline's wall time (the raw insert, or the raw
asyncio insert for the asyncio layers). The differences between adjacent layers are what each
layer costs. Writes ``benchmarks/results/<stamp>-enqueue-layers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks import app, baseline
from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq
from pgqueue import Settings
from pgqueue.connections import create_async_queue_engine
from pgqueue.data import enqueue as enqueue_data
from pgqueue.sql import enqueue as enqueue_sql
from pgqueue.tasks import ConfiguredTask, EnqueueOptions

SYNC_LAYERS = ("raw_insert", "statement", "held_connection", "unit_of_work", "enqueue")
ASYNC_LAYERS = ("raw_async_insert", "aenqueue_pooled", "aenqueue")
LAYERS = SYNC_LAYERS + ASYNC_LAYERS
# The layer each one's ratio is taken against.
BASELINE_OF = {
    **{name: "raw_insert" for name in SYNC_LAYERS},
    **{name: "raw_async_insert" for name in ASYNC_LAYERS},
}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(call: Callable[[int], Any], calls: int) -> tuple[float, float]:
    """Microseconds of wall time and of this process's CPU per call of ``call``."""
    wall, cpu = time.perf_counter(), _cpu()
    for i in range(calls):
        call(i)
    return (time.perf_counter() - wall) / calls * 1e6, (_cpu() - cpu) / calls * 1e6


def _timed_async(
    loop: asyncio.AbstractEventLoop, call: Callable[[int], Awaitable[Any]], calls: int
) -> tuple[float, float]:
    """``_timed`` for a coroutine function, its calls awaited one after another on ``loop``."""

    async def run() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), _cpu()
        for i in range(calls):
            await call(i)
        return (time.perf_counter() - wall) / calls * 1e6, (_cpu() - cpu) / calls * 1e6

    return loop.run_until_complete(run())


async def _raw_async_insert(conn: psycopg.AsyncConnection[Any], i: int) -> int:
    """``baseline.insert_one`` on an asyncio connection."""
    cursor = await conn.execute(baseline.INSERT_ONE, ("noop", Jsonb([i])), prepare=True)
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


def measure(server: Server, calls: int, rounds: int) -> dict[str, Any]:
    """The layers' samples and medians (see the module's docstring); also the number of jobs
    each layer that writes jobs left in the table, which must be all it was asked for."""
    loop = asyncio.new_event_loop()
    with server.app_beside_baseline("layers") as (pgq, raw):
        task = pgq.registry.get(app.NOOP)
        database = pgq.database
        job = ConfiguredTask(task, EnqueueOptions())._build((), {"n": 0})
        compiled = database.statements.get(enqueue_sql.insert_one_job())
        params = compiled.params(enqueue_data.one_job_params(job))
        held = database.held_connection()
        given_engine = create_async_queue_engine(
            pgq.engine.url, Settings(), pool_size=5, max_overflow=10
        )
        pooled = app.build(
            pgq.engine.url.render_as_string(hide_password=False), async_engine=given_engine
        )
        pooled_task = pooled.registry.get(app.NOOP)
        raw_async = loop.run_until_complete(psycopg.AsyncConnection.connect(raw, autocommit=True))
        try:
            with (
                psycopg.connect(raw, autocommit=True) as raw_conn,
                psycopg.connect(libpq(pgq.url), autocommit=True) as conn,
                conn.cursor() as cursor,
            ):

                def statement(i: int) -> None:
                    cursor.execute(compiled.sql, params)
                    cursor.fetchall()

                layers: dict[str, Callable[[int], Any]] = {
                    "raw_insert": lambda i: baseline.insert_one(raw_conn, i),
                    "statement": statement,
                    "held_connection": lambda i: enqueue_data.insert_one_job(held, job),
                    "unit_of_work": lambda i: database.run(
                        lambda db: enqueue_data.insert_one_job(db, job), autocommit=True
                    ),
                    "enqueue": lambda i: task.enqueue(n=i),
                }
                async_layers: dict[str, Callable[[int], Awaitable[Any]]] = {
                    "raw_async_insert": lambda i: _raw_async_insert(raw_async, i),
                    "aenqueue_pooled": lambda i: pooled_task.aenqueue(n=i),
                    "aenqueue": lambda i: task.aenqueue(n=i),
                }

                def timed(name: str, n: int) -> tuple[float, float]:
                    if name in async_layers:
                        return _timed_async(loop, async_layers[name], n)
                    return _timed(layers[name], n)

                for name in LAYERS:  # warm-up: prepared statements, pools, caches
                    timed(name, 100)
                samples: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYERS}
                for _ in range(rounds):
                    order = list(LAYERS)
                    random.shuffle(order)
                    for name in order:
                        samples[name].append(timed(name, calls))
                jobs = conn.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()
        finally:
            held.close()
            loop.run_until_complete(raw_async.close())
            loop.run_until_complete(pgq.adispose())
            loop.run_until_complete(pooled.adispose())
            loop.run_until_complete(given_engine.dispose())
            loop.close()
    # Every layer but the two raw inserts writes its jobs into pgqueue's table.
    expected_jobs = (len(LAYERS) - 2) * (100 + rounds * calls)
    medians = {
        name: {
            "wall_us": statistics.median(wall for wall, _ in samples[name]),
            "cpu_us": statistics.median(cpu for _, cpu in samples[name]),
        }
        for name in LAYERS
    }
    for name, values in medians.items():
        values["baseline"] = BASELINE_OF[name]
        values["raw_wall_over_wall"] = medians[BASELINE_OF[name]]["wall_us"] / values["wall_us"]
    return {
        "calls": calls,
        "rounds": rounds,
        "samples": {name: [list(s) for s in samples[name]] for name in LAYERS},
        "medians": medians,
        "jobs_expected": expected_jobs,
        "jobs_written": int(jobs[0]) if jobs else 0,
    }


def markdown_table(result: dict[str, Any]) -> str:
    lines = [
        "| layer | wall us per call | client CPU us per call | baseline's wall / this wall |",
        "|---|---:|---:|---:|",
    ]
    for name in LAYERS:
        m = result["medians"][name]
        lines.append(
            f"| {name} | {m['wall_us']:.0f} | {m['cpu_us']:.0f} | "
            f"{m['raw_wall_over_wall']:.2f}x of {BASELINE_OF[name]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.enqueue_layers")
    parser.add_argument("--calls", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    report = standalone(lambda server, a: measure(server, a.calls, a.rounds), args)
    report["mode"] = "enqueue-layers"
    print(markdown_table(report))
    print(f"jobs written {report['jobs_written']:,} of {report['jobs_expected']:,}")
    print(f"JSON: {write_json(report, None)}")
    return 0 if report["jobs_written"] == report["jobs_expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
