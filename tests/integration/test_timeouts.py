"""A task's ``timeout=`` ends its attempt on time, in each mode, and leaves no write behind.

- Leased, in the thread pool: at its deadline, whatever the heartbeat's interval (a worker
  idle since long before the job, with a 20 s heartbeat), the attempt is over: the handler's
  ``ctx.cancel_requested`` turns true, and the writes of its ``ctx.session`` are rolled back
  when it returns, never committed. The job stays held until its thread returns, so neither
  its retry nor another job of its key (``key_limit=1``) runs beside the thread.
- Atomic: at the deadline the attempt's transaction is ended on the server, so its writes roll
  back while the handler still runs, and the failed attempt is written at once.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, text
from support.effects import committed_effects, effects_table, write_effect
from support.locks import lock_waiters, wait_for_lock_waiters
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue, backoff
from pgqueue.config import Settings
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

TIMEOUT = 1.0
# Deadline to the attempt's end as the database recorded it: generous for a loaded machine, and
# far below the 20 s heartbeat interval a check riding on the heartbeat would need.
LATE_BY_AT_MOST = 1.5


@pytest.fixture
def settings() -> Settings:
    # Leases of 60 s: the heartbeat beats every 20 s, so only a deadline of its own ends an
    # attempt on time.
    return Settings(poll_interval=0.2, rescue_interval=0.5, lease_seconds=60.0)


@pytest.fixture
def side_table(engine: Engine) -> Iterator[None]:
    with effects_table(engine):
        yield


def _seconds_past_deadline(pgq: PgQueue, job_id: int) -> float:
    job = pgq.get_job(job_id)
    assert job.started_at is not None and job.finished_at is not None
    return (job.finished_at - job.started_at).total_seconds() - TIMEOUT


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_a_timed_out_attempt_ends_on_time_and_its_writes_never_commit(
    pgq: PgQueue, engine: Engine, side_table: None, atomic: bool
) -> None:
    release = threading.Event()
    session_ended = threading.Event()
    ends: list[str] = []

    def _ended(name: str, session: object) -> None:
        ends.append(name)
        session_ended.set()

    @pgq.task(
        name=f"timeouts.hangs_{'atomic' if atomic else 'leased'}",
        timeout=TIMEOUT,
        max_attempts=1,
        atomic=atomic,
        pass_context=True,
    )
    def hangs(ctx: JobContext) -> str:
        started.set()
        write_effect(ctx)
        if not atomic:
            # How the worker ends this session after the handler returns: commit or rollback.
            for name in ("after_commit", "after_rollback"):
                event.listen(ctx.session, name, functools.partial(_ended, name))
            while not ctx.cancel_requested and not release.is_set():
                time.sleep(0.01)
            told.append(time.monotonic())
        release.wait(30)
        return "returned after its deadline"

    started = threading.Event()
    told: list[float] = []
    with in_thread(Worker(pgq, concurrency=2), before_stop=release.set):
        job_id = hangs.enqueue()
        if atomic:
            assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.FAILED}
            # Failed while its handler still runs, in time.
            assert not release.is_set()
            assert _seconds_past_deadline(pgq, job_id) < LATE_BY_AT_MOST
            job = pgq.get_job(job_id)
            assert "JobTimeout" in (job.last_error or "")
        else:
            assert started.wait(30)
            began = time.monotonic()
            wait_until(lambda: told, 30, "the handler told of its timeout")
            # Told at its deadline, while its job stays held for the thread.
            assert told[0] - began < TIMEOUT + LATE_BY_AT_MOST
            assert pgq.get_job(job_id).state is JobState.RUNNING
        assert committed_effects(engine) == []
        release.set()
        if not atomic:
            assert session_ended.wait(30), "the handler's session never ended"
    # The worker stopped after the handler returned: nothing more was written.
    assert committed_effects(engine) == []
    if not atomic:
        assert ends == ["after_rollback"]
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, len(job.errors)) == (JobState.FAILED, 1, 1)
    assert "JobTimeout" in (job.last_error or "")


def test_neither_the_retry_nor_another_job_of_its_key_runs_beside_a_timed_out_thread(
    pgq: PgQueue, engine: Engine, side_table: None
) -> None:
    runs: list[tuple[str, float, float]] = []
    first_told = threading.Event()
    release = threading.Event()

    @pgq.task(
        name="timeouts.keyed",
        timeout=TIMEOUT,
        max_attempts=2,
        retry=backoff.constant(0),
        concurrency_key=lambda name: "K",
        key_limit=1,
        pass_context=True,
    )
    def keyed(ctx: JobContext, name: str) -> None:
        began = time.monotonic()
        write_effect(ctx)
        if name == "hangs" and ctx.attempt == 1:
            while not ctx.cancel_requested:
                time.sleep(0.01)
            first_told.set()
            # Runs on past its deadline, as a handler deaf to it would.
            release.wait(30)
        runs.append((f"{name}#{ctx.attempt}", began, time.monotonic()))

    with in_thread(Worker(pgq, concurrency=4), before_stop=release.set):
        hung = keyed.enqueue("hangs")
        wait_until(lambda: pgq.get_job(hung).state is JobState.RUNNING, 30, "the first run")
        other = keyed.enqueue("quick")
        assert first_told.wait(30)
        # Long enough for a retry or the other job to start if the key let them.
        time.sleep(1.0)
        assert [name for name, _, _ in runs] == []
        release.set()
        states = wait_for_states(pgq, [hung, other], timeout=30)
    assert states == {hung: JobState.SUCCEEDED, other: JobState.SUCCEEDED}
    assert sorted(name for name, _, _ in runs) == ["hangs#1", "hangs#2", "quick#1"]
    spans = sorted((began, ended) for _, began, ended in runs)
    assert all(a_end <= b_began for (_, a_end), (b_began, _) in itertools.pairwise(spans)), runs
    # Only the two attempts that returned in time committed their writes.
    assert committed_effects(engine) == sorted([(hung, 2), (other, 1)])
    job = pgq.get_job(hung)
    assert job.attempts == 2 and "JobTimeout" in job.errors[0]["error"]


def test_a_cancel_asked_while_a_timed_out_thread_runs_on_ends_the_job_instead_of_its_retry(
    pgq: PgQueue,
) -> None:
    release = threading.Event()
    told = threading.Event()

    @pgq.task(name="timeouts.cancelled_while_held", timeout=TIMEOUT, max_attempts=3)
    def deaf() -> None:
        told.set()
        release.wait(30)

    # Heartbeats every 0.2 s: the cancel request reaches the worker soon.
    worker = Worker(pgq, concurrency=1, lease_seconds=0.6)
    with in_thread(worker, before_stop=release.set):
        job_id = deaf.enqueue()
        assert told.wait(30)
        wait_until(lambda: worker._slots.lookup([job_id])[job_id].timed_out, 30, "its timeout")
        assert pgq.admin.cancel_job(job_id)
        wait_until(lambda: worker._slots.lookup([job_id])[job_id].cancelled, 30, "the cancel")
        release.set()
        final = wait_for_states(pgq, [job_id], timeout=30)
    assert final == {job_id: JobState.CANCELLED}
    assert pgq.get_job(job_id).attempts == 1


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_timeout_is_decided_on_time_while_the_heartbeat_waits_for_the_database(
    pgq: PgQueue, engine: Engine, side_table: None, pool: str
) -> None:
    """The heartbeat's statement waits (here for the worker's registry row, which another
    session holds, as a statement would through a server restart): the deadline ends the
    attempt on time all the same (a thread's handler is told, a child is stopped), and the
    handler's session never commits."""
    release = threading.Event()

    @pgq.task(
        name=f"timeouts.stalled_beat_{pool}", timeout=TIMEOUT, max_attempts=1, pass_context=True
    )
    def told_in_time(ctx: JobContext) -> None:
        write_effect(ctx)
        while not ctx.cancel_requested and not release.is_set():
            time.sleep(0.01)

    # Beats every second: the first one after the row is taken waits for it.
    worker = Worker(pgq, concurrency=1, lease_seconds=3.0, pool=pool)
    with in_thread(worker, before_stop=release.set):
        wait_until(lambda: _registered(engine, worker.worker_id), 30, "the worker's row")
        with engine.connect() as holder, holder.begin():
            holder.execute(
                text("SELECT 1 FROM pgqueue_workers WHERE id = :id FOR UPDATE"),
                {"id": worker.worker_id},
            )
            wait_for_lock_waiters(engine, statement="INSERT INTO pgqueue_workers")
            job_id = told_in_time.enqueue()
            final = wait_for_states(pgq, [job_id], timeout=30)
            # The heartbeat waited throughout.
            assert lock_waiters(engine, "INSERT INTO pgqueue_workers") == 1
        release.set()
    assert final == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert "JobTimeout" in (job.last_error or "")
    assert job.started_at is not None and job.finished_at is not None
    assert (job.finished_at - job.started_at).total_seconds() < TIMEOUT + LATE_BY_AT_MOST
    assert committed_effects(engine) == []


def _registered(engine: Engine, worker_id: str) -> bool:
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT count(*) FROM pgqueue_workers WHERE id = :id"), {"id": worker_id}
        )
        return bool(found.scalar_one())
