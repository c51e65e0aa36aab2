"""Failure paths around dependencies and the maintenance loop.

- An outcome and the settling of its job's dependents commit together: if settling fails, the
  outcome is not recorded either, so a dependent can never be stranded WAITING behind a
  dependency that already ended (the worker retries the outcome, or the lease expires and the
  job runs again).
- Each maintenance duty is guarded on its own: a scheduler pass that fails does not stop the
  same pass from rescuing expired leases.
- A limited queue's running counter that drifted (rows changed behind pgqueue's back) is
  recounted by the maintenance loop instead of holding the queue at its limit for good.

Failures are injected with real PostgreSQL triggers, not mocks.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, PgQueue, Settings
from pgqueue.jobs import ClaimedJob, ClaimRequest, Outcome
from pgqueue.testing import states_of
from pgqueue.worker import Worker
from pgqueue.worker.store import WorkerStore

REFUSE_UNBLOCK = """
CREATE FUNCTION refuse_unblock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'injected: settling dependents fails';
END $$;
CREATE TRIGGER refuse_unblock BEFORE UPDATE ON pgqueue_jobs FOR EACH ROW
    WHEN (OLD.state = 'waiting') EXECUTE FUNCTION refuse_unblock();
"""


def _execute(engine: Engine, sql: str) -> None:
    with engine.begin() as connection:
        connection.execute(text(sql))


def _running_with_dependent(pgq: PgQueue, max_attempts: int) -> tuple[WorkerStore, ClaimedJob, int]:
    """A claimed (RUNNING) job, a WAITING job depending on it, and the store that claimed it."""

    @pgq.task(name="step", max_attempts=max_attempts)
    def step() -> None:
        pass

    first = step.enqueue()
    second = step.configure(depends_on=[first]).enqueue()
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    [claimed] = store.claim(
        ClaimRequest(worker_id="test", limit=10, queues=None, lease_seconds=30.0, task_leases={})
    )
    assert claimed.id == first
    return store, claimed, second


def test_outcome_and_settling_dependents_commit_together(pgq: PgQueue, engine: Engine) -> None:
    store, claimed, second = _running_with_dependent(pgq, max_attempts=3)
    first = claimed.id
    done = Outcome(job_id=first, lease_token=claimed.lease_token, kind="complete")

    _execute(engine, REFUSE_UNBLOCK)
    with pytest.raises(DBAPIError, match="injected: settling dependents fails"):
        store.record_outcomes([done])
    # Nothing half-done: the outcome rolled back with the failed settle, the lease still holds.
    assert states_of(pgq, [first, second]) == {first: JobState.RUNNING, second: JobState.WAITING}

    _execute(engine, "DROP TRIGGER refuse_unblock ON pgqueue_jobs")
    assert store.record_outcomes([done]) == set()
    assert states_of(pgq, [first, second]) == {first: JobState.SUCCEEDED, second: JobState.QUEUED}


def test_rescue_and_settling_dependents_commit_together(pgq: PgQueue, engine: Engine) -> None:
    store, claimed, second = _running_with_dependent(pgq, max_attempts=1)
    first = claimed.id
    _execute(
        engine,
        f"UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = {first}",
    )
    # Out of attempts: the rescue fails the job for good, which must cancel its dependent.
    _execute(engine, REFUSE_UNBLOCK)
    with pytest.raises(DBAPIError, match="injected"):
        store.rescue_expired(limit=100, error="lease expired (worker lost)")
    assert states_of(pgq, [first, second]) == {first: JobState.RUNNING, second: JobState.WAITING}

    _execute(engine, "DROP TRIGGER refuse_unblock ON pgqueue_jobs")
    assert store.rescue_expired(limit=100, error="lease expired (worker lost)") == [
        (first, JobState.FAILED.value)
    ]
    assert states_of(pgq, [first, second]) == {
        first: JobState.FAILED,
        second: JobState.CANCELLED,
    }


def test_a_failing_scheduler_pass_does_not_stop_rescue(
    pgq: PgQueue, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    @pgq.task(name="tick")
    def tick() -> None:
        pass

    pgq.periodic("* * * * * *", name="every_second")(tick)  # croniter's 6th field: seconds

    @pgq.task(name="stranded", max_attempts=3)
    def stranded() -> None:
        pass

    lost = stranded.enqueue()
    store = WorkerStore(pgq.engine, stopping=threading.Event())
    store.claim(
        ClaimRequest(worker_id="gone", limit=1, queues=None, lease_seconds=30.0, task_leases={})
    )
    _execute(
        engine,
        f"UPDATE pgqueue_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = {lost}",
    )
    # Every scheduler pass now fails in the database (it reads its ticks table first).
    _execute(engine, "ALTER TABLE pgqueue_periodic_ticks RENAME TO moved_away")
    # A worker on another queue: only its maintenance loop can touch the lost job.
    worker = Worker(pgq, queues=["elsewhere"], concurrency=1)
    with in_thread(worker):
        wait_until(
            lambda: states_of(pgq, [lost])[lost] == JobState.RETRYING,
            30,
            "the expired lease to be rescued",
            0.1,
        )
    messages = [r.getMessage() for r in caplog.records]
    failures = [i for i, m in enumerate(messages) if "schedule pass failed" in m]
    rescues = [i for i, m in enumerate(messages) if m.startswith("rescued 1 jobs")]
    # The scheduler failed in every pass, the first one included; rescue still ran.
    assert failures and rescues and failures[0] < rescues[0], messages
    assert worker.stats.rescued == 1


def test_a_drifted_queue_limit_counter_is_repaired(
    database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    pgq = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.2, rescue_interval=0.2, prune_interval=0.5),
    )
    try:

        @pgq.task(queue="reports", name="report")
        def report(n: int) -> int:
            return n

        pgq.set_queue_limit("reports", 2)
        ids = report.enqueue_many([[i] for i in range(5)])
        # As if two running jobs had been deleted by hand: the counter says the queue is full.
        with pgq.engine.begin() as connection:
            connection.execute(text("UPDATE pgqueue_queues SET running = 2"))
        store = WorkerStore(pgq.engine, stopping=threading.Event())
        claim = {"limit": 5, "queues": ["reports"], "lease_seconds": 30.0, "task_leases": {}}
        # Held at its (false) limit.
        assert store.claim(ClaimRequest(worker_id="probe", **claim)) == []

        worker = Worker(pgq, queues=["reports"], concurrency=2)
        with in_thread(worker):
            wait_until(
                lambda: set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED},
                30,
                "every report to succeed",
                0.1,
            )
        assert "queue reports: running count corrected to 0" in caplog.text
        assert pgq.admin.queue_settings()["reports"].running == 0
        # A correct counter is left alone.
        assert store.recount_running() == {}
    finally:
        pgq.dispose()
