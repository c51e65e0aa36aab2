"""An atomic attempt whose transaction is lost is a failed attempt, not a free re-run.

An atomic job's claim commits on its own, then its handler runs in a transaction that holds the
job's row and writes its outcome. When that transaction is lost after the handler ran, its
writes and its outcome go with it, and the job is left RUNNING under its lease: the worker must
record the failed attempt apart. Each way a real handler loses it is tried here with
``max_attempts=3``: the handler must run exactly three times, the job must end FAILED with three
attempts and the reason kept, and none of the handler's writes may survive. A handler's
``commit()``/``rollback()``/``close()`` is refused with an error naming the misuse; a deferred
constraint fails in the handler's savepoint, not at the commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue, backoff
from pgqueue.data import atomic_runs as atomic_runs_data
from pgqueue.data import claim as claim_data
from pgqueue.db import executor_for
from pgqueue.jobs import ClaimedJob
from pgqueue.worker import Worker

TABLES = """
CREATE TABLE atomic_parent (id int PRIMARY KEY);
CREATE TABLE atomic_child (
    id serial PRIMARY KEY,
    parent int NOT NULL REFERENCES atomic_parent (id) DEFERRABLE INITIALLY DEFERRED
);
CREATE TABLE atomic_effect (job_id bigint NOT NULL, attempt int NOT NULL);
"""
MAX_ATTEMPTS = 3


@pytest.fixture
def tables(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(TABLES))


def _write_effect(ctx: JobContext) -> None:
    ctx.session.execute(
        text("INSERT INTO atomic_effect VALUES (:job, :attempt)"),
        {"job": ctx.job_id, "attempt": ctx.attempt},
    )


MISUSES: dict[str, Callable[[JobContext], Any]] = {
    # Passes the flush; only the commit (or an early check) sees the missing parent.
    "deferred constraint": lambda ctx: ctx.session.execute(
        text("INSERT INTO atomic_child (parent) VALUES (424242)")
    ),
    "session.rollback()": lambda ctx: ctx.session.rollback(),
    "session.close()": lambda ctx: ctx.session.close(),
    "session.commit()": lambda ctx: ctx.session.commit(),
    "raw ROLLBACK": lambda ctx: ctx.session.execute(text("ROLLBACK")),
}
EXPECTED_ERRORS = {
    "deferred constraint": "atomic_child",
    "session.rollback()": "AtomicSessionMisuse: rollback() on the session of atomic task",
    "session.close()": "AtomicSessionMisuse: close() on the session of atomic task",
    "session.commit()": "AtomicSessionMisuse: commit() on the session of atomic task",
    "raw ROLLBACK": "AtomicTransactionLost",
}


@pytest.fixture
def running_worker(pgq: PgQueue) -> Iterator[Callable[..., Worker]]:
    """Starts a worker of ``concurrency`` slots that runs until the test ends."""
    with ExitStack() as workers:

        def start(concurrency: int = 2) -> Worker:
            return workers.enter_context(in_thread(Worker(pgq, concurrency=concurrency)))

        yield start


def _claim_atomic(session: Session, worker_id: str, lease_seconds: float) -> list[ClaimedJob]:
    """An atomic claim of one job, as a worker's probe makes it (committed with ``session``)."""
    return claim_data.claim(
        executor_for(session),
        worker_id=worker_id,
        limit=1,
        queues=None,
        lease_seconds=lease_seconds,
        task_leases={},
        atomic=True,
    )


def _wait_final(pgq: PgQueue, job_id: int, timeout: float) -> Any:
    """The job, once it is in a final state."""

    def final() -> Any:
        job = pgq.get_job(job_id)
        return job if job.state.is_final else None

    return wait_until(final, timeout, f"job {job_id} to end")


@pytest.mark.parametrize("misuse", list(MISUSES))
def test_a_lost_atomic_transaction_counts_as_a_failed_attempt(
    pgq: PgQueue,
    engine: Engine,
    tables: None,
    running_worker: Callable[..., Worker],
    misuse: str,
) -> None:
    runs: list[int] = []

    @pgq.task(
        name="atomic.lost",
        atomic=True,
        pass_context=True,
        max_attempts=MAX_ATTEMPTS,
        retry=backoff.constant(0),
    )
    def lost(ctx: JobContext) -> str:
        runs.append(ctx.attempt)
        _write_effect(ctx)
        MISUSES[misuse](ctx)
        return "returned"

    job_id = lost.enqueue()
    running_worker(2)
    job = _wait_final(pgq, job_id, timeout=15)
    time.sleep(0.5)  # a re-run that should not happen would show by now
    assert len(runs) == MAX_ATTEMPTS, f"{len(runs)} handler runs: {runs[:10]}"
    assert job.state is JobState.FAILED
    assert job.attempts == MAX_ATTEMPTS
    assert EXPECTED_ERRORS[misuse] in (job.last_error or ""), job.last_error
    assert [entry["attempt"] for entry in job.errors] == [1, 2, 3]
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM atomic_effect")).scalar_one() == 0
        assert connection.execute(text("SELECT count(*) FROM atomic_child")).scalar_one() == 0


