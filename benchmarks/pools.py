"""The process pool against the thread pool, and beside Celery's prefork pool.

``python -m benchmarks.pools [--rounds 3] [--jobs 2000] [--slow-jobs 400] [--concurrency 4]
[--celery]`` on ``$PGQUEUE_DATABASE_URL`` (or a durable embedded server). Each round, on a
fresh database each, in alternating order, a worker in this process drains:

- ``no-op``: ``--jobs`` jobs that do nothing, with ``pool="thread"`` and ``pool="process"``;
- ``5 ms``: ``--slow-jobs`` jobs that sleep 5 ms, both ways;
- ``no-op, 1 slot``: ``--jobs`` / 4 no-op jobs at concurrency 1, both ways: the process pool's
  cost per job, in microseconds, is the difference of the two per-job times.

The time of a drain is that of its jobs: from the first start to the last finish the
database recorded (worker start-up excluded). With ``--celery`` (needs the ``peers`` extra and
Debian's ``redis-server``), the same no-op and 5 ms jobs go through a Celery worker with
``--pool prefork`` and the same concurrency, on a Redis broker started here, timed the same
way (each task returns when it started and finished). Reports jobs/s (medians over the rounds)
and writes the JSON to ``benchmarks/results/<timestamp>-pools.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import URL

from benchmarks.run import standalone, write_json
from benchmarks.server import Server, sqlalchemy_url
from pgqueue import PgQueue, Settings

POOLS = ("thread", "process")
SLOW_SECONDS = 0.005


def _drain(url: URL, pool: str, jobs: int, seconds: float, concurrency: int) -> float:
    """Jobs per second of a drain of ``jobs`` jobs that sleep ``seconds`` (0: do nothing)."""
    pgq = PgQueue(sqlalchemy_url(url), settings=Settings())

    @pgq.task(name="bench.pool_job")
    def pool_job(sleep: float) -> None:
        if sleep:
            time.sleep(sleep)

    try:
        pool_job.enqueue_many([[seconds]] * jobs)
        stats = pgq.run_worker(concurrency=concurrency, drain=True, pool=pool)
        if stats.succeeded != jobs:
            raise SystemExit(f"{pool} pool: {stats.succeeded} of {jobs} jobs succeeded")
        with pgq.engine.connect() as connection:
            span = connection.execute(
                text(
                    "SELECT extract(epoch FROM max(finished_at) - min(started_at)) "
                    "FROM pgqueue_jobs WHERE task_name = 'bench.pool_job'"
                )
            ).scalar_one()
    finally:
        pgq.dispose()
    return jobs / float(span)


def _round(server: Server, args: argparse.Namespace, index: int) -> dict[str, float]:
    cases = {
        "no-op": (args.jobs, 0.0, args.concurrency),
        "5 ms": (args.slow_jobs, SLOW_SECONDS, args.concurrency),
        "no-op, 1 slot": (max(args.jobs // 4, 1), 0.0, 1),
    }
    results: dict[str, float] = {}
    for case, (jobs, seconds, concurrency) in cases.items():
        pools = POOLS if index % 2 == 0 else tuple(reversed(POOLS))
        for pool in pools:
            with server.fresh_database(f"pools_{pool}") as url:
                results[f"{case} / {pool}"] = _drain(url, pool, jobs, seconds, concurrency)
    if args.celery:
        results["no-op / celery prefork"] = _celery(args.jobs, 0.0, args.concurrency)
        results["5 ms / celery prefork"] = _celery(args.slow_jobs, SLOW_SECONDS, args.concurrency)
    return results


# -- Celery ----------------------------------------------------------------------------------

CELERY_APP = """
import os, time
from celery import Celery
app = Celery("bench", broker=os.environ["BENCH_REDIS"], backend=os.environ["BENCH_REDIS"])
app.conf.worker_prefetch_multiplier = 4
app.conf.task_acks_late = True

@app.task(name="bench.pool_job")
def pool_job(sleep):
    began = time.time()
    if sleep:
        time.sleep(sleep)
    return [began, time.time()]
"""


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--celery needs Debian's redis-server (apt-get install redis-server)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


def _celery(jobs: int, seconds: float, concurrency: int) -> float:
    """Jobs per second of a Celery prefork worker draining ``jobs`` tasks queued before it
    starts, from the first task's start to the last one's finish."""
    from celery import Celery

    with _redis() as broker, tempfile.TemporaryDirectory() as directory:
        Path(directory, "bench_celery.py").write_text(CELERY_APP)
        env = {**os.environ, "BENCH_REDIS": broker, "PYTHONPATH": directory}
        client = Celery("bench", broker=broker, backend=broker)
        results = [client.send_task("bench.pool_job", args=[seconds]) for _ in range(jobs)]
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "bench_celery", "worker",
                "--pool", "prefork", "--concurrency", str(concurrency),
                "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat",
            ],
            env=env,
            cwd=directory,
        )  # fmt: skip
        try:
            spans = [result.get(timeout=600) for result in results]
        finally:
            worker.terminate()
            worker.wait(30)
            client.close()
    return jobs / (max(end for _, end in spans) - min(start for start, _ in spans))


def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    rounds = []
    for index in range(args.rounds):
        results = _round(server, args, index)
        rounds.append(results)
        print(f"round {index + 1}: {json.dumps(results)}", flush=True)
    summary = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    one_slot = {pool: 1e6 / summary[f"no-op, 1 slot / {pool}"] for pool in POOLS}
    return {
        "rounds": rounds,
        "summary": summary,
        "us_per_job_one_slot": one_slot,
        "process_overhead_us": one_slot["process"] - one_slot["thread"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--slow-jobs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--celery", action="store_true")
    args = parser.parse_args()
    report = standalone(run, args)
    print("| drain | jobs/s |")
    print("|---|---|")
    for name, jobs_per_s in report["summary"].items():
        print(f"| {name} | {jobs_per_s:,.0f} |")
    overhead = report["process_overhead_us"]
    print(f"process pool's cost per job (1 slot): {overhead:,.0f} us")
    report["mode"] = "pools"
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
