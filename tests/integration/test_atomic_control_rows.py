"""Atomic jobs in a limited queue hold no control row while their handler runs: the queue's
leased jobs keep being claimed and recorded within the limit, and the limit is neither
exceeded nor shrunk when atomic and leased jobs of the queue run side by side."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from sqlalchemy import text
from sqlalchemy.engine import URL
from support.workers import in_thread

from pgqueue import JobState, PgQueue, Settings
from pgqueue.testing import states_of, wait_for_states
from pgqueue.worker import Worker


class Ledger:
    """Start and end times of handler runs, by job kind, on one monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: list[tuple[str, float, float]] = []

    @contextmanager
    def run(self, kind: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.runs.append((kind, began, time.monotonic()))

    def started_beside_atomic(self) -> int:
        """How many runs began while an atomic run of another job was under way."""
        atomic = [(b, e) for kind, b, e in self.runs if kind == "atomic"]
        return sum(any(b < began < e for b, e in atomic if b != began) for _, began, _ in self.runs)

    def peak(self) -> int:
        events = [(b, 1) for _, b, _ in self.runs] + [(e, -1) for _, _, e in self.runs]
        running = peak = 0
        for _, change in sorted(events):  # ends first at equal times: touching runs
            running += change
            peak = max(peak, running)
        return peak


def test_a_long_atomic_job_leaves_its_queue_limit_to_the_leased_jobs(pgq: PgQueue) -> None:
    ledger = Ledger()
    atomic_began = threading.Event()

    @pgq.task(queue="limited", name="long_atomic", atomic=True)
    def long_atomic() -> None:
        atomic_began.set()
        with ledger.run("atomic"):
            time.sleep(5.0)

    @pgq.task(queue="limited", name="short_leased")
    def short_leased() -> None:
        with ledger.run("leased"):
            time.sleep(0.5)

    pgq.set_queue_limit("limited", 5)
    atomic_id = long_atomic.enqueue()
    with in_thread(Worker(pgq, concurrency=10)):
        assert atomic_began.wait(15)
        enqueued = time.monotonic()
        ids = short_leased.enqueue_many([[] for _ in range(8)])
        wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=30)
        recorded_after = time.monotonic() - enqueued
        atomic_state = states_of(pgq, [atomic_id])[atomic_id]
        wait_for_states(pgq, [atomic_id], {JobState.SUCCEEDED}, timeout=30)
    # Eight half-second jobs, four at a time beside the atomic one: about a second, recorded
    # while the atomic job still runs.
    assert atomic_state is JobState.RUNNING, atomic_state
    assert recorded_after < 3.5, recorded_after
    assert ledger.peak() == 5, ledger.runs
    with pgq.engine.connect() as c:
        assert c.execute(text("SELECT running FROM pgqueue_queues")).scalar_one() == 0


def test_mixed_atomic_and_leased_jobs_fill_the_limit_and_never_exceed_it(
    database_url: URL,
) -> None:
    """Two workers, each recounting the queue's counter many times during the run."""
    url = database_url.render_as_string(hide_password=False)
    settings = Settings(poll_interval=0.05, rescue_interval=0.2, prune_interval=0.2)
    queues = [PgQueue(url, settings=settings) for _ in range(2)]
    ledger = Ledger()
    tasks = []
    for pgq in queues:

        @pgq.task(queue="mixed", name="mixed_atomic", atomic=True)
        def mixed_atomic() -> None:
            with ledger.run("atomic"):
                time.sleep(0.4)

        @pgq.task(queue="mixed", name="mixed_leased")
        def mixed_leased() -> None:
            with ledger.run("leased"):
                time.sleep(0.15)

        tasks.append((mixed_atomic, mixed_leased))
    first = queues[0]
    first.set_queue_limit("mixed", 3)
    atomic_task, leased_task = tasks[0]
    ids = atomic_task.enqueue_many([[] for _ in range(12)])
    ids += leased_task.enqueue_many([[] for _ in range(24)])
    try:
        with ExitStack() as workers:
            for pgq in queues:
                workers.enter_context(in_thread(Worker(pgq, concurrency=4)))
            wait_for_states(first, ids, {JobState.SUCCEEDED}, timeout=90)
    finally:
        for pgq in queues:
            pgq.dispose()
    runs = sorted(ledger.runs, key=lambda run: run[1])
    assert len(runs) == 36
    # The limit is never passed, and it is reached: a running atomic job keeps no other job
    # of its queue out (runs start beside one).
    assert ledger.peak() == 3, runs
    assert ledger.started_beside_atomic() >= 4, runs


def test_short_atomic_jobs_of_a_limited_queue_run_one_after_another_without_a_poll(
    database_url: URL,
) -> None:
    """Each atomic run's outcome takes its queue's row just before its transaction commits, so
    a probe claiming meanwhile finds the row held and the queue empty for it. The end of that
    run must start the next probe: the rest of the queue never waits for a poll (30 s here)."""
    url = database_url.render_as_string(hide_password=False)
    pgq = PgQueue(url, settings=Settings(poll_interval=30.0))

    @pgq.task(queue="limited_short", name="short_atomic", atomic=True)
    def short_atomic() -> None: ...

    pgq.set_queue_limit("limited_short", 2)
    ids = short_atomic.enqueue_many([[] for _ in range(40)])
    try:
        with in_thread(Worker(pgq, concurrency=4)):
            wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=20)
    finally:
        pgq.dispose()
