"""Enqueue and job control from asyncio code, on real PostgreSQL.

An ``AsyncSession``'s enqueue commits or rolls back with the session's transaction; pgqueue's
own asyncio units of work never hold the event loop (asyncio's debug mode reports any callback
that runs longer than ``SLOW_CALLBACK_SECONDS``), and the asyncio calls refuse what the
synchronous ones refuse, before any SQL.

The slow-callback threshold is 1.0 s. A correct enqueue runs well under a millisecond of
Python between two awaits, but on a shared 2-core CI machine running three servers' test tiers
at once a step can take a few hundred milliseconds (the process descheduled, or a garbage
collection walking the many objects asyncio's debug mode records per task), so a threshold
near asyncio's default of 0.1 s fails now and then. A
blocking enqueue is made to block for ``TABLE_LOCK_SECONDS`` (2.5 s, 2.5 times the threshold):
the tests hold a lock its insert must wait for, so the check fails it every time (the last
test of that section shows it).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from pgqueue import Job, JobState, MessageQueue, PgQueue, Settings, ValidationError
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data.insert_choice import COPY_THRESHOLD
from pgqueue.errors import JobNotFound
from pgqueue.testing import run_until_final

SLOW_CALLBACK_SECONDS = 1.0
TABLE_LOCK_SECONDS = 2.5
CONCURRENT_ENQUEUES = 1000


def async_url(url: URL) -> URL:
    return url.set(drivername="postgresql+psycopg_async")


def count(url: URL, model: Any) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.scalar(select(func.count()).select_from(model)) or 0
    finally:
        engine.dispose()


@pytest.fixture
def orders_url(database_url: URL) -> URL:
    """The test database with an application table of its own."""
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, item text)"))
    engine.dispose()
    return database_url


def test_async_session_enqueue_exists_only_if_the_transaction_commits(
    pgq: PgQueue, orders_url: URL
) -> None:
    seen: list[int] = []

    @pgq.task(name="ship")
    async def ship(order_id: int) -> int:
        await asyncio.sleep(0)
        seen.append(order_id)
        return order_id

    async def main() -> tuple[int, str, str]:
        app_engine = create_async_engine(async_url(orders_url))
        try:
            async with AsyncSession(app_engine) as session, session.begin():
                order_id = await session.scalar(
                    text("INSERT INTO orders (item) VALUES ('tea') RETURNING id")
                )
                await ship.configure(session=session).aenqueue(order_id)
                await session.rollback()
            assert count(orders_url, Job) == 0
            assert count(orders_url, MessageQueue) == 0

            async with AsyncSession(app_engine) as session, session.begin():
                order_id = await session.scalar(
                    text("INSERT INTO orders (item) VALUES ('mug') RETURNING id")
                )
                job_id = await ship.configure(session=session, priority=3).aenqueue(order_id)
                # Not visible outside the transaction before it commits.
                assert count(orders_url, Job) == 0
            async with app_engine.connect() as connection:
                order_xmin = await connection.scalar(
                    text("SELECT xmin::text FROM orders WHERE id = :id"), {"id": order_id}
                )
                job_xmin = await connection.scalar(
                    text("SELECT xmin::text FROM pgqueue_jobs WHERE id = :id"), {"id": job_id}
                )
            assert order_xmin == job_xmin  # one PostgreSQL transaction wrote both
            return job_id, order_xmin, job_xmin
        finally:
            await app_engine.dispose()
            await pgq.adispose()

    job_id, _, _ = asyncio.run(main())
    assert count(orders_url, Job) == 1
    assert run_until_final(pgq, [job_id], concurrency=2) == {job_id: JobState.SUCCEEDED}
    job = pgq.get_job(job_id)
    assert (job.priority, job.args, job.result) == (3, [seen[0]], seen[0])
    assert len(seen) == 1


def test_aenqueue_many_in_a_session_and_copy_outside_one(
    pgq: PgQueue, database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    @pgq.task(name="add")
    def add(a: int, b: int = 0) -> int:
        return a + b

    copies: list[int] = []
    real_copy = enqueue_data.copy_jobs

    def spy(*args: Any) -> None:
        copies.append(len(args[2]))
        real_copy(*args)

    monkeypatch.setattr(enqueue_data, "copy_jobs", spy)
    n = COPY_THRESHOLD + 17

    async def main() -> tuple[list[int], list[int]]:
        app_engine = create_async_engine(async_url(database_url))
        try:
            async with AsyncSession(app_engine) as session:
                await add.aenqueue_many([[1, 2], {"a": 3}], session=session)
                await session.rollback()
            async with AsyncSession(app_engine) as session:
                small = await add.aenqueue_many([[1, 2], {"a": 3, "b": 4}], session=session)
                await session.commit()
            large = await add.configure(delay=3600).aenqueue_many([[i] for i in range(n)])
            return small, large
        finally:
            await app_engine.dispose()
            await pgq.adispose()

    small, large = asyncio.run(main())
    assert copies == [n]  # the large own-transaction batch went through COPY
    assert len(large) == n and large == sorted(large) and len(set(large)) == n
    assert count(database_url, Job) == n + 2
    assert count(database_url, MessageQueue) == n + 2
    engine = create_engine(database_url)
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT args::text, kwargs::text, run_at > now() + interval '50 minutes'"
                " FROM pgqueue_jobs WHERE id = ANY(:ids) ORDER BY id"
            ),
            {"ids": [*small, large[0], large[-1]]},
        ).all()
    engine.dispose()
    assert rows == [
        ("[1,2]", "{}", False),
        ("[]", '{"a":3,"b":4}', False),
        ("[0]", "{}", True),
        (f"[{n - 1}]", "{}", True),
    ]
    assert run_until_final(pgq, small) == dict.fromkeys(small, JobState.SUCCEEDED)


@pytest.mark.slow
def test_unique_keys_and_dependencies_as_on_the_sync_path(pgq: PgQueue) -> None:
    @pgq.task(name="step")
    def step(n: int) -> int:
        return n

    async def main() -> tuple[int, int, int, int]:
        try:
            first = await step.configure(unique_key="only-one").aenqueue(1)
            again = await step.configure(unique_key="only-one").aenqueue(2)
            after = await step.configure(depends_on=[first]).aenqueue(3)
            with pytest.raises(JobNotFound, match="depends_on names jobs that do not exist"):
                await step.configure(depends_on=[first + 1000]).aenqueue(4)
            return first, again, after, len(await step.aenqueue_many([[5], [6]]))
        finally:
            await pgq.adispose()

    first, again, after, batch = asyncio.run(main())
    assert again == first and batch == 2
    assert pgq.get_job(after).state == JobState.WAITING
    states = run_until_final(pgq, [first, after])
    assert states == {first: JobState.SUCCEEDED, after: JobState.SUCCEEDED}


def test_job_control_from_asyncio(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="later")
    def later() -> None:
        return None

    async def main() -> None:
        app_engine = create_async_engine(async_url(database_url))
        try:
            job_id = await later.configure(delay=3600).aenqueue()
            job = await pgq.aget_job(job_id)
            assert (job.id, job.state, job.task_name) == (job_id, JobState.QUEUED, "later")

            # Cancelled in a session that rolls back: nothing happened.
            async with AsyncSession(app_engine) as session:
                assert await pgq.acancel_job(job_id, session=session) == JobState.CANCELLED
                await session.rollback()
            assert (await pgq.aget_job(job_id)).state == JobState.QUEUED

            assert await pgq.acancel_job(job_id) == JobState.CANCELLED
            assert (await pgq.aget_job(job_id)).state == JobState.CANCELLED
            assert count(database_url, MessageQueue) == 0

            async with AsyncSession(app_engine) as session, session.begin():
                await pgq.aretry_job(job_id, session=session)
            assert (await pgq.aget_job(job_id)).state == JobState.QUEUED
            assert count(database_url, MessageQueue) == 1

            with pytest.raises(JobNotFound, match="no job with id 999999"):
                await pgq.aget_job(999999)
            with pytest.raises(Exception, match="cannot retry job"):
                await pgq.aretry_job(job_id)
        finally:
            await app_engine.dispose()
            await pgq.adispose()

    asyncio.run(main())


def test_a_given_async_engine_serves_the_asyncio_calls(database_url: URL) -> None:
    """``PgQueue(async_engine)``: the asyncio calls use it; workers and synchronous calls get
    engines made from its URL."""
    engine = create_async_engine(async_url(database_url))
    pgq = PgQueue(engine, settings=Settings(poll_interval=0.2))
    ran: list[str] = []

    @pgq.task(name="greet")
    async def greet(name: str) -> None:
        ran.append(name)

    async def main() -> int:
        try:
            assert pgq.async_engine is engine
            return await greet.aenqueue("ada")
        finally:
            await pgq.adispose()
            await engine.dispose()

    try:
        job_id = asyncio.run(main())
        assert pgq.engine.url.drivername == "postgresql+psycopg"
        assert run_until_final(pgq, [job_id]) == {job_id: JobState.SUCCEEDED}
        assert ran == ["ada"]
    finally:
        pgq.dispose()


@pytest.mark.parametrize("pooler", ["none", "transaction"])
def test_the_async_engine_has_the_sync_engines_settings(database_url: URL, pooler: str) -> None:
    """Statement timeout and ``jit = off`` in pgqueue's asyncio transactions: as startup options
    on a direct connection, set inside each transaction (and gone after it) behind a pooler."""
    pgq = PgQueue(database_url, settings=Settings(pooler=pooler, statement_timeout_ms=4321))
    state = text(
        "SELECT current_setting('jit'), current_setting('statement_timeout'),"
        " current_setting('application_name')"
    )

    async def main() -> tuple[Any, Any]:
        try:
            inside = await pgq.async_database.run(lambda db: db.rows(state)[0])
            async with pgq.async_engine.connect() as connection:
                await connection.execution_options(isolation_level="AUTOCOMMIT")
                between = (await connection.execute(state)).one()
            return tuple(inside), tuple(between)
        finally:
            await pgq.adispose()

    inside, between = asyncio.run(main())
    assert inside == ("off", "4321ms", "pgqueue")
    if pooler == "transaction":
        assert between[:2] == ("on", "0")  # nothing stays on a server session others share
    else:
        assert between[:2] == ("off", "4321ms")


def test_a_pooled_connection_the_server_ended_is_replaced_at_checkout(
    pgq: PgQueue, database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    """As on the sync engine: the dead connection is seen before a statement is sent on it, so
    not even the unit of work's retry is needed."""

    @pgq.task(name="noop")
    def noop(i: int) -> int:
        return i

    terminate = text(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = 'pgqueue' AND pid <> pg_backend_pid()"
    )

    async def main() -> list[int]:
        try:
            first = await noop.aenqueue(1)
            engine = create_engine(database_url)
            with engine.connect() as connection:
                assert connection.scalar(terminate) == 1  # the pooled one, idle
            engine.dispose()
            await asyncio.sleep(0.2)
            return [first, await noop.aenqueue(2), (await pgq.aget_job(first)).id]
        finally:
            await pgq.adispose()

    with caplog.at_level(logging.INFO, logger="pgqueue.uow"):
        first, second, read = asyncio.run(main())
    assert second > first == read
    assert count(database_url, Job) == 2
    assert [r.getMessage() for r in caplog.records if r.name == "pgqueue.uow"] == []


