"""A row another transaction holds delays the rescue of the jobs that need that row, and only
those: expired leases of other jobs are rescued in the same pass.

A rescue updates more than the job's row: a limited queue's control row (its running count) and,
for a job that ends, the rows of its waiting dependents. An operator's ``SELECT ... FOR UPDATE``
of such a row, or a long transaction of another worker, must not keep every other expired job
RUNNING with nobody working on it."""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, text
from support.locks import wait_for_lock_waiters
from support.polling import wait_until

from pgqueue import JobState, PgQueue
from pgqueue.jobs import ClaimRequest, Outcome
from pgqueue.testing import states_of
from pgqueue.worker.store import WorkerStore

LEASE_EXPIRED = "lease expired (worker lost)"


def test_expired_leases_are_rescued_while_rows_other_jobs_need_are_held(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.task(queue="held", name="limited_job")
    def limited_job() -> None:
        pass

    @pgq.task(queue="free", name="plain_job")
    def plain_job() -> None:
        pass

    @pgq.task(queue="free", name="last_try_job", max_attempts=1)
    def last_try_job() -> None:
        pass

    pgq.set_queue_limit("held", 5)
    limited = limited_job.enqueue()
    plain = plain_job.enqueue()
    last_try = last_try_job.enqueue()
    dependent = plain_job.configure(depends_on=[last_try]).enqueue()
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    claimed = store.claim(
        ClaimRequest(worker_id="test", limit=10, queues=None, lease_seconds=30.0, task_leases={})
    )
    assert sorted(job.id for job in claimed) == sorted([limited, plain, last_try])
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second'")
        )

    with engine.connect() as control_holder, engine.connect() as dependent_holder:
        control_holder.execute(text("SELECT 1 FROM pgqueue_queues WHERE name = 'held' FOR UPDATE"))
        dependent_holder.execute(
            text("SELECT 1 FROM pgqueue_jobs WHERE id = :id FOR UPDATE"), {"id": dependent}
        )
        began = time.monotonic()
        rescued = store.rescue_expired(limit=100, error=LEASE_EXPIRED)
        took = time.monotonic() - began
        held_meanwhile = states_of(pgq, [limited, last_try, dependent])
        control_holder.commit()
        dependent_holder.commit()

    assert rescued == [(plain, JobState.RETRYING.value)]
    assert took < 3.0, took
    assert held_meanwhile == {
        limited: JobState.RUNNING,
        last_try: JobState.RUNNING,
        dependent: JobState.WAITING,
    }

    # Once the rows are free, the next pass rescues the rest, as one pass would have.
    again = store.rescue_expired(limit=100, error=LEASE_EXPIRED)
    assert sorted(again) == sorted(
        [(limited, JobState.RETRYING.value), (last_try, JobState.FAILED.value)]
    )
    assert states_of(pgq, [limited, plain, last_try, dependent]) == {
        limited: JobState.RETRYING,
        plain: JobState.RETRYING,
        last_try: JobState.FAILED,
        dependent: JobState.CANCELLED,
    }
    with engine.connect() as connection:
        running = connection.execute(
            text("SELECT running FROM pgqueue_queues WHERE name = 'held'")
        ).scalar_one()
    assert running == 0


def test_an_outcome_write_that_keeps_trying_lets_go_of_its_job_between_tries(
    pgq: PgQueue, engine: Engine
) -> None:
    """A write that keeps trying (a stopping worker's last one) waits for a held row a bounded
    time per try; between tries its job's row is free, so a rescue is not kept away from it for
    as long as the other transaction holds the row."""

    @pgq.task(name="parent_job")
    def parent_job() -> None:
        pass

    parent = parent_job.enqueue()
    dependent = parent_job.configure(depends_on=[parent]).enqueue()
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    [claimed] = store.claim(
        ClaimRequest(worker_id="test", limit=10, queues=None, lease_seconds=30.0, task_leases={})
    )
    done = Outcome(job_id=parent, lease_token=claimed.lease_token, kind="complete")
    with engine.connect() as holder:
        holder.execute(
            text("SELECT 1 FROM pgqueue_jobs WHERE id = :id FOR UPDATE"), {"id": dependent}
        )
        writer = threading.Thread(target=store.record_outcomes, args=([done],), daemon=True)
        writer.start()
        with engine.connect() as poller:
            wait_for_lock_waiters(engine)  # the write waits for the row

            def parent_free() -> bool:
                got = poller.execute(
                    text("SELECT id FROM pgqueue_jobs WHERE id = :id FOR UPDATE SKIP LOCKED"),
                    {"id": parent},
                ).all()
                poller.rollback()
                return bool(got)

            wait_until(parent_free, 6.0, "the job's row free between the write's tries", 0.005)
        state_meanwhile = states_of(pgq, [parent])[parent]
        holder.commit()
    writer.join(30)
    assert not writer.is_alive()
    assert state_meanwhile is JobState.RUNNING
    assert states_of(pgq, [parent, dependent]) == {
        parent: JobState.SUCCEEDED,
        dependent: JobState.QUEUED,
    }
