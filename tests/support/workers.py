"""A real worker (``pgqueue.worker.Worker``) run in a thread of the test process for the length of
a ``with`` block, and what the tests watch a running worker do from the outside (its heartbeats)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pgqueue import PgQueue
from pgqueue.worker import Worker
from support.polling import wait_until


@contextmanager
def in_thread(
    worker: Worker,
    *,
    drain: bool = False,
    before_stop: Callable[[], object] | None = None,
    join_timeout: float = 30.0,
) -> Iterator[Worker]:
    """Run ``worker`` (``run(drain=drain)``) in a daemon thread while the block runs. At its
    end, however it ends: call ``before_stop`` (e.g. the ``set`` of an event a handler holds
    on), stop the worker and wait up to ``join_timeout`` seconds for its thread. A worker still
    running then fails the test (unless the block already failed)."""
    thread = threading.Thread(
        target=worker.run, kwargs={"drain": drain}, name="test-worker", daemon=True
    )
    thread.start()
    try:
        yield worker
    finally:
        if before_stop is not None:
            before_stop()
        worker.stop()
        thread.join(join_timeout)
    assert not thread.is_alive(), (
        f"worker {worker.worker_id} still running {join_timeout}s after stop()"
    )


def wait_for_heartbeats(pgq: PgQueue, job_id: int, count: int, timeout: float) -> None:
    """Wait until a worker's heartbeat has extended the lease of running job ``job_id``
    ``count`` more times (whatever worker runs it: a thread here or another process)."""
    leases = [pgq.get_job(job_id).lease_expires_at]

    def extended() -> bool:
        lease = pgq.get_job(job_id).lease_expires_at
        if lease != leases[-1]:
            leases.append(lease)
        return len(leases) > count

    wait_until(extended, timeout, f"{count} more heartbeats of job {job_id}")
