"""A claim that committed but whose answer was lost.

The claim runs in autocommit: when the connection breaks after the commit, the jobs are RUNNING
under the worker's name but the worker never saw them. Unrecovered, they would sit there until
their leases expired (30 s by default) and then run as attempt 2 with "lease expired". The lost
answer is reproduced exactly: the statement runs and commits, then the driver raises as a broken
connection does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, text
from support.polling import wait_until

from pgqueue import PgQueue
from pgqueue.jobs import ClaimRequest
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


CLAIM: dict[str, Any] = {
    "worker_id": "w1",
    "queues": None,
    "lease_seconds": 30.0,
    "task_leases": {},
}


@dataclass
class Scene:
    """A store whose worker holds one claimed job (``held``), then 3 and 5 queued jobs."""

    store: WorkerStore
    held: int
    ids: list[int]
    later: list[int]

    def claim(self, limit: int, held: list[int]) -> list[Any]:
        return self.store.claim(ClaimRequest(limit=limit, held=lambda: held, **CLAIM))


def scene(pgq: PgQueue) -> Scene:
    @pgq.task(name="noop")
    def noop() -> None: ...

    store = WorkerStore(pgq.engine, stopping=threading.Event())
    [held] = noop.enqueue_many([{}])
    [first] = store.claim(ClaimRequest(limit=1, **CLAIM))
    assert first.id == held
    return Scene(store, held, noop.enqueue_many([{}] * 3), noop.enqueue_many([{}] * 5))


def assert_took_back_exactly_the_lost_claim(pgq: PgQueue, s: Scene, jobs: list[Any]) -> None:
    """The retry returned exactly the jobs the lost attempt claimed, as attempt 1 with their
    tokens; it claimed nothing more and left the job the worker already held alone. A later
    claim with no failed attempt claims anew."""
    assert sorted(j.id for j in jobs) == s.ids
    assert {j.attempt for j in jobs} == {1}
    with pgq.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, state, attempts, lease_owner, lease_token::text AS lease_token"
                " FROM pgqueue_jobs ORDER BY id"
            )
        ).all()
    tokens = {j.id: j.lease_token for j in jobs}
    assert [(r.id, r.state, r.attempts, r.lease_owner) for r in rows] == (
        [(s.held, "running", 1, "w1")]
        + [(i, "running", 1, "w1") for i in s.ids]
        + [(i, "queued", 0, None) for i in s.later]
    )
    assert all(tokens[r.id] == r.lease_token for r in rows if r.id in tokens)
    again = s.claim(2, [s.held, *s.ids])
    assert sorted(j.id for j in again) == s.later[:2]


def test_retry_after_a_lost_claim_answer_takes_the_claimed_jobs(pgq: PgQueue) -> None:
    s = scene(pgq)
    with answer_lost_once(pgq.engine, "DELETE FROM pgqueue_message_queue") as lost:
        jobs = s.claim(3, [s.held])
    assert lost  # the first attempt committed and its answer was lost
    assert_took_back_exactly_the_lost_claim(pgq, s, jobs)


def test_lost_answer_on_the_claim_connection(pgq: PgQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on the connection the store keeps for its claims (used when nothing watches
    statements, so no event listener can break it): the statement runs and commits, then
    reading its rows fails as a broken connection does. The retry takes exactly those jobs, and
    the next claim runs on a fresh connection."""
    s = scene(pgq)
    claim_connection = s.store._claim_connection._raw.driver_connection
    lost: list[object] = []
    fetchall = psycopg.Cursor.fetchall

    def lose_once(cursor: psycopg.Cursor[object]) -> list[object]:
        rows = fetchall(cursor)
        if not lost and cursor.connection is claim_connection:
            lost.append(rows)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return rows

    monkeypatch.setattr(psycopg.Cursor, "fetchall", lose_once)
    jobs = s.claim(3, [s.held])
    assert len(lost) == 1 and len(lost[0]) == 3  # type: ignore[arg-type]
    assert_took_back_exactly_the_lost_claim(pgq, s, jobs)
    assert s.store._claim_connection._raw.driver_connection is not claim_connection
    s.store.close()


