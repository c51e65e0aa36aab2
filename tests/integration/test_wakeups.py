"""Every statement that inserts tickets wakes idle workers, and nothing else does.

No trigger on the ticket table sends the NOTIFY: each path sends it itself, one per queue,
``queue`` for a ticket due now and ``queue epoch`` (the earliest run_at) for a future one. A
path that forgot would leave idle workers asleep until their next poll, so each one is checked
here on a real ``LISTEN`` connection: enqueue (one job, a batch, COPY, in a caller's
transaction, unique, with dependencies), retry, release, rescue, manual re-run, dependencies
released by an outcome, periodic ticks.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from support.polling import wait_until

from pgqueue import JobState, PgQueue, core
from pgqueue.jobs import ClaimedJob, ClaimRequest, Outcome
from pgqueue.worker.store import WorkerStore


@contextmanager
def listening(engine: Engine) -> Iterator[Callable[[], list[str]]]:
    """A LISTEN connection; the callable returns the payloads received so far (waiting up to
    a second for the first, then taking whatever else is already there)."""
    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue")

        def received() -> list[str]:
            first = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
            if not first:
                return []
            return first + [n.payload for n in listener.notifies(timeout=0.2)]

        yield received


def _epoch_in(payload: str, queue: str, seconds: float) -> bool:
    name, _, epoch = payload.partition(" ")
    return name == queue and abs(float(epoch) - (time.time() + seconds)) < 30


def _store(pgq: PgQueue) -> WorkerStore:
    return WorkerStore(pgq.engine, stopping=threading.Event())


def _claim_one(pgq: PgQueue, job_id: int, lease_seconds: float = 30.0) -> ClaimedJob:
    [claimed] = _store(pgq).claim(
        ClaimRequest(
            worker_id="test", limit=10, queues=None, lease_seconds=lease_seconds, task_leases={}
        )
    )
    assert claimed.id == job_id
    return claimed


@pytest.fixture
def noop(pgq: PgQueue) -> Any:
    @pgq.task(name="noop", queue="q1", max_attempts=1)
    def noop(n: int = 0) -> None:
        return None

    return noop


def test_enqueue_one_job_now_and_delayed(pgq: PgQueue, engine: Engine, noop: Any) -> None:
    with listening(engine) as received:
        noop.enqueue(1)
        assert received() == ["q1"]
        noop.configure(delay=600).enqueue(2)
        [payload] = received()
        assert _epoch_in(payload, "q1", 600)


def test_enqueue_in_the_callers_transaction_wakes_at_commit_only(
    pgq: PgQueue, engine: Engine, noop: Any
) -> None:
    with listening(engine) as received:
        with pgq.sessions() as session:
            noop.configure(session=session).enqueue(1)
            assert received() == []  # not before the commit
            session.rollback()
        assert received() == []  # a rolled-back enqueue wakes nobody
        with pgq.sessions() as session, session.begin():
            noop.configure(session=session).enqueue(2)
        assert received() == ["q1"]


def test_batches_send_one_wakeup_per_queue(pgq: PgQueue, engine: Engine, noop: Any) -> None:
    with listening(engine) as received:
        noop.enqueue_many([{"n": i} for i in range(20)])
        assert received() == ["q1"]
        with pgq.sessions() as session, session.begin():
            noop.configure(queue="q2", session=session).enqueue_many([{"n": 1}])
            noop.configure(queue="q3", delay=300, session=session).enqueue_many([{"n": 2}])
        payloads = received()
        assert len(payloads) == 2 and "q2" in payloads
        assert _epoch_in(next(p for p in payloads if p != "q2"), "q3", 300)


def test_copy_batch_wakes(pgq: PgQueue, engine: Engine, noop: Any) -> None:
    with listening(engine) as received:
        ids = noop.enqueue_many([{"n": i} for i in range(core.COPY_THRESHOLD)])
        assert len(ids) == core.COPY_THRESHOLD
        assert received() == ["q1"]


def test_unique_and_dependent_enqueues(pgq: PgQueue, engine: Engine, noop: Any) -> None:
    with listening(engine) as received:
        noop.configure(unique_key="k").enqueue(1)
        assert received() == ["q1"]
        noop.configure(unique_key="k").enqueue(1)
        assert received() == []  # the duplicate inserted no ticket
        first = noop.enqueue(2)
        assert received() == ["q1"]
        second = noop.configure(depends_on=[first]).enqueue(3)
        assert received() == []  # WAITING: no ticket, no wake-up
    assert pgq.get_job(second).state is JobState.WAITING


def test_outcome_that_releases_a_dependent_wakes(pgq: PgQueue, engine: Engine, noop: Any) -> None:
    first = noop.enqueue(1)
    second = noop.configure(queue="after", depends_on=[first]).enqueue(2)
    claimed = _claim_one(pgq, first)
    with listening(engine) as received:
        _store(pgq).record_outcomes([Outcome(first, claimed.lease_token, "complete")])
        assert received() == ["after"]
    assert pgq.get_job(second).state is JobState.QUEUED


def test_retry_and_release_outcomes_wake(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="flaky", queue="r", max_attempts=3)
    def flaky() -> None:
        return None

    job_id = flaky.enqueue()
    claimed = _claim_one(pgq, job_id)
    with listening(engine) as received:
        _store(pgq).record_outcomes(
            [Outcome(job_id, claimed.lease_token, "retry", error="boom", delay=120.0)]
        )
        [payload] = received()
        assert _epoch_in(payload, "r", 120)
    with engine.begin() as connection:  # make the retry due now
        connection.execute(text("UPDATE pgqueue_message_queue SET run_at = now()"))
    claimed = _claim_one(pgq, job_id)
    with listening(engine) as received:
        _store(pgq).record_outcomes([Outcome(job_id, claimed.lease_token, "release")])
        assert received() == ["r"]


def test_rescue_and_manual_rerun_wake(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="lost", queue="m", max_attempts=1)
    def lost() -> None:
        return None

    rescued, rerun = lost.enqueue(), lost.enqueue()
    _store(pgq).claim(
        ClaimRequest(worker_id="gone", limit=10, queues=None, lease_seconds=0.01, task_leases={})
    )
    with engine.begin() as connection:  # one lease has attempts left, the other fails for good
        connection.execute(
            text("UPDATE pgqueue_jobs SET max_attempts = 2 WHERE id = :id"), {"id": rescued}
        )
    time.sleep(0.05)
    with listening(engine) as received:
        outcome = dict(_store(pgq).rescue_expired(limit=10, error="lease expired"))
        assert outcome == {rescued: JobState.RETRYING.value, rerun: JobState.FAILED.value}
        assert received() == ["m"]
        pgq.retry_job(rerun)
        assert received() == ["m"]


def test_periodic_tick_wakes(pgq: PgQueue, engine: Engine) -> None:
    @pgq.periodic("* * * * * *", name="every_second")  # croniter's 6th field: seconds
    @pgq.task(name="tick", queue="cron")
    def tick() -> None:
        return None

    with listening(engine) as received:
        wait_until(pgq.run_schedules, 5, "a schedule pass to enqueue a tick", 0.1)
        assert received() == ["cron"]


def test_claim_cancel_and_complete_send_nothing(pgq: PgQueue, engine: Engine, noop: Any) -> None:
    first, second = noop.enqueue(1), noop.enqueue(2)
    with listening(engine) as received:
        pgq.cancel_job(second)
        claimed = _claim_one(pgq, first)
        _store(pgq).record_outcomes([Outcome(first, claimed.lease_token, "complete")])
        assert received() == []


def test_delayed_payload_epoch_is_the_tickets_run_at(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="later", queue="later")
    def later() -> None:
        return None

    at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    with listening(engine) as received:
        job_id = later.configure(run_at=at).enqueue()
        [payload] = received()
    with engine.connect() as connection:
        epoch = connection.execute(
            text("SELECT extract(epoch FROM run_at) FROM pgqueue_message_queue WHERE job_id = :id"),
            {"id": job_id},
        ).scalar_one()
    assert payload == f"later {epoch}"
