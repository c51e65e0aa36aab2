"""A pgqueue worker that also times every claim statement, for the soak (``benchmarks.soak``).

Run as ``python -m benchmarks.soak_worker OUT.json CONCURRENCY`` with ``$PGQUEUE_BENCH_URL``.
It is the ordinary ``Worker`` (default settings); the only additions are a wrapper around its
store's ``claim`` that records (wall time, seconds, jobs claimed) and a count of its failed
claim attempts. On SIGTERM it stops like any
worker and writes the samples to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from benchmarks.app import make_app
from pgqueue import Worker


def main() -> None:
    out, concurrency = sys.argv[1], int(sys.argv[2])
    worker = Worker(make_app(), concurrency=concurrency, install_signal_handlers=True)
    samples: list[tuple[float, float, int]] = []
    claim = worker.store.claim

    def timed_claim(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        jobs = claim(*args, **kwargs)
        samples.append((time.time(), time.perf_counter() - started, len(jobs)))
        return jobs

    worker.store.claim = timed_claim  # type: ignore[method-assign]
    failures = 0
    failed = worker.claim_health.failed

    def counted_failure(exc: BaseException, retry_in: float | None = None) -> None:
        nonlocal failures
        failures += 1
        failed(exc, retry_in)

    worker.claim_health.failed = counted_failure  # type: ignore[method-assign]
    stats = worker.run()
    with open(out, "w") as f:
        json.dump({"claims": samples, "processed": stats.processed, "claim_failures": failures}, f)


if __name__ == "__main__":
    main()