def test_a_claim_keeps_its_jobs_when_the_connection_dies_in_the_look_after_it(
    pgq: PgQueue, engine: Engine
) -> None:
    """A worker's first claim is followed by a look at which flow controls exist. When the
    server ends the connection during that look (here: the look waits for a lock, and the
    backend is terminated meanwhile, as a server shutdown does), the claim has committed: its
    jobs are the worker's. The store hands them over, even though the worker is stopping and so
    will not retry, rather than leave them RUNNING, unseen, until their leases expire."""

    @pgq.task(name="noop")
    def noop() -> None: ...

    ids = noop.enqueue_many([{}] * 3)
    stopping = threading.Event()
    store = WorkerStore(pgq.engine, stopping=stopping)
    claim_pid = store._claim_connection.rows(text("SELECT pg_backend_pid()"))[0][0]
    answer: list[Any] = []

    def claim() -> None:
        try:
            answer.append(store.claim(ClaimRequest(limit=5, **CLAIM)))
        except Exception as exc:
            answer.append(exc)

    with engine.connect() as locker, engine.connect() as watcher:
        # Only the look reads the key limits (the first claim's form does not).
        locker.execute(text("LOCK TABLE pgqueue_key_limits IN ACCESS EXCLUSIVE MODE"))
        claimer = threading.Thread(target=claim)
        claimer.start()
        waiting = text(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid"
        ).bindparams(pid=claim_pid)
        wait_until(
            lambda: watcher.execute(waiting).scalar_one(), 10, "the look to wait for the lock", 0.01
        )
        watcher.commit()
        stopping.set()
        watcher.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": claim_pid})
        claimer.join(timeout=10)
        locker.rollback()
    [jobs] = answer
    assert isinstance(jobs, list), jobs
    assert sorted(j.id for j in jobs) == ids
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, state, lease_owner, lease_token::text AS lease_token"
                " FROM pgqueue_jobs ORDER BY id"
            )
        ).all()
    tokens = {j.id: j.lease_token for j in jobs}
    assert [(r.id, r.state, r.lease_owner, r.lease_token) for r in rows] == [
        (i, "running", "w1", tokens[i]) for i in ids
    ]
    # The next claim runs on a fresh connection and finds the jobs enqueued since.
    stopping.clear()
    more = noop.enqueue_many([{}] * 2)
    assert (
        sorted(j.id for j in store.claim(ClaimRequest(limit=5, held=lambda: ids, **CLAIM))) == more
    )
    store.close()


def test_the_take_back_leaves_alone_an_atomic_job_its_probe_claimed_meanwhile(
    pgq: PgQueue,
) -> None:
    """An atomic job is claimed in a statement that commits by itself (``claim_atomic``),
    under the worker's own id; the worker's atomic probe then
    runs it in a transaction that locks its row. If a leased claim of the same worker loses its
    answer meanwhile, the take-back of what that claim committed must not take the atomic job
    too: run as a leased job, its handler's writes commit in a session of their own, with no
    lock on the job. The probe, whose connection broke at the same moment, then gives the job
    back (attempt count undone), and another worker runs the same attempt at the same time,
    both committing (chaos seed 23: job 482, attempt 1 in two processes). The retry takes back
    exactly the leased jobs; the atomic job stays RUNNING under the probe's lease."""

    @pgq.task(name="noop")
    def noop() -> None: ...

    @pgq.task(name="limited_atomic", queue="limited", atomic=True)
    def limited_atomic() -> None: ...

    pgq.set_queue_limit("limited", 1)
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    atomic_id = limited_atomic.enqueue()
    ids = noop.enqueue_many([{}] * 2)
    probed: list[Any] = []
    lost: list[str] = []

    def after(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if not lost and "DELETE FROM pgqueue_message_queue" in statement:
            lost.append(statement)
            # The worker's atomic probe claims meanwhile, on a connection of its own.
            probed.extend(store.claim_atomic(ClaimRequest(limit=1, **CLAIM)))
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    event.listen(pgq.engine, "after_cursor_execute", after)
    try:
        jobs = store.claim(ClaimRequest(limit=5, held=lambda: [], **CLAIM))
    finally:
        event.remove(pgq.engine, "after_cursor_execute", after)
    assert lost
    assert [j.id for j in probed] == [atomic_id]
    assert sorted(j.id for j in jobs) == ids
    with pgq.engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT state, attempts, lease_owner, lease_token::text FROM pgqueue_jobs"
                " WHERE id = :id"
            ),
            {"id": atomic_id},
        ).one()
    assert tuple(row) == ("running", 1, "w1", probed[0].lease_token)
    store.close()
