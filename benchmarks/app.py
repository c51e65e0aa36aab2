"""The benchmark tasks, importable by worker subprocesses as ``benchmarks.app:pgq``.

``pgqueue worker benchmarks.app:pgq`` reads the module attribute ``pgq``, built on first access
(``make_app()``) for the database in ``$PGQUEUE_BENCH_URL``: the benchmark process itself
imports this module without that variable. Task names are fixed so the benchmark process and
the workers agree on them.
"""

from __future__ import annotations

import os
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from pgqueue import PgQueue, Settings

NOOP = "bench.noop"
SPIN = "bench.spin"
SLEEP = "bench.sleep"
PROBE = "bench.probe"


def build(
    url: str, settings: Settings | None = None, async_engine: AsyncEngine | None = None
) -> PgQueue:
    """A PgQueue on ``url`` with the benchmark tasks registered (default settings unless given;
    its asyncio calls on ``async_engine`` when given)."""
    pgq = PgQueue(url, settings=settings or Settings(), async_engine=async_engine)

    @pgq.task(name=NOOP)
    def noop(n: int = 0) -> None:
        """Does nothing: measures pgqueue's own overhead per job."""

    @pgq.task(name=SPIN)
    def spin(ms: float = 2.0) -> None:
        """Spends ``ms`` milliseconds of pure Python (holding the GIL), like a CPU-bound job."""
        end = time.perf_counter() + ms / 1000.0
        while time.perf_counter() < end:
            pass

    @pgq.task(name=SLEEP)
    def sleep(ms: float = 10.0) -> None:
        """Waits ``ms`` milliseconds without the GIL, like a job waiting on I/O."""
        time.sleep(ms / 1000.0)

    @pgq.task(name=PROBE)
    def probe(n: int = 0) -> float:
        """Returns the wall clock at handler start; the latency workload reads it back."""
        return time.time()

    return pgq


def make_app() -> PgQueue:
    """The workers' PgQueue: the benchmark tasks on ``$PGQUEUE_BENCH_URL``."""
    # Settings from the environment: the drain's best setting is PGQUEUE_LOG_SUCCESSES=false
    # (with ``Settings()`` the worker subprocess ignored it and logged every success).
    return build(os.environ["PGQUEUE_BENCH_URL"], Settings.from_env())


_APP: PgQueue | None = None


def __getattr__(name: str) -> PgQueue:
    # Module attribute built on first access, so importing the module needs no database URL.
    global _APP
    if name != "pgq":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _APP is None:
        _APP = make_app()
    return _APP