# -- the event loop is never held ---------------------------------------------------------------


@pytest.fixture
def locked_jobs_table(database_url: URL) -> Iterator[Callable[[], None]]:
    """A function that locks ``pgqueue_jobs`` against inserts from another thread and releases
    it ``TABLE_LOCK_SECONDS`` later: every enqueue meanwhile waits on the server."""
    conninfo = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    threads: list[threading.Thread] = []

    def lock() -> None:
        locked = threading.Event()

        def hold() -> None:
            with psycopg.connect(conninfo) as connection:
                connection.execute("LOCK TABLE pgqueue_jobs IN SHARE MODE")
                locked.set()
                time.sleep(TABLE_LOCK_SECONDS)

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        threads.append(thread)
        assert locked.wait(10)

    yield lock
    for thread in threads:
        thread.join(30)


class SlowCallbacks(logging.Handler):
    """asyncio's debug-mode reports of callbacks that held the loop ("Executing <Task ...> took
    0.412 seconds")."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reports: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing "):
            self.reports.append(message)


def run_concurrently(
    enqueue: Callable[[int], Awaitable[int]], n: int, before: Callable[[], None]
) -> tuple[list[int], list[str]]:
    """``n`` concurrent ``enqueue(i)`` calls on one debug-mode event loop (``before()`` runs on
    the loop first); returns their ids and the slow-callback reports."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = SLOW_CALLBACK_SECONDS
        before()
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(enqueue(i)))
            if i % 10 == 9:
                # In debug mode every task records its creation stack: created all in one go,
                # a thousand of them would be the test's own slow callback, not pgqueue's.
                await asyncio.sleep(0)
        return list(await asyncio.gather(*tasks))

    reports = SlowCallbacks()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(reports)
    # A full garbage collection walks every object of the process, and the test process holds
    # pytest's: moved out of the collector's way, the pauses left are those of what this run
    # allocates.
    gc.collect()
    gc.freeze()
    try:
        ids = asyncio.run(main(), debug=True)
    finally:
        gc.unfreeze()
        asyncio_log.removeHandler(reports)
    return ids, reports.reports