def test_a_lost_attempt_that_leaves_attempts_retries_and_can_succeed(
    pgq: PgQueue, engine: Engine, tables: None, running_worker: Callable[..., Worker]
) -> None:
    """The first attempt's transaction is lost; the second, a normal one, commits its writes
    once, and the job's history keeps the lost attempt."""

    @pgq.task(
        name="atomic.once_lost",
        atomic=True,
        pass_context=True,
        max_attempts=MAX_ATTEMPTS,
        retry=backoff.constant(0),
    )
    def once_lost(ctx: JobContext) -> int:
        _write_effect(ctx)
        if ctx.attempt == 1:
            ctx.session.execute(text("ROLLBACK"))
        return ctx.attempt

    job_id = once_lost.enqueue()
    running_worker()
    job = _wait_final(pgq, job_id, timeout=15)
    assert job.state is JobState.SUCCEEDED and job.result == 2 and job.attempts == 2
    assert "AtomicTransactionLost" in job.errors[0]["error"]
    with engine.connect() as connection:
        effects = connection.execute(text("SELECT job_id, attempt FROM atomic_effect")).all()
    assert [tuple(row) for row in effects] == [(job_id, 2)]


def test_a_running_atomic_job_whose_worker_is_gone_is_rescued(
    pgq: PgQueue, running_worker: Callable[..., Worker]
) -> None:
    """A worker that claimed an atomic job and died before its handler's transaction took the
    job's row leaves it RUNNING with nobody to end it: its lease expires and the rescuer takes
    it back, the lost attempt counted."""

    @pgq.task(name="atomic.orphan", atomic=True, max_attempts=3)
    def orphan() -> str:
        return "done"

    job_id = orphan.enqueue()
    session: Session = pgq.handler_session()
    with session.begin():
        [claimed] = _claim_atomic(session, "gone", 0.5)
    session.close()  # the worker that made the claim is gone
    assert claimed.id == job_id and pgq.get_job(job_id).state is JobState.RUNNING
    running_worker()
    job = _wait_final(pgq, job_id, timeout=20)
    assert job.state is JobState.SUCCEEDED, (job.state, job.last_error)
    assert job.attempts == 2


def test_a_lost_attempt_is_recorded_even_while_another_session_holds_the_jobs_row(
    pgq: PgQueue, engine: Engine, running_worker: Callable[..., Worker]
) -> None:
    """Right after the handler's raw ROLLBACK, another session locks the job's row for a while
    (an operator's ``SELECT ... FOR UPDATE``), so the worker's write of the failed attempt
    waits: it must still be written, once, before the job runs again."""
    runs: list[int] = []
    held: list[threading.Thread] = []

    def hold_row(job_id: int, seconds: float) -> None:
        connection = engine.connect()
        transaction = connection.begin()
        connection.execute(
            text("SELECT 1 FROM pgqueue_jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
        )

        def release() -> None:
            time.sleep(seconds)
            transaction.rollback()
            connection.close()

        thread = threading.Thread(target=release)
        thread.start()
        held.append(thread)

    @pgq.task(
        name="atomic.row_held",
        atomic=True,
        pass_context=True,
        max_attempts=MAX_ATTEMPTS,
        retry=backoff.constant(0),
    )
    def row_held(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        ctx.session.execute(text("ROLLBACK"))
        hold_row(ctx.job_id, 0.5)

    job_id = row_held.enqueue()
    running_worker(2)
    job = _wait_final(pgq, job_id, timeout=30)
    for thread in held:
        thread.join(10)
    time.sleep(0.5)
    assert len(runs) == MAX_ATTEMPTS, f"{len(runs)} handler runs: {runs[:10]}"
    assert (job.state, job.attempts) == (JobState.FAILED, MAX_ATTEMPTS)
    assert [entry["attempt"] for entry in job.errors] == [1, 2, 3]


def test_a_claim_whose_lease_was_lost_never_takes_the_jobs_row(
    pgq: PgQueue, engine: Engine, running_worker: Callable[..., Worker]
) -> None:
    """A worker frozen right after its atomic claim answered, for longer than the lease: the
    rescue counted the attempt and another worker ran the job to its end. When the frozen worker
    wakes, its transaction's lock on the job's row finds the lease gone, so the handler does not
    run a second time; a live claim takes the row."""
    runs: list[int] = []

    @pgq.task(name="atomic.once", atomic=True, pass_context=True, max_attempts=3)
    def once(ctx: JobContext) -> None:
        runs.append(ctx.attempt)

    job_id = once.enqueue()
    with pgq.handler_session() as session, session.begin():
        [claimed] = _claim_atomic(session, "frozen", 0.5)
    assert (claimed.id, claimed.attempt) == (job_id, 1)
    # A live claim takes the row (claimed before any worker runs, which would take the job).
    live_id = once.enqueue()
    with pgq.handler_session() as session, session.begin():
        [fresh] = _claim_atomic(session, "live", 30)
        assert fresh.id == live_id
    with pgq.handler_session() as session, session.begin():
        assert atomic_runs_data.lock_claimed(executor_for(session), fresh)

    running_worker(1)
    finished = _wait_final(pgq, job_id, timeout=20)
    assert (finished.state, finished.attempts) == (JobState.SUCCEEDED, 2)
    assert runs == [2]
    with pgq.handler_session() as session, session.begin():
        assert not atomic_runs_data.lock_claimed(executor_for(session), claimed)
