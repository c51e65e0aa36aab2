"""Pausing a queue stops its claims across workers; resuming restarts them; drain ignores it."""

from __future__ import annotations

import time

from support.workers import in_thread

from pgqueue import JobState, PgQueue
from pgqueue.testing import states_of, wait_for_states
from pgqueue.worker import Worker


def test_paused_queue_gets_no_claims_while_others_do(pgq: PgQueue) -> None:
    @pgq.task(queue="emails", name="send")
    def send(n: int) -> int:
        return n

    @pgq.task(queue="reports", name="report")
    def report(n: int) -> int:
        return n

    pgq.pause_queue("emails")
    assert pgq.admin.queue_settings()["emails"].paused is True
    mails = [send.enqueue(i) for i in range(5)]
    reports = [report.enqueue(i) for i in range(5)]
    worker = Worker(pgq, concurrency=4)
    with in_thread(worker):
        wait_for_states(pgq, reports, {JobState.SUCCEEDED}, timeout=30)
        # Several poll intervals (0.2 s) later the paused queue is still untouched.
        time.sleep(1.0)
        assert set(states_of(pgq, mails).values()) == {JobState.QUEUED}
        pgq.resume_queue("emails")
        wait_for_states(pgq, mails, {JobState.SUCCEEDED}, timeout=30)
    assert worker.stats.succeeded == 10


def test_pause_takes_effect_within_one_poll_interval(pgq: PgQueue) -> None:
    @pgq.task(queue="slowq", name="tick")
    def tick(n: int) -> int:
        return n

    worker = Worker(pgq, concurrency=2, listen=False, poll_interval=0.2)
    with in_thread(worker):
        first = tick.enqueue(0)
        wait_for_states(pgq, [first], {JobState.SUCCEEDED}, timeout=30)
        pgq.pause_queue("slowq")
        # A worker already sleeping in its poll wait may claim once more only if its claim
        # statement started before the pause committed; after one poll interval none does.
        time.sleep(0.3)
        held = [tick.enqueue(i) for i in range(3)]
        time.sleep(1.0)
        assert set(states_of(pgq, held).values()) == {JobState.QUEUED}


def test_drain_treats_paused_jobs_as_not_ready(pgq: PgQueue) -> None:
    @pgq.task(queue="held", name="held_task")
    def held_task() -> None:
        return None

    @pgq.task(queue="free", name="free_task")
    def free_task() -> None:
        return None

    pgq.pause_queue("held")
    held = held_task.enqueue()
    free = free_task.enqueue()
    started = time.monotonic()
    stats = pgq.run_worker(drain=True, concurrency=2)
    assert time.monotonic() - started < 20
    assert stats.succeeded == 1
    assert states_of(pgq, [held, free]) == {held: JobState.QUEUED, free: JobState.SUCCEEDED}
    pgq.resume_queue("held")
    stats = pgq.run_worker(drain=True, concurrency=2)
    assert stats.succeeded == 1
    assert states_of(pgq, [held]) == {held: JobState.SUCCEEDED}
