"""Cancellation: a queued job never runs; a running job that checks the flag ends CANCELLED
within two heartbeat intervals and is not retried."""

from __future__ import annotations

import threading
import time

import pytest
from support.workers import in_thread

from pgqueue import InvalidStateTransition, JobContext, JobNotFound, JobState, PgQueue
from pgqueue.testing import states_of, table_counts, wait_for_states
from pgqueue.worker import Worker


def test_cancelled_queued_job_never_runs(pgq: PgQueue) -> None:
    ran: list[int] = []

    @pgq.task(name="record")
    def record(n: int) -> None:
        ran.append(n)

    keep = record.enqueue(1)
    drop = record.enqueue(2)
    assert pgq.cancel_job(drop) is JobState.CANCELLED
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 1
    stats = pgq.run_worker(drain=True, concurrency=2)
    assert ran == [1]
    assert stats.succeeded == 1
    assert states_of(pgq, [keep, drop]) == {keep: JobState.SUCCEEDED, drop: JobState.CANCELLED}
    job = pgq.get_job(drop)
    assert job.attempts == 0
    assert job.last_error == "cancelled by request"
    with pytest.raises(InvalidStateTransition):
        pgq.cancel_job(drop)
    with pytest.raises(JobNotFound):
        pgq.cancel_job(10_000)


def test_running_job_checking_flag_ends_cancelled_within_two_heartbeats(pgq: PgQueue) -> None:
    started = threading.Event()
    saw_flag = threading.Event()

    @pgq.task(name="long_loop", pass_context=True, max_attempts=5)
    def long_loop(ctx: JobContext) -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if ctx.cancel_requested:
                saw_flag.set()
                return "stopped early"
            time.sleep(0.02)
        return "ran to the end"

    job_id = long_loop.enqueue()
    # lease 1.5 s -> heartbeat every 0.5 s
    worker = Worker(pgq, concurrency=1, lease_seconds=1.5)
    assert worker.heartbeat_interval == pytest.approx(0.5)
    with in_thread(worker):
        assert started.wait(30)
        wait_for_states(pgq, [job_id], {JobState.RUNNING}, timeout=30)
        requested = time.monotonic()
        assert pgq.cancel_job(job_id) is JobState.RUNNING
        wait_for_states(pgq, [job_id], {JobState.CANCELLED}, timeout=30, interval=0.01)
        elapsed = time.monotonic() - requested
    assert saw_flag.is_set()
    # Two heartbeat intervals (1.0 s) plus scheduling slack on a shared 2-core machine.
    assert elapsed < 2 * worker.heartbeat_interval + 0.5, elapsed
    job = pgq.get_job(job_id)
    assert job.state is JobState.CANCELLED
    assert job.attempts == 1  # not retried
    assert job.finished_at is not None
    assert worker.stats.cancelled == 1
    assert worker.stats.retried == 0
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0


def test_running_job_that_raises_after_cancel_is_not_retried(pgq: PgQueue) -> None:
    @pgq.task(name="raiser", pass_context=True, max_attempts=5)
    def raiser(ctx: JobContext) -> None:
        deadline = time.monotonic() + 30
        while not ctx.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.02)
        raise RuntimeError("interrupted")

    job_id = raiser.enqueue()
    worker = Worker(pgq, concurrency=1, lease_seconds=1.5)
    with in_thread(worker):
        wait_for_states(pgq, [job_id], {JobState.RUNNING}, timeout=30)
        pgq.cancel_job(job_id)
        wait_for_states(pgq, [job_id], {JobState.CANCELLED}, timeout=30)
    assert pgq.get_job(job_id).attempts == 1
    assert worker.stats.retried == 0
