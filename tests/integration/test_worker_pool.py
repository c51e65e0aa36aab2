"""The worker's pool: quick jobs are run back to back by the threads already awake, but jobs
that block must still get a thread each, up to ``concurrency``, without waiting for each other."""

from __future__ import annotations

import threading

from pgqueue import JobState, PgQueue
from pgqueue.testing import states_of


def test_blocking_jobs_of_one_claim_run_at_the_same_time(pgq: PgQueue) -> None:
    # Every handler waits until all eight are inside their handlers at once: only possible
    # when the pool gives each job of the claim batch its own thread. A pool that ran them one
    # after another on the awake thread would break the barrier (and fail the jobs).
    barrier = threading.Barrier(8, timeout=20)
    threads: set[str] = set()
    lock = threading.Lock()

    @pgq.task(name="meet", max_attempts=1)
    def meet(n: int) -> None:
        with lock:
            threads.add(threading.current_thread().name)
        barrier.wait()

    ids = meet.enqueue_many([{"n": i} for i in range(8)])
    stats = pgq.run_worker(drain=True, concurrency=8)
    assert stats.succeeded == 8
    assert stats.failed == 0
    assert len(threads) == 8
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}


def test_blocking_jobs_behind_a_quick_one_are_spread_too(pgq: PgQueue) -> None:
    # The first job of the batch returns at once, so the awake thread keeps taking items; the
    # next ones block until all of them are running: the dispatcher must wake threads for the
    # items waiting behind a blocked handler.
    barrier = threading.Barrier(6, timeout=20)

    @pgq.task(name="mixed", max_attempts=1)
    def mixed(n: int) -> None:
        if n > 0:
            barrier.wait()

    ids = mixed.enqueue_many([{"n": i} for i in range(7)])
    stats = pgq.run_worker(drain=True, concurrency=7)
    assert stats.succeeded == 7
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
