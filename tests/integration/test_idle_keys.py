"""Concurrency keys over time: a claim reads only the key rows of keys with waiting tickets,
maintenance deletes the rows of keys no job has any more (and keeps every other), and an
enqueue racing that deletion never leaves a job whose key row is gone."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import PgQueue
from pgqueue.data import claim as claim_data
from pgqueue.db import executor_for
from pgqueue.worker import Worker
from pgqueue.worker.maintenance import Maintenance
from pgqueue.worker.stats import WorkerStats
from pgqueue.worker.store import WorkerStore

CLAIM = {"worker_id": "w", "queues": None, "lease_seconds": 30.0, "task_leases": {}}
IDLE_KEYS = 50_000


def _insert_idle_keys(engine: Engine, n: int, prefix: str = "idle:") -> None:
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO pgqueue_concurrency_keys (key, key_limit)"
                " SELECT :prefix || g, 1 FROM generate_series(1, :n) AS g"
            ),
            {"prefix": prefix, "n": n},
        )
        c.execute(text("ANALYZE pgqueue_concurrency_keys"))


def _key_rows(engine: Engine) -> dict[str, tuple[int | None, int]]:
    with engine.connect() as c:
        rows = c.execute(text("SELECT key, key_limit, running FROM pgqueue_concurrency_keys"))
        return {row.key: (row.key_limit, row.running) for row in rows}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _key_rows_read(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of the key table produced or filtered away, over all loops."""
    read = 0
    for node in _nodes(plan):
        if node.get("Relation Name") == "pgqueue_concurrency_keys" and "Scan" in node["Node Type"]:
            per_loop = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            read += per_loop * node.get("Actual Loops", 1)
    return read


def test_a_claim_reads_only_the_key_rows_of_keys_with_waiting_tickets(pgq: PgQueue) -> None:
    @pgq.task(name="k", concurrency_key=lambda key, n: key, key_limit=2)
    def keyed(key: str, n: int) -> None: ...

    @pgq.task(name="plain")
    def plain(n: int) -> None: ...

    _insert_idle_keys(pgq.engine, IDLE_KEYS)
    keyed.enqueue_many([{"key": f"live:{n % 5}", "n": n} for n in range(20)])
    plain.enqueue_many([{"n": n} for n in range(10)])

    sent: list[tuple[str, dict[str, Any]]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if "SKIP LOCKED" in statement and "pgqueue_concurrency_keys" in statement:
            sent.append((statement, dict(parameters)))

    with Session(pgq.engine) as session:
        event.listen(pgq.engine, "before_cursor_execute", record)
        try:
            with session.begin():
                claimed = claim_data.claim(executor_for(session), limit=20, **CLAIM)
                session.rollback()
        finally:
            event.remove(pgq.engine, "before_cursor_execute", record)
    # Each live key gives its room (2), the plain jobs fill the rest.
    assert Counter(job.task_name for job in claimed) == {"k": 10, "plain": 10}
    assert sent, "the claim sent no flow statement"
    statement, parameters = sent[-1]
    with pgq.engine.connect() as c, c.begin():
        plan = c.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
        ).scalar_one()
        c.rollback()
    read = _key_rows_read(plan[0]["Plan"])
    # The 5 live keys' rows, each read a few times (lock, room, counter update): never the
    # 50,000 idle ones.
    assert read <= 50, f"the claim read {read} key rows"


def _maintenance(pgq: PgQueue) -> tuple[Maintenance, WorkerStore]:
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    maintenance = Maintenance(
        store=store,
        settings=pgq.settings,
        run_schedules=lambda: None,
        stats=WorkerStats(),
        halt=threading.Event(),
    )
    return maintenance, store


