"""What a claim writes into the indexes of ``pgqueue_jobs``: the primary key's and the lease
index's entries, none into the dashboard's ``(queue, state, id)`` and ``(task_name, state, id)``
indexes, which leave running jobs out. The outcome that ends the job writes its entries there.

Measured by the indexes' sizes in pages: 3,000 entries of either dashboard index fill several
pages, so an index the claim wrote into grows, and one it did not keeps its size exactly (a
btree never gives pages back).
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text

from pgqueue import PgQueue
from pgqueue.jobs import ClaimRequest, Outcome
from pgqueue.worker.store import WorkerStore

JOBS = 3_000
STATE_INDEXES = ("ix_pgqueue_jobs_queue_state_id", "ix_pgqueue_jobs_task_name_state_id")
LEASE_INDEX = "ix_pgqueue_jobs_lease_expires_at"


def _pages(engine: Engine) -> dict[str, int]:
    names = (*STATE_INDEXES, LEASE_INDEX)
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT relname, pg_relation_size(oid) / current_setting('block_size')::int"
                " FROM pg_class WHERE relname = ANY(:names)"
            ),
            {"names": list(names)},
        ).all()
    return {name: int(pages) for name, pages in rows}


@pytest.mark.slow
def test_a_claim_writes_no_entry_into_the_state_indexes(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="noop")
    def noop() -> None: ...

    noop.enqueue_many([{}] * JOBS)
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    queued = _pages(engine)
    claimed = store.claim(
        ClaimRequest(worker_id="w1", limit=JOBS, queues=None, lease_seconds=30.0, task_leases={})
    )
    assert len(claimed) == JOBS
    running = _pages(engine)
    assert running[LEASE_INDEX] > queued[LEASE_INDEX]  # the claim's own entries are seen
    for name in STATE_INDEXES:
        assert running[name] == queued[name], name

    assert store.record_outcomes([Outcome.complete(job) for job in claimed]) == set()
    ended = _pages(engine)
    for name in STATE_INDEXES:
        assert ended[name] > running[name], name
    with engine.connect() as connection:
        states = connection.execute(text("SELECT DISTINCT state FROM pgqueue_jobs")).all()
    assert states == [("succeeded",)]