@pytest.mark.slow
def test_a_thousand_concurrent_aenqueues_never_hold_the_event_loop(
    pgq: PgQueue, database_url: URL, locked_jobs_table: Callable[[], None]
) -> None:
    @pgq.task(name="noop")
    def noop(i: int) -> int:
        return i

    ids, reports = run_concurrently(noop.aenqueue, CONCURRENT_ENQUEUES, locked_jobs_table)
    asyncio.run(pgq.adispose())
    assert reports == []
    assert len(set(ids)) == CONCURRENT_ENQUEUES
    assert count(database_url, Job) == CONCURRENT_ENQUEUES
    assert count(database_url, MessageQueue) == CONCURRENT_ENQUEUES


def test_the_slow_callback_check_catches_an_enqueue_that_blocks(
    pgq: PgQueue, database_url: URL, locked_jobs_table: Callable[[], None]
) -> None:
    """The same run with the synchronous enqueue inside the coroutine: the check fails."""

    @pgq.task(name="noop")
    def noop(i: int) -> int:
        return i

    async def blocking_enqueue(i: int) -> int:
        return noop.enqueue(i)

    ids, reports = run_concurrently(blocking_enqueue, 20, locked_jobs_table)
    assert len(ids) == 20
    assert reports, "a blocking enqueue went unnoticed"
    assert "took" in reports[0]


