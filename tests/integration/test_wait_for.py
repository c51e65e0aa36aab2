"""Waiting for a job's result: ``pgq.wait_for`` and ``await pgq.await_job`` return the finished
job, woken by the announcement its ending statement sends.

The safety net's periodic read is pushed out to an hour in these tests (``no_safety_net``): a
waiter that returns well before its timeout was woken by an announcement (or found the job
finished on its first read, which the tests rule out by waiting for that read before ending
the job). Without announcements the waiters return only at their timeout, and the tests fail.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import Job, JobState, JobWaitTimeout, PgQueue, Settings, ValidationError, waiting
from pgqueue.errors import JobNotFound
from pgqueue.job_filter import JobFilter
from pgqueue.jobs import ClaimRequest
from pgqueue.sql.common import MAX_PAYLOAD_BYTES
from pgqueue.worker import Worker
from pgqueue.worker.store import WorkerStore

WAIT = 20.0  # the waits' timeout
# A woken waiter returns within this (milliseconds, in fact); one that is not reads the job
# again only at its timeout.
WOKEN_WITHIN = WAIT / 2


@pytest.fixture(autouse=True)
def no_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 3600.0)
    monkeypatch.setattr(waiting, "POLL_SECONDS", 3600.0)


class ReadCounter:
    """Counts the reads a waiter makes through ``pgq.get_job``."""

    def __init__(self, pgq: PgQueue, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: dict[int, int] = {}
        self._lock = threading.Lock()
        read = pgq.get_job

        def counted(job_id: int) -> Job:
            job = read(job_id)
            with self._lock:
                self.reads[job_id] = self.reads.get(job_id, 0) + 1
            return job

        monkeypatch.setattr(pgq, "get_job", counted)

    def wait_read(self, job_id: int) -> None:
        wait_until(lambda: self.reads.get(job_id, 0), WAIT, f"a read of job {job_id}", 0.005)


def listeners(engine: Engine) -> int:
    """Sessions LISTENing for finished jobs on this database."""
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    """ AND query = 'LISTEN "pgqueue_finished"'"""
                )
            ).scalar_one()
        )


def wait_listening(engine: Engine) -> None:
    wait_until(lambda: listeners(engine), WAIT, "the wait listener to listen", 0.01)


@contextmanager
def waiter_on(
    pgq: PgQueue, engine: Engine, counter: ReadCounter, job_id: int
) -> Iterator[Future[Job]]:
    """A thread in ``pgq.wait_for(job_id)``, past its first read, with the listener listening."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(pgq.wait_for, job_id, timeout=WAIT)
        counter.wait_read(job_id)
        wait_listening(engine)
        yield future


def idle_job(pgq: PgQueue) -> int:
    """A queued job of a task no worker runs in the test."""

    @pgq.task(name="idle")
    def idle() -> None:
        """No worker runs it here."""

    return idle.enqueue()


def finished_when_let_go(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch, job_id: int, go: threading.Event
) -> Job:
    """With a worker running job ``job_id``, whose handler waits for ``go``: a waiter past its
    first read, then ``go`` set; the job the waiter returns."""
    counter = ReadCounter(pgq, monkeypatch)
    with in_thread(Worker(pgq, concurrency=4)), waiter_on(pgq, engine, counter, job_id) as future:
        assert not future.done()
        go.set()
        return future.result(timeout=WOKEN_WITHIN)


