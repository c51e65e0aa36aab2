"""Workflows: enqueueing a group against ``enqueue_many`` of as many jobs, and a chord's time from
enqueue to its callback's end against a plain drain of as many jobs.

``python -m benchmarks.workflows [--rounds 3] [--jobs 10000] [--concurrency 8]`` on
``$PGQUEUE_DATABASE_URL`` (or a durable embedded server). Each round, on fresh databases, in
alternating order:

- ``enqueue_many``: ``--jobs`` no-op jobs in one ``enqueue_many``; ``group``: a group of as
  many no-op signatures in one ``enqueue()``; the seconds each call took, after a first call
  of the same kind (warm connection and statements) and a garbage collection;
- ``drain``: ``--jobs`` no-op jobs enqueued, then one worker in this process
  (``--concurrency`` slots) runs them all; ``chord``: a chord of ``--jobs`` no-op members and
  a callback, run by the same kind of worker until the workflow ended; the seconds from the
  worker's start to the last job's end.

Reports each kind's median and the ratios group / enqueue_many and chord / drain. Writes the
JSON to ``benchmarks/results/<timestamp>-workflows.json`` (``benchmarks.run.write_json``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL

from benchmarks.run import standalone, write_json
from benchmarks.server import Server, sqlalchemy_url
from pgqueue import PgQueue, Settings, Worker, chord, group
from pgqueue.data.insert_choice import COPY_THRESHOLD
from pgqueue.testing import wait_for_states

KINDS = ("enqueue_many", "group", "drain", "chord")
QUEUE = "workflow_bench"


def _queue(url: URL) -> tuple[PgQueue, Any, Any]:
    pgq = PgQueue(sqlalchemy_url(url), settings=Settings())

    @pgq.task(name="bench.noop", queue=QUEUE)
    def noop(*_: Any) -> None:
        return None

    @pgq.task(name="bench.merge", queue=QUEUE)
    def merge(results: list[Any]) -> int:
        return len(results)

    return pgq, noop, merge


def _timed(kind: str, url: URL, jobs: int, concurrency: int) -> float:
    pgq, noop, merge = _queue(url)
    try:
        if kind in ("enqueue_many", "group"):
            # A first call of the same kind, at the size that takes the same path (COPY), so
            # the timed one finds its connection open and its statements prepared, and a
            # collection so it is not charged for the garbage of what ran before it.
            enqueue = _ENQUEUES[kind]
            enqueue(noop, COPY_THRESHOLD)
            gc.collect()
            started = time.perf_counter()
            enqueue(noop, jobs)
            return time.perf_counter() - started
        if kind == "drain":
            ids = noop.enqueue_many([[i] for i in range(jobs)])
            return _run(pgq, concurrency, lambda: wait_for_states(pgq, ids[-1:], timeout=600))
        workflow = chord([noop.s(i) for i in range(jobs)], merge.s()).enqueue()
        took = _run(pgq, concurrency, lambda: pgq.wait_for_workflow(workflow.id, timeout=600))
        status = pgq.get_workflow(workflow.id)
        if status.state != "succeeded" or status.result != jobs:
            raise SystemExit(f"chord ended {status.state} with result {status.result!r}")
        return took
    finally:
        pgq.dispose()


# The two enqueues compared, each of ``n`` no-op jobs.
_ENQUEUES: dict[str, Callable[[Any, int], Any]] = {
    "enqueue_many": lambda noop, n: noop.enqueue_many([[i] for i in range(n)]),
    "group": lambda noop, n: group(noop.s(i) for i in range(n)).enqueue(),
}


def _run(pgq: PgQueue, concurrency: int, until: Any) -> float:
    """Seconds from a worker's start until ``until()`` returned."""
    worker = Worker(pgq, queues=[QUEUE], concurrency=concurrency)
    thread = threading.Thread(target=worker.run, daemon=True)
    started = time.perf_counter()
    thread.start()
    try:
        until()
        return time.perf_counter() - started
    finally:
        worker.stop()
        thread.join(timeout=60)


def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for index in range(args.rounds):
        order = list(KINDS) if index % 2 == 0 else list(reversed(KINDS))
        for kind in order:
            with server.fresh_database(f"workflows_{index}_{kind}") as url:
                seconds[kind].append(_timed(kind, url, args.jobs, args.concurrency))
        print(f"round {index + 1}: { ({k: round(v[-1], 3) for k, v in seconds.items()}) }")
    medians = {kind: statistics.median(found) for kind, found in seconds.items()}
    return {
        "seconds": seconds,
        "medians": medians,
        "group_vs_enqueue_many": medians["group"] / medians["enqueue_many"],
        "chord_vs_drain": medians["chord"] / medians["drain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    report = standalone(run, args)
    print("| kind | median s |")
    print("|---|---|")
    for kind, value in report["medians"].items():
        print(f"| {kind} | {value:.3f} |")
    print(f"group / enqueue_many: {report['group_vs_enqueue_many']:.2f}x")
    print(f"chord / drain: {report['chord_vs_drain']:.2f}x")
    report["mode"] = "workflows"
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