def test_maintenance_deletes_idle_key_rows_and_keeps_the_needed_ones(pgq: PgQueue) -> None:
    @pgq.task(name="k", concurrency_key=lambda key, n=0: key, key_limit=3)
    def keyed(key: str, n: int = 0) -> None: ...

    _insert_idle_keys(pgq.engine, 7_000)  # more than one batch of the cleanup
    keyed.enqueue_many([{"key": "claimed"}])
    with Session(pgq.engine) as session, session.begin():
        claimed = claim_data.claim(executor_for(session), limit=1, **CLAIM)
    assert [job.kwargs["key"] for job in claimed] == ["claimed"]
    keyed.enqueue_many([{"key": "queued"}])  # a ticket
    keyed.enqueue_many([{"key": "delayed"}])
    keyed.enqueue_many([{"key": "finished"}])
    gone = keyed.enqueue_many([{"key": "deleted"}])
    with pgq.engine.begin() as c:
        c.execute(
            text(
                "UPDATE pgqueue_message_queue SET run_at = now() + interval '1 hour' WHERE job_id"
                " IN (SELECT id FROM pgqueue_jobs WHERE concurrency_key = 'delayed')"
            )
        )
        # A finished job can be re-run: its key row (with the task's limit) must stay.
        c.execute(
            text(
                "DELETE FROM pgqueue_message_queue WHERE job_id IN"
                " (SELECT id FROM pgqueue_jobs WHERE concurrency_key = 'finished')"
            )
        )
        c.execute(
            text(
                "UPDATE pgqueue_jobs SET state = 'failed', finished_at = now()"
                " WHERE concurrency_key = 'finished'"
            )
        )
        c.execute(text("DELETE FROM pgqueue_message_queue WHERE job_id = ANY(:ids)"), {"ids": gone})
        c.execute(text("DELETE FROM pgqueue_jobs WHERE id = ANY(:ids)"), {"ids": gone})
        c.execute(
            text(
                "INSERT INTO pgqueue_concurrency_keys (key, running, recent_starts) VALUES"
                " ('counted', 1, NULL),"
                " ('rated:live', 0, ARRAY[now() - interval '5 seconds']),"
                " ('rated:old', 0, ARRAY[now() - interval '2 minutes']),"
                " ('unrated', 0, ARRAY[now()])"
            )
        )
    pgq.admin.set_rate_limit(limit=2, per=60.0, key="rated:")

    maintenance, _ = _maintenance(pgq)
    deleted = 0
    for _ in range(3):
        deleted += maintenance.delete_idle_keys()
    rows = _key_rows(pgq.engine)
    assert deleted == 7_000 + 3  # the idle rows, "deleted", "rated:old", "unrated"
    assert set(rows) == {"queued", "delayed", "claimed", "finished", "counted", "rated:live"}

    # A key whose row was deleted gets it back, with its task's limit, at its next enqueue.
    again = keyed.enqueue_many([{"key": "deleted", "n": n} for n in range(5)])
    assert _key_rows(pgq.engine)["deleted"] == (3, 0)
    with Session(pgq.engine) as session, session.begin():
        claimed = claim_data.claim(executor_for(session), limit=10, **CLAIM)
    assert sorted(job.id for job in claimed if job.kwargs["key"] == "deleted") == again[:3]


@pytest.mark.slow
def test_enqueues_racing_the_key_cleanup_leave_every_job_claimable(pgq: PgQueue) -> None:
    ran: Counter[int] = Counter()
    ran_lock = threading.Lock()

    @pgq.task(name="k", concurrency_key=lambda key, n: key, key_limit=1)
    def keyed(key: str, n: int) -> None:
        with ran_lock:
            ran[n] += 1

    # Each thread enqueues to its own key, one job after another: while a job's transaction is
    # still open, the key's previous job often runs and is deleted, and the cleanup then finds
    # the key's row without any committed job: exactly the race with the open enqueue.
    threads, per_thread, keys = 6, 60, 1
    stop = threading.Event()
    _, store = _maintenance(pgq)
    deletions = 0

    def clean() -> None:
        nonlocal deletions
        with pgq.engine.connect() as c:
            c.execution_options(isolation_level="AUTOCOMMIT")
            while not stop.is_set():
                c.execute(text("DELETE FROM pgqueue_jobs WHERE state = 'succeeded'"))
                deletions += store.delete_idle_keys(after="", limit=1000)[1]

    def enqueue(t: int) -> None:
        rng = random.Random(t)
        for i in range(per_thread):
            n = t * per_thread + i
            with Session(pgq.engine) as session, session.begin():
                keyed.enqueue_many([{"key": f"k:{t}:{i % keys}", "n": n}], session=session)
                # A host transaction that stays open a while after its enqueue.
                time.sleep(rng.uniform(0.0, 0.04))

    cleaner = threading.Thread(target=clean, daemon=True)
    enqueuers = [threading.Thread(target=enqueue, args=(t,)) for t in range(threads)]
    total = threads * per_thread
    with in_thread(Worker(pgq, concurrency=4)):
        for thread in [cleaner, *enqueuers]:
            thread.start()
        for thread in enqueuers:
            thread.join()
        # Past the deadline the checks below name the jobs left unclaimed.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: len(ran) >= total, 60, f"all {total} jobs to run", interval=0.1)
        stop.set()
        cleaner.join()
    with pgq.engine.connect() as c:
        left = c.execute(
            text(
                "SELECT j.id, j.concurrency_key, k.key IS NOT NULL AS has_row"
                " FROM pgqueue_jobs j LEFT JOIN pgqueue_concurrency_keys k"
                " ON k.key = j.concurrency_key WHERE j.state <> 'succeeded'"
            )
        ).all()
    assert left == [], f"jobs left unclaimed: {left}"
    assert deletions > 0, "the cleanup never deleted a key row: the race was not exercised"
    assert ran == Counter(range(total))
