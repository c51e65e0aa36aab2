"""An outcome batch and a heartbeat of the same jobs never deadlock.

Outcomes are written in one transaction, one statement per kind, and a heartbeat also covers
attempts whose outcome is being written. Without a common lock order the batch [complete B,
retry A] holds B and waits for A while the heartbeat (A, B) holds A and waits for B: the server
breaks the cycle with 40P01 after ``deadlock_timeout``. The interleaving is forced here: the
batch pauses after the statement that takes its rows' locks until the heartbeat is waiting for
a lock.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session
from support.locks import wait_for_lock_waiters

from pgqueue import PgQueue
from pgqueue.data import outcomes as outcomes_data
from pgqueue.db import executor_for
from pgqueue.jobs import ClaimedJob, ClaimRequest, Outcome
from pgqueue.worker.store import WorkerStore


def _claimed(pgq: PgQueue, count: int) -> tuple[WorkerStore, list[ClaimedJob]]:
    """A worker's store, and ``count`` no-op jobs it claimed under the lease of worker w1."""

    @pgq.task(name="noop")
    def noop() -> None: ...

    store = WorkerStore(pgq.engine, stopping=threading.Event())
    noop.enqueue_many([{}] * count)
    claimed = store.claim(
        ClaimRequest(worker_id="w1", limit=count, queues=None, lease_seconds=30.0, task_leases={})
    )
    return store, claimed


def test_outcome_batch_and_heartbeat_of_the_same_jobs_do_not_deadlock(
    pgq: PgQueue, caplog: pytest.LogCaptureFixture
) -> None:
    store, claimed = _claimed(pgq, 2)
    a, b = sorted(claimed, key=lambda job: job.id)
    paused, resume = threading.Event(), threading.Event()

    def pause_after_its_row_locks(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if (
            threading.current_thread().name == "outcomes"
            and " FOR " in statement
            and not paused.is_set()
        ):
            paused.set()
            resume.wait(10)

    results: dict[str, Any] = {}

    def write_outcomes() -> None:
        results["lost"] = store.record_outcomes(
            [
                Outcome(b.id, b.lease_token, "complete"),
                Outcome(a.id, a.lease_token, "retry", error="boom", delay=60.0),
            ]
        )

    def heartbeat() -> None:
        results["held"] = store.heartbeat(
            [(a.id, a.lease_token, 30.0), (b.id, b.lease_token, 30.0)], None, {}
        )

    event.listen(pgq.engine, "after_cursor_execute", pause_after_its_row_locks)
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    try:
        outcomes = threading.Thread(target=write_outcomes, name="outcomes")
        outcomes.start()
        assert paused.wait(10)
        beat = threading.Thread(target=heartbeat, name="heartbeat")
        beat.start()
        wait_for_lock_waiters(pgq.engine)  # the heartbeat waits for a row the batch holds
        resume.set()
        outcomes.join(30)
        beat.join(30)
    finally:
        resume.set()
        event.remove(pgq.engine, "after_cursor_execute", pause_after_its_row_locks)

    assert "deadlock" not in caplog.text
    assert results == {"lost": set(), "held": {}}  # written; then nothing left to extend
    with pgq.engine.connect() as connection:
        states = dict(connection.execute(text("SELECT id, state FROM pgqueue_jobs")).all())
    assert states == {a.id: "retrying", b.id: "succeeded"}


def _locking_statements(pgq: PgQueue, write: Any) -> int:
    """How many ``FOR UPDATE`` statements ``write(session)`` sends."""
    sent: list[str] = []

    def record(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FOR UPDATE" in statement:
            sent.append(statement)

    event.listen(pgq.engine, "before_cursor_execute", record)
    try:
        with Session(pgq.engine) as session, session.begin():
            write(session)
    finally:
        event.remove(pgq.engine, "before_cursor_execute", record)
    return len(sent)


def test_outcomes_lock_their_rows_first_unless_told_no_heartbeat_of_them_is_under_way(
    pgq: PgQueue,
) -> None:
    _, jobs = _claimed(pgq, 6)
    done = [Outcome(job.id, job.lease_token, "complete") for job in jobs]
    locked = _locking_statements(
        pgq, lambda s: outcomes_data.record_outcomes(executor_for(s), done[:2])
    )
    assert locked == 1
    unlocked = _locking_statements(
        pgq, lambda s: outcomes_data.record_outcomes(executor_for(s), done[2:4], lock_rows=False)
    )
    assert unlocked == 0
    # Several kinds always lock first: their statements would take the rows in kind order.
    mixed = [done[4], Outcome(jobs[5].id, jobs[5].lease_token, "retry", error="x", delay=60.0)]
    assert (
        _locking_statements(
            pgq, lambda s: outcomes_data.record_outcomes(executor_for(s), mixed, lock_rows=False)
        )
        == 1
    )
    with pgq.engine.connect() as connection:
        states = sorted(connection.execute(text("SELECT state FROM pgqueue_jobs")).scalars())
    assert states == ["retrying"] + ["succeeded"] * 5