@pytest.mark.slow
def test_the_embedded_servers_start_stays_off_the_event_loop() -> None:
    """With no database configured, the first asyncio call starts the embedded development
    server in a thread: the loop keeps running meanwhile."""
    from pgqueue import embedded

    data_dir = Path(tempfile.mkdtemp(prefix="pgqueue-async-embedded-"))
    data_dir.chmod(0o755)
    pgq = PgQueue(settings=Settings(embedded_data_dir=str(data_dir / "data")))
    errors: list[BaseException] = []

    async def read(i: int) -> int:
        try:
            await pgq.aget_job(1)
        except Exception as exc:  # the fresh server has no pgqueue tables
            errors.append(exc)
        finally:
            await pgq.adispose()
        return i

    try:
        _, reports = run_concurrently(read, 1, lambda: None)
    finally:
        server = embedded.shared._SHARED.pop(data_dir / "data", None)
        if server is not None:
            server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert server is not None  # the call did start it
    assert reports == []
    assert [type(e).__name__ for e in errors] == ["ProgrammingError"]
    assert "pgqueue_jobs" in str(errors[0])


# -- the same refusals as the synchronous path, before any SQL ----------------------------------


def test_asyncio_calls_refuse_bad_input_before_any_sql() -> None:
    """On a queue whose database cannot be reached: a refusal that came after any SQL would be
    a connection error instead."""
    # An asyncio app's URL serves as it is: the sync engines use psycopg's sync driver.
    pgq = PgQueue("postgresql+psycopg_async://nobody@127.0.0.1:1/nothing")
    assert pgq.url.drivername == "postgresql+psycopg"

    @pgq.task(name="pair")
    def pair(a: int, b: int) -> None:
        return None

    async def main() -> None:
        with pytest.raises(ValidationError, match="arguments do not match task pair"):
            await pair.aenqueue(1)
        with pytest.raises(ValidationError, match="not JSON"):
            await pair.aenqueue(1, object())
        with pytest.raises(ValidationError, match="enqueue_many item 1"):
            await pair.aenqueue_many([[1, 2], "ab"])
        with pytest.raises(ValidationError, match="either delay or run_at"):
            await pair.configure(delay=1, run_at=time_now()).aenqueue(1, 2)
        from sqlalchemy.orm import Session

        with Session() as sync_session:
            with pytest.raises(ValidationError, match="need an AsyncSession"):
                await pair.configure(session=sync_session).aenqueue(1, 2)
            with pytest.raises(ValidationError, match="need an AsyncSession"):
                await pgq.aretry_job(1, session=sync_session)  # type: ignore[arg-type]
        async with AsyncSession() as async_session:
            with pytest.raises(ValidationError, match="session is an AsyncSession"):
                pair.configure(session=async_session).enqueue(1, 2)
            with pytest.raises(ValidationError, match="session is an AsyncSession"):
                pair.enqueue_many([[1, 2]], session=async_session)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="session must be a SQLAlchemy"):
            pair.configure(session="s")  # type: ignore[arg-type]
        for call in (pgq.aget_job, pgq.aretry_job, pgq.acancel_job):
            with pytest.raises(ValidationError, match="job id must be a positive int"):
                await call(0)

    asyncio.run(main())


def time_now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)
