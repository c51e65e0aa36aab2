"""Single enqueues from asyncio code keep one connection between them.

On the AsyncEngine pgqueue made, back-to-back ``task.aenqueue`` calls outside a session run on
one backend, held outside the engine's pool; ``adispose`` ends it, and so does the next loop's
first enqueue for a loop that ended without ``adispose``. A kept connection the server ended is
replaced before the next enqueue, which writes its job once. Concurrent enqueues write every
job once, and an enqueue cancelled while its statement waits writes nothing and leaves the
next one to a connection of its own. A host's AsyncEngine keeps nothing.
"""

from __future__ import annotations

import asyncio
import gc
import warnings

import psycopg
from server_databases import count_on, wait_until_backend_gone
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine

from pgqueue import PgQueue

CONCURRENT = 200


def _jobs(url: URL) -> int:
    return count_on(url, "SELECT count(*) FROM pgqueue_jobs")


def _backend_of_kept(pgq: PgQueue) -> int:
    """The backend pid of the running loop's kept connection."""
    kept = pgq._engines.async_database._kept
    assert kept is not None and kept.connection is not None
    return int(kept.connection.info.backend_pid)


def test_back_to_back_aenqueues_run_on_one_kept_connection(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    async def main() -> int:
        await noop.aenqueue(n=0)
        pid = _backend_of_kept(pgq)
        pool = pgq._engines.async_database.engine.sync_engine.pool
        for n in range(1, 20):
            await noop.aenqueue(n=n)
            assert _backend_of_kept(pgq) == pid
        assert pool.checkedout() == 0  # type: ignore[attr-defined]
        await pgq.adispose()
        return pid

    pid = asyncio.run(main())
    wait_until_backend_gone(database_url, pid)
    assert _jobs(database_url) == 20


def test_a_loop_that_ended_without_adispose_has_its_connection_ended(
    pgq: PgQueue, database_url: URL
) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    async def enqueue(n: int) -> int:
        await noop.aenqueue(n=n)
        return _backend_of_kept(pgq)

    first = asyncio.run(enqueue(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = asyncio.run(enqueue(1))
        gc.collect()
    assert second != first
    # Ended, not left to the garbage collector (psycopg warns of a connection deleted open).
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    wait_until_backend_gone(database_url, first)
    asyncio.run(pgq.adispose())
    wait_until_backend_gone(database_url, second)
    assert _jobs(database_url) == 2


def test_a_kept_connection_the_server_ended_is_replaced(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    async def main() -> None:
        try:
            await noop.aenqueue(n=0)
            old = _backend_of_kept(pgq)
            assert count_on(database_url, "SELECT count(pg_terminate_backend(:pid))", pid=old) == 1
            wait_until_backend_gone(database_url, old)
            await noop.aenqueue(n=1)
            assert _backend_of_kept(pgq) != old
        finally:
            await pgq.adispose()

    asyncio.run(main())
    assert _jobs(database_url) == 2


def test_concurrent_aenqueues_write_every_job_once(pgq: PgQueue, database_url: URL) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    async def main() -> list[int]:
        try:
            return list(await asyncio.gather(*(noop.aenqueue(n=n) for n in range(CONCURRENT))))
        finally:
            await pgq.adispose()

    ids = asyncio.run(main())
    assert len(set(ids)) == CONCURRENT
    assert _jobs(database_url) == CONCURRENT
    assert (
        count_on(database_url, "SELECT count(DISTINCT kwargs->>'n') FROM pgqueue_jobs")
        == CONCURRENT
    )


def test_an_aenqueue_cancelled_while_waiting_writes_nothing_and_the_next_one_runs(
    pgq: PgQueue, database_url: URL
) -> None:
    @pgq.task(name="kept.noop")
    def noop(n: int) -> None:
        """Does nothing."""

    plain = database_url.render_as_string(hide_password=False).replace("+psycopg", "")

    async def main() -> tuple[int, int]:
        try:
            await noop.aenqueue(n=0)
            cancelled_on = _backend_of_kept(pgq)
            with psycopg.connect(plain) as locker:
                locker.execute("LOCK TABLE pgqueue_message_queue IN ACCESS EXCLUSIVE MODE")
                waiting = asyncio.ensure_future(noop.aenqueue(n=1))
                await asyncio.sleep(0.3)
                assert not waiting.done()
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                assert waiting.cancelled()
            # After any error, the cancellation included, the kept connection is ended and the
            # next enqueue makes another.
            await noop.aenqueue(n=2)
            return cancelled_on, _backend_of_kept(pgq)
        finally:
            await pgq.adispose()

    cancelled_on, next_on = asyncio.run(main())
    assert next_on != cancelled_on
    wait_until_backend_gone(database_url, cancelled_on)
    # psycopg cancels the statement on the server before the task's cancellation ends, so the
    # cancelled enqueue wrote nothing: only the two others' jobs are there.
    assert _jobs(database_url) == 2
    assert count_on(database_url, "SELECT count(*) FROM pgqueue_message_queue") == 2


def test_a_hosts_async_engine_keeps_no_connection(database_url: URL) -> None:
    async def main() -> None:
        engine = create_async_engine(database_url.set(drivername="postgresql+psycopg_async"))
        pgq = PgQueue(engine)

        @pgq.task(name="kept.noop")
        def noop(n: int) -> None:
            """Does nothing."""

        try:
            await noop.aenqueue(n=0)
            assert pgq._engines.async_database._kept is None
            assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        finally:
            await pgq.adispose()
            await engine.dispose()

    asyncio.run(main())
    assert _jobs(database_url) == 1
