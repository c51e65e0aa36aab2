"""Signal latency: from the commit of ``pgq.signal`` to the handler's return from
``ctx.wait_for_signal``, with an idle worker listening, beside a raw ``NOTIFY`` round trip.

``python -m benchmarks.signals [--rounds 3] [--samples 50]`` on ``$PGQUEUE_DATABASE_URL`` (or a
durable embedded server). Each round, on a fresh database:

- ``signal``: ``--samples`` times, one job suspended in ``ctx.wait_for_signal`` (a worker
  with one slot idles in this process, listening); the job is signalled in a transaction of
  the caller's session, and the time from the commit's return to the handler's return from
  the wait is one sample (both read from this process's ``perf_counter``);
- ``raw NOTIFY``: ``--samples`` times, a ``NOTIFY`` committed on one connection and received
  by another that ``LISTEN``\\s: the floor any wake-up over PostgreSQL pays.

Reports p50/p95/max per kind (over all rounds' samples) and the p50 ratio to the raw NOTIFY.
Writes the JSON to ``benchmarks/results/<timestamp>-signals.json``
(``benchmarks.run.write_json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import URL

from benchmarks.run import standalone, write_json
from benchmarks.server import Server, libpq, sqlalchemy_url
from pgqueue import JobContext, PgQueue, Settings, Worker

KINDS = ("signal", "raw NOTIFY")
QUEUE = "signal_bench"
_SUSPENDED = text(
    "SELECT count(*) FROM pgqueue_jobs j JOIN pgqueue_message_queue m ON m.job_id = j.id "
    "WHERE j.id = :id AND j.state = 'queued' AND m.run_at > now()"
)


def _wait(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"signals benchmark: timed out waiting until {what}")
        time.sleep(0.002)


def _signal_samples(url: URL, samples: int) -> list[float]:
    """Milliseconds from each signal's commit to its handler's return from the wait."""
    pgq = PgQueue(sqlalchemy_url(url), settings=Settings())
    returned: dict[int, float] = {}

    @pgq.task(name="bench.waits", queue=QUEUE, pass_context=True)
    def waits(ctx: JobContext) -> None:
        ctx.wait_for_signal("go", timeout=3600)
        returned[ctx.job_id] = time.perf_counter()

    worker = Worker(pgq, queues=[QUEUE], concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    took: list[float] = []
    try:
        for _ in range(samples):
            job_id = waits.enqueue()

            def suspended(job_id: int = job_id) -> bool:
                with pgq.engine.connect() as connection:
                    return bool(connection.execute(_SUSPENDED, {"id": job_id}).scalar())

            _wait(suspended, f"job {job_id} waits for its signal")
            # Let the worker finish writing the outcome and go idle on its listener.
            time.sleep(0.05)
            with pgq.sessions() as session:
                with session.begin():
                    pgq.signal(job_id, "go", session=session)
                committed = time.perf_counter()
            _wait(lambda job_id=job_id: job_id in returned, f"job {job_id} resumes")
            took.append((returned[job_id] - committed) * 1000)
    finally:
        worker.stop()
        thread.join(timeout=30)
        pgq.dispose()
    return took


def _notify_samples(url: URL, samples: int) -> list[float]:
    """Milliseconds from a committed NOTIFY to its delivery on a listening connection."""
    conninfo = libpq(url)
    took: list[float] = []
    with (
        psycopg.connect(conninfo, autocommit=True) as listener,
        psycopg.connect(conninfo, autocommit=True) as sender,
    ):
        listener.execute("LISTEN signal_bench")
        for n in range(samples):
            time.sleep(0.01)
            sender.execute("SELECT pg_notify('signal_bench', %s)", (str(n),))
            committed = time.perf_counter()
            for _ in listener.notifies(timeout=10, stop_after=1):
                took.append((time.perf_counter() - committed) * 1000)
    if len(took) != samples:
        raise SystemExit(f"raw NOTIFY: {len(took)} of {samples} notifications arrived")
    return took


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def run(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    rounds: list[dict[str, float]] = []
    for index in range(args.rounds):
        order = list(KINDS) if index % 2 == 0 else list(reversed(KINDS))
        medians: dict[str, float] = {}
        for kind in order:
            with server.fresh_database(f"signals_{index}_{kind.split()[-1].lower()}") as url:
                if kind == "signal":
                    found = _signal_samples(url, args.samples)
                else:
                    found = _notify_samples(url, args.samples)
            samples[kind].extend(found)
            medians[kind] = statistics.median(found)
        rounds.append(medians)
        print(f"round {index + 1} (p50 ms): {json.dumps(medians)}", flush=True)
    summary = {
        kind: {
            "p50_ms": _percentile(found, 0.5),
            "p95_ms": _percentile(found, 0.95),
            "max_ms": max(found),
            "samples": len(found),
        }
        for kind, found in samples.items()
    }
    summary["signal"]["p50_vs_raw"] = summary["signal"]["p50_ms"] / summary["raw NOTIFY"]["p50_ms"]
    return {"rounds": rounds, "summary": summary, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    report = standalone(run, args)
    print("| signal latency | p50 ms | p95 ms | max ms |")
    print("|---|---|---|---|")
    for kind, row in report["summary"].items():
        print(f"| {kind} | {row['p50_ms']:.2f} | {row['p95_ms']:.2f} | {row['max_ms']:.2f} |")
    print(f"signal p50 / raw NOTIFY p50: {report['summary']['signal']['p50_vs_raw']:.1f}x")
    report["mode"] = "signals"
    print(f"wrote {write_json(report, None)}")


if __name__ == "__main__":
    main()
