"""An admin read (the dashboard's pages, the CLI's listings, ``pgq.get_job``) whose connection
the server ended is sent once more on a new one, sync and asyncio.

The server ends the read's session after its transaction began and before its first statement
on a job table, as a restart or a failover does to a pooled connection whose goodbye had not
reached the socket when the checkout tested it. The caller gets its answer, not the driver's
"terminating connection due to administrator command".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from server_databases import count_on, wait_until_backend_gone
from sqlalchemy import Engine, event
from sqlalchemy.engine import URL

from pgqueue import JobState, PgQueue


@contextmanager
def session_ended_before_its_first_job_read(engine: Engine, url: URL) -> Iterator[list[int]]:
    """While open, the first statement of ``engine`` that reads a job table finds its server
    session ended; yields the ended backends' pids."""
    ended: list[int] = []

    def end(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if ended or "pgqueue_jobs" not in statement:
            return
        pid = conn.connection.driver_connection.info.backend_pid
        count_on(url, "SELECT count(pg_terminate_backend(:pid))", pid=pid)
        wait_until_backend_gone(url, pid)
        ended.append(pid)

    event.listen(engine, "before_cursor_execute", end)
    try:
        yield ended
    finally:
        event.remove(engine, "before_cursor_execute", end)


def _queued_job(pgq: PgQueue) -> int:
    @pgq.task(name="read.retry")
    def noop() -> None:
        return None

    return noop.enqueue()


def test_a_read_whose_session_the_server_ended_is_sent_again(
    pgq: PgQueue, database_url: URL
) -> None:
    job_id = _queued_job(pgq)
    with session_ended_before_its_first_job_read(pgq.engine, database_url) as ended:
        job = pgq.admin.get_job(job_id)
        counts = pgq.admin.capped_counts()
    assert len(ended) == 1
    assert (job.id, job.state) == (job_id, JobState.QUEUED)
    assert counts["default"][JobState.QUEUED] == 1


def test_an_async_read_whose_session_the_server_ended_is_sent_again(
    pgq: PgQueue, database_url: URL
) -> None:
    job_id = _queued_job(pgq)

    async def main() -> Any:
        engine = pgq.async_engine.sync_engine
        with session_ended_before_its_first_job_read(engine, database_url) as ended:
            job = await pgq.admin.aget_job(job_id)
        await pgq.adispose()
        return ended, job

    ended, job = asyncio.run(main())
    assert len(ended) == 1
    assert (job.id, job.state) == (job_id, JobState.QUEUED)
