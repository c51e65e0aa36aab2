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

Each round runs the five in a shuffled order, ``--calls`` each; the report gives each layer's
medians over the rounds and its ratio to the raw insert's wall time. The differences between
adjacent layers are what each layer costs. Writes ``benchmarks/results/<stamp>-enqueue-layers.json``.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import app, baseline
from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq
from pgqueue.data import enqueue as enqueue_data
from pgqueue.sql import enqueue as enqueue_sql
from pgqueue.tasks import ConfiguredTask, EnqueueOptions

LAYERS = ("raw_insert", "statement", "held_connection", "unit_of_work", "enqueue")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(call: Callable[[int], Any], calls: int) -> tuple[float, float]:
    """Microseconds of wall time and of this process's CPU per call of ``call``."""
    wall, cpu = time.perf_counter(), _cpu()
    for i in range(calls):
        call(i)
    return (time.perf_counter() - wall) / calls * 1e6, (_cpu() - cpu) / calls * 1e6


def measure(server: Server, calls: int, rounds: int) -> dict[str, Any]:
    """The layers' samples and medians (see the module's docstring); also the number of jobs
    each layer that writes jobs left in the table, which must be all it was asked for."""
    with server.app_beside_baseline("layers") as (pgq, raw):
        task = pgq.registry.get(app.NOOP)
        database = pgq.database
        job = ConfiguredTask(task, EnqueueOptions())._build((), {"n": 0})
        compiled = database.statements.get(enqueue_sql.insert_one_job())
        params = compiled.params(enqueue_data.one_job_params(job))
        held = database.held_connection()
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
            for call in layers.values():  # warm-up: prepared statements, pool, caches
                for i in range(100):
                    call(i)
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYERS}
            for _ in range(rounds):
                order = list(LAYERS)
                random.shuffle(order)
                for name in order:
                    samples[name].append(_timed(layers[name], calls))
            jobs = conn.execute("SELECT count(*) FROM pgqueue_jobs").fetchone()
        held.close()
    expected_jobs = 4 * (100 + rounds * calls)
    raw_wall = statistics.median(wall for wall, _ in samples["raw_insert"])
    medians = {
        name: {
            "wall_us": statistics.median(wall for wall, _ in samples[name]),
            "cpu_us": statistics.median(cpu for _, cpu in samples[name]),
        }
        for name in LAYERS
    }
    for values in medians.values():
        values["raw_wall_over_wall"] = raw_wall / values["wall_us"]
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
        "| layer | wall us per call | client CPU us per call | raw insert's wall / this wall |",
        "|---|---:|---:|---:|",
    ]
    for name in LAYERS:
        m = result["medians"][name]
        lines.append(
            f"| {name} | {m['wall_us']:.0f} | {m['cpu_us']:.0f} | {m['raw_wall_over_wall']:.2f}x |"
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
