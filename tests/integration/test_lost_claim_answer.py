"""A claim that committed but whose answer was lost (found by the connection-storm fault test).

The claim runs in autocommit: when the connection breaks after the commit, the jobs are RUNNING
under the worker's name but the worker never saw them. Before the fix they sat there until their
leases expired (30 s by default) and then ran as attempt 2 with "lease expired". The lost answer
is reproduced exactly: the statement runs and commits, then the driver raises as a broken
connection does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import Engine, event, text

from pgqueue import PgQueue
from pgqueue.worker.store import WorkerStore


@contextmanager
def answer_lost_once(engine: Engine, marker: str) -> Iterator[list[str]]:
    """The first statement containing ``marker`` executes (and commits), then 'the connection
    breaks' before its rows are read."""
    lost: list[str] = []

    def after(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if not lost and marker in statement:
            lost.append(statement)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield lost
    finally:
        event.remove(engine, "after_cursor_execute", after)


def test_retry_after_a_lost_claim_answer_takes_the_claimed_jobs(pgq: PgQueue) -> None:
    @pgq.task(name="noop")
    def noop() -> None: ...

    store = WorkerStore(pgq.engine, stopping=threading.Event())
    claim = {"worker_id": "w1", "queues": None, "lease_seconds": 30.0, "task_leases": {}}
    [held] = noop.enqueue_many([{}])
    [first] = store.claim(limit=1, **claim)  # type: ignore[arg-type]
    assert first.id == held
    ids = noop.enqueue_many([{}] * 3)
    later = noop.enqueue_many([{}] * 5)

    with answer_lost_once(pgq.engine, "DELETE FROM pgqueue_message_queue") as lost:
        jobs = store.claim(limit=3, held=lambda: [held], **claim)  # type: ignore[arg-type]
    assert lost  # the first attempt committed and its answer was lost
    # The retry returned exactly the jobs that attempt claimed, as attempt 1 with their tokens;
    # it claimed nothing more, and left the job this worker already holds alone.
    assert sorted(j.id for j in jobs) == ids
    assert {j.attempt for j in jobs} == {1}
    with pgq.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, state, attempts, lease_owner, lease_token FROM pgqueue_jobs ORDER BY id"
            )
        ).all()
    tokens = {j.id: j.lease_token for j in jobs}
    assert [(r.id, r.state, r.attempts, r.lease_owner) for r in rows] == (
        [(held, "running", 1, "w1")]
        + [(i, "running", 1, "w1") for i in ids]
        + [(i, "queued", 0, None) for i in later]
    )
    assert all(tokens[r.id] == r.lease_token for r in rows if r.id in tokens)

    # A claim with no failed attempt never looks for such jobs: it claims anew.
    again = store.claim(limit=2, held=lambda: [held, *ids], **claim)  # type: ignore[arg-type]
    assert sorted(j.id for j in again) == later[:2]


def test_lost_answer_on_the_claim_connection(pgq: PgQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on the connection the store keeps for its claims (used when nothing watches
    statements, so no event listener can break it): the statement runs and commits, then
    reading its rows fails as a broken connection does. The retry takes exactly those jobs, and
    the next claim runs on a fresh connection."""

    @pgq.task(name="noop")
    def noop() -> None: ...

    store = WorkerStore(pgq.engine, stopping=threading.Event())
    claim = {"worker_id": "w1", "queues": None, "lease_seconds": 30.0, "task_leases": {}}
    [held] = noop.enqueue_many([{}])
    [first] = store.claim(limit=1, **claim)  # type: ignore[arg-type]
    assert first.id == held
    claim_connection = store._claim_connection._raw.driver_connection
    ids = noop.enqueue_many([{}] * 3)
    later = noop.enqueue_many([{}] * 5)

    lost: list[object] = []
    fetchall = psycopg.Cursor.fetchall

    def lose_once(cursor: psycopg.Cursor[object]) -> list[object]:
        rows = fetchall(cursor)
        if not lost and cursor.connection is claim_connection:
            lost.append(rows)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return rows

    monkeypatch.setattr(psycopg.Cursor, "fetchall", lose_once)
    jobs = store.claim(limit=3, held=lambda: [held], **claim)  # type: ignore[arg-type]
    assert len(lost) == 1 and len(lost[0]) == 3  # type: ignore[arg-type]
    assert sorted(j.id for j in jobs) == ids
    assert {j.attempt for j in jobs} == {1}
    with pgq.engine.connect() as connection:
        rows = connection.execute(
            text("SELECT id, state, attempts, lease_owner FROM pgqueue_jobs ORDER BY id")
        ).all()
    assert [tuple(r) for r in rows] == (
        [(held, "running", 1, "w1")]
        + [(i, "running", 1, "w1") for i in ids]
        + [(i, "queued", 0, None) for i in later]
    )
    again = store.claim(limit=2, held=lambda: [held, *ids], **claim)  # type: ignore[arg-type]
    assert sorted(j.id for j in again) == later[:2]
    assert store._claim_connection._raw.driver_connection is not claim_connection
    store.close()
