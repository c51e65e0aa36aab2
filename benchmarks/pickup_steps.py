"""Where an idle worker's pick-up spends its time: from the enqueue's commit to the handler's
first line, step by step.

``python -m benchmarks.pickup_steps [--jobs 400] [--concurrency 10]`` on
``$PGQUEUE_DATABASE_URL`` (or a durable embedded server) starts one ``Worker`` in this process,
enqueues ``--jobs`` probe jobs one at a time (each after the previous one ran) and times, with
``time.perf_counter`` in the same process:

- ``commit -> notification``: from the enqueue's return (its commit acknowledged) to the
  listener thread's handling of the wake-up (``Notifier._dispatch``);
- ``notification -> claim sent``: to the claim's start (``WorkerStore.claim``), on the thread the
  notification woke;
- ``claim``: the claim statement and its commit, one round trip;
- ``claim -> handler``: from the claim's return to the handler's first line (building the
  attempt, handing it to a pool thread);
- ``total``.

The two worker methods are wrapped in this process only, to read the clock; nothing else
changes. Prints each step's p50 and p90 in milliseconds and writes the JSON to
``benchmarks/results/<timestamp>-pickup-steps.json``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from benchmarks.run import standalone, write_json
from benchmarks.server import Server, sqlalchemy_url
from pgqueue import PgQueue, Settings, Worker
from pgqueue.worker import notifier, store

STEPS = ("commit -> notification", "notification -> claim sent", "claim", "claim -> handler")


class Clock:
    """When the listener handled each wake-up, and when each claim began and returned."""

    def __init__(self) -> None:
        self.notified: list[float] = []
        self.claim_sent: list[float] = []
        self.claim_returned: list[float] = []

    def clear(self) -> None:
        self.notified.clear()
        self.claim_sent.clear()
        self.claim_returned.clear()

    def install(self) -> None:
        dispatch, claim = notifier.Notifier._dispatch, store.WorkerStore.claim

        def timed_dispatch(listener: Any, payload: str) -> None:
            self.notified.append(time.perf_counter())
            dispatch(listener, payload)

        def timed_claim(worker_store: Any, request: Any) -> Any:
            self.claim_sent.append(time.perf_counter())
            try:
                return claim(worker_store, request)
            finally:
                self.claim_returned.append(time.perf_counter())

        setattr(notifier.Notifier, "_dispatch", timed_dispatch)  # noqa: B010
        setattr(store.WorkerStore, "claim", timed_claim)  # noqa: B010


def _first_after(times: list[float], moment: float) -> float | None:
    return next((t for t in times if t > moment), None)


def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    clock = Clock()
    clock.install()
    started: dict[int, float] = {}
    samples: list[tuple[float, ...]] = []
    with server.fresh_database("pickup_steps") as url:
        pgq = PgQueue(sqlalchemy_url(url), settings=Settings())

        @pgq.task(name="bench.probe")
        def probe(i: int) -> None:
            started[i] = time.perf_counter()

        worker = Worker(pgq, concurrency=args.concurrency)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            for i in range(20):  # warm-up: connections open, statements prepared
                probe.enqueue(-i - 1)
            time.sleep(1.0)
            for i in range(args.jobs):
                clock.clear()
                sent = time.perf_counter()
                probe.enqueue(i)
                committed = time.perf_counter()
                deadline = time.monotonic() + 5
                while i not in started and time.monotonic() < deadline:
                    time.sleep(0.0005)
                time.sleep(0.01)  # the claim's return is recorded after the handler may start
                marks = (
                    _first_after(clock.notified, sent),
                    _first_after(clock.claim_sent, sent),
                    _first_after(clock.claim_returned, sent),
                )
                if i not in started or any(m is None for m in marks):
                    continue
                notified, claim_sent, claim_returned = (float(m or 0.0) for m in marks)
                samples.append(
                    (
                        notified - committed,
                        claim_sent - notified,
                        claim_returned - claim_sent,
                        started[i] - claim_returned,
                        started[i] - committed,
                    )
                )
        finally:
            worker.stop()
            thread.join(timeout=30)
            pgq.dispose()
    steps: dict[str, dict[str, float]] = {}
    for index, name in enumerate((*STEPS, "total")):
        values = sorted(sample[index] * 1000 for sample in samples)
        steps[name] = {
            "p50_ms": statistics.median(values),
            "p90_ms": values[int(len(values) * 0.9)],
        }
    return {"jobs": args.jobs, "samples": len(samples), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    report = standalone(run, args)
    print("| step | p50 ms | p90 ms |")
    print("|---|---:|---:|")
    for name, found in report["steps"].items():
        print(f"| {name} | {found['p50_ms']:.3f} | {found['p90_ms']:.3f} |")
    print(f"{report['samples']} of {report['jobs']} jobs timed")
    report["mode"] = "pickup-steps"
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