def test_wait_for_returns_the_succeeded_job_with_its_result(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = threading.Event()

    @pgq.task(name="add")
    def add(a: int, b: int) -> dict[str, int]:
        assert go.wait(WAIT)
        return {"sum": a + b}

    job_id = add.enqueue(2, 3)
    job = finished_when_let_go(pgq, engine, monkeypatch, job_id, go)
    assert job.id == job_id
    assert job.state is JobState.SUCCEEDED
    assert job.result == {"sum": 5}
    assert job.last_error is None


def test_a_failed_job_is_returned_with_its_error_not_raised(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = threading.Event()

    @pgq.task(name="explode", max_attempts=1)
    def explode() -> None:
        assert go.wait(WAIT)
        raise RuntimeError("the flux capacitor broke")

    job = finished_when_let_go(pgq, engine, monkeypatch, explode.enqueue(), go)
    assert job.state is JobState.FAILED
    assert job.last_error is not None
    assert "the flux capacitor broke" in job.last_error


def test_timeout_error_names_the_job_its_state_and_the_timeout(pgq: PgQueue) -> None:
    @pgq.task(name="never_run")
    def never_run() -> None:
        """No worker runs it here."""

    job_id = never_run.enqueue()
    started = time.monotonic()
    with pytest.raises(JobWaitTimeout) as raised:
        pgq.wait_for(job_id, timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert str(raised.value) == f"job {job_id} did not finish within 0.3 s; it is still queued"
    assert (raised.value.job_id, raised.value.state, raised.value.timeout) == (
        job_id,
        "queued",
        0.3,
    )
    assert isinstance(raised.value, TimeoutError)
    with pytest.raises(JobWaitTimeout, match=f"job {job_id} did not finish within 0 s"):
        pgq.wait_for(job_id, timeout=0)


def test_bad_input_is_refused_before_any_sql_and_a_missing_job_is_not_found(
    pgq: PgQueue,
) -> None:
    for bad_id in (0, -1, "7", True, 1.5):
        with pytest.raises(ValidationError, match="job id must be a positive int"):
            pgq.wait_for(bad_id, timeout=1)  # type: ignore[arg-type]
    for bad_timeout in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValidationError, match="timeout must be") as raised:
            pgq.wait_for(1, timeout=bad_timeout)  # type: ignore[arg-type]
        assert "\n" not in str(raised.value)
    with pytest.raises(JobNotFound, match="no job with id 424242"):
        pgq.wait_for(424242, timeout=1)


def test_an_already_finished_job_is_returned_at_once(pgq: PgQueue) -> None:
    @pgq.task(name="quick")
    def quick() -> str:
        return "done"

    job_id = quick.enqueue()
    pgq.run_worker(drain=True)
    job = pgq.wait_for(job_id, timeout=0)
    assert (job.state, job.result) == (JobState.SUCCEEDED, "done")
    assert asyncio.run(pgq.await_job(job_id, timeout=0)).result == "done"


def test_cancelling_a_waiting_job_wakes_its_waiter(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = ReadCounter(pgq, monkeypatch)
    job_id = idle_job(pgq)
    with waiter_on(pgq, engine, counter, job_id) as future:
        assert pgq.cancel_job(job_id) is JobState.CANCELLED
        job = future.result(timeout=WOKEN_WITHIN)
    assert (job.state, job.last_error) == (JobState.CANCELLED, "cancelled by request")


def test_a_bulk_cancel_of_more_jobs_than_one_announcement_names_wakes_every_waiter(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    @pgq.task(name="idle")
    def idle(n: int) -> None:
        """No worker runs it here."""

    counter = ReadCounter(pgq, monkeypatch)
    ids = idle.enqueue_many([[n] for n in range(3000)])
    assert len(",".join(map(str, ids))) > MAX_PAYLOAD_BYTES
    with engine.begin() as connection:  # as if every job had a waiter of its own
        connection.execute(text("UPDATE pgqueue_jobs SET awaited = true"))
    watched = [ids[0], ids[-1]]
    with ThreadPoolExecutor(len(watched)) as pool:
        futures = [pool.submit(pgq.wait_for, job_id, timeout=WAIT) for job_id in watched]
        for job_id in watched:
            counter.wait_read(job_id)
        wait_listening(engine)
        result = pgq.admin.bulk_cancel(JobFilter(task_name="idle"))
        assert result.count == len(ids)
        jobs = [future.result(timeout=WOKEN_WITHIN) for future in futures]
    assert [job.state for job in jobs] == [JobState.CANCELLED, JobState.CANCELLED]


def test_a_rescue_that_fails_a_job_wakes_its_waiter(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    @pgq.task(name="lost", max_attempts=1)
    def lost() -> None:
        """Claimed by hand below; its worker is 'gone'."""

    job_id = lost.enqueue()
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    [claimed] = store.claim(
        ClaimRequest(worker_id="gone", limit=1, queues=None, lease_seconds=30.0, task_leases={})
    )
    assert claimed.id == job_id
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second'")
        )
    counter = ReadCounter(pgq, monkeypatch)
    with waiter_on(pgq, engine, counter, job_id) as future:
        assert store.rescue_expired(limit=10, error="lease expired (worker lost)") == [
            (job_id, JobState.FAILED.value)
        ]
        job = future.result(timeout=WOKEN_WITHIN)
    assert (job.state, job.last_error) == (JobState.FAILED, "lease expired (worker lost)")


def test_a_dependent_cancelled_by_its_dependency_failing_wakes_its_waiter(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = threading.Event()

    @pgq.task(name="first", max_attempts=1)
    def first() -> None:
        assert go.wait(WAIT)
        raise RuntimeError("no")

    @pgq.task(name="second")
    def second() -> None:
        """Never runs: its dependency fails."""

    first_id = first.enqueue()
    second_id = second.configure(depends_on=[first_id]).enqueue()
    job = finished_when_let_go(pgq, engine, monkeypatch, second_id, go)
    assert job.state is JobState.CANCELLED
    assert job.last_error == f"dependency {first_id} ended failed; not run"


def test_an_atomic_job_wakes_its_waiter(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = threading.Event()

    @pgq.task(name="atomic_step", atomic=True)
    def atomic_step() -> int:
        assert go.wait(WAIT)
        return 42

    job = finished_when_let_go(pgq, engine, monkeypatch, atomic_step.enqueue(), go)
    assert (job.state, job.result) == (JobState.SUCCEEDED, 42)


def test_a_hundred_waiters_share_one_listener(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = threading.Event()

    @pgq.task(name="square")
    def square(n: int) -> int:
        assert go.wait(WAIT)
        return n * n

    counter = ReadCounter(pgq, monkeypatch)
    ids = square.enqueue_many([[n] for n in range(100)])
    with ThreadPoolExecutor(100) as pool:
        futures = [pool.submit(pgq.wait_for, job_id, timeout=WAIT) for job_id in ids]
        for job_id in ids:
            counter.wait_read(job_id)
        wait_listening(engine)
        assert listeners(engine) == 1
        with in_thread(Worker(pgq, concurrency=10)):
            go.set()
            jobs = [future.result(timeout=WOKEN_WITHIN) for future in futures]
        assert listeners(engine) == 1
    assert [(job.id, job.state, job.result) for job in jobs] == [
        (job_id, JobState.SUCCEEDED, n * n) for n, job_id in enumerate(ids)
    ]
    pgq.dispose()
    wait_until(lambda: not listeners(engine), WAIT, "dispose() to close the wait listener", 0.01)


def test_await_job_waits_without_blocking_the_event_loop(
    pgq: PgQueue, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    go = threading.Event()

    @pgq.task(name="slow_echo")
    def slow_echo(n: int) -> int:
        assert go.wait(WAIT)
        return n

    ids = slow_echo.enqueue_many([[n] for n in range(20)])

    async def main() -> tuple[list[Job], int]:
        loop = asyncio.get_running_loop()
        # A wait that blocked would hold the loop for the second until the jobs end (and past
        # it: the loop itself lets them end); a callback that merely waits for the GIL behind
        # the worker's twenty threads in this process took 0.66 s in four test processes on
        # two cores.
        loop.slow_callback_duration = 0.9
        ticks = 0
        stop = asyncio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        waits = asyncio.gather(*(pgq.await_job(job_id, timeout=WAIT) for job_id in ids))
        await asyncio.sleep(0.3)
        assert listeners(engine) == 1
        before = ticks
        # The jobs end a second after the waits began: a wait that blocked would hold the loop.
        loop.call_later(1.0, go.set)
        jobs = await asyncio.wait_for(waits, WOKEN_WITHIN + 1.0)
        stop.set()
        await ticker
        return jobs, ticks - before

    caplog.set_level(logging.WARNING, logger="asyncio")
    with in_thread(Worker(pgq, concurrency=20)):
        jobs, ticks = asyncio.run(main(), debug=True)
    assert [(job.id, job.state, job.result) for job in jobs] == [
        (job_id, JobState.SUCCEEDED, n) for n, job_id in enumerate(ids)
    ]
    # The loop ran on through a second's wait: a tick every 10 ms on an idle machine, fewer on a
    # loaded one; a wait that held the loop leaves one or none.
    assert ticks >= 5, ticks
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert slow == []


def test_behind_a_transaction_pooler_the_listener_takes_the_direct_url(
    database_url: URL, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = database_url.render_as_string(hide_password=False)
    pooled = PgQueue(direct, settings=Settings(pooler="transaction", listen_database_url=direct))
    counter = ReadCounter(pooled, monkeypatch)
    try:
        job_id = idle_job(pooled)
        with waiter_on(pooled, engine, counter, job_id) as future:
            pooled.cancel_job(job_id)
            assert future.result(timeout=WOKEN_WITHIN).state is JobState.CANCELLED
    finally:
        pooled.dispose()


def test_behind_a_transaction_pooler_without_a_listen_url_a_waiter_reads_periodically(
    database_url: URL, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.05)
    pooled = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(pooler="transaction"),
    )
    counter = ReadCounter(pooled, monkeypatch)
    try:
        job_id = idle_job(pooled)
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(pooled.wait_for, job_id, timeout=WAIT)
            counter.wait_read(job_id)
            pooled.cancel_job(job_id)
            assert future.result(timeout=WOKEN_WITHIN).state is JobState.CANCELLED
        assert listeners(engine) == 0  # LISTEN would go to a pooled session: never sent
        assert counter.reads[job_id] >= 2
    finally:
        pooled.dispose()


def test_a_job_deleted_while_waited_for_is_not_found_at_the_safety_nets_read(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 0.1)

    counter = ReadCounter(pgq, monkeypatch)
    job_id = idle_job(pgq)
    with waiter_on(pgq, engine, counter, job_id) as future:
        pgq.admin.delete_job(job_id)
        with pytest.raises(JobNotFound, match=f"no job with id {job_id}"):
            future.result(timeout=WOKEN_WITHIN)


def test_a_job_ended_while_the_listener_reconnects_still_wakes_its_waiter(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = ReadCounter(pgq, monkeypatch)
    job_id = idle_job(pgq)
    with waiter_on(pgq, engine, counter, job_id) as future:
        with engine.connect() as connection:
            ended = connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    """ WHERE datname = current_database() AND query = 'LISTEN "pgqueue_finished"'"""
                )
            ).scalars()
            assert list(ended) == [True]
        # Most likely announced while nobody listens: the reconnect's wake-up must cover it.
        assert pgq.cancel_job(job_id) is JobState.CANCELLED
        assert future.result(timeout=WOKEN_WITHIN).state is JobState.CANCELLED
    wait_listening(engine)


def test_only_jobs_someone_waits_for_are_announced(
    pgq: PgQueue, database_url: URL, monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    """Jobs that end with no waiter send no notification (its commit-time lock is
    cluster-wide); an awaited job's end names that job alone."""

    @pgq.task(name="work", max_attempts=1)
    def work(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    heard: list[str] = []
    url = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute('LISTEN "pgqueue_finished"')
        unawaited = [work.enqueue(1), work.enqueue(-1), work.enqueue(2)]
        pgq.cancel_job(unawaited[2])
        pgq.run_worker(drain=True)
        assert [pgq.get_job(job_id).state for job_id in unawaited] == [
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
        ]
        heard.extend(note.payload for note in listener.notifies(timeout=0.5))
        assert heard == []

        awaited, other = work.enqueue(3), work.enqueue(4)
        with in_thread(Worker(pgq, concurrency=4)), ThreadPoolExecutor(1) as pool:
            job = pool.submit(pgq.wait_for, awaited, timeout=WAIT).result(timeout=WAIT)
            assert job.result == 3
            wait_until(
                lambda: pgq.get_job(other).state is JobState.SUCCEEDED,
                WAIT,
                "the other job to run",
                0.01,
            )
        heard.extend(note.payload for note in listener.notifies(timeout=0.5))
    assert heard == [str(awaited)]
