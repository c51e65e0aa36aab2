"""``raise Snooze(delay)``: the job runs again after ``delay`` without using an attempt, in leased,
atomic and async handlers, written by the batched outcome statement under the lease token, with
the queue's running counter kept right; past the ``max_snoozes`` setting a snooze counts as a
failed attempt (retried, or failed for good on the last attempt). Real worker threads on a real
database; the CLI as a subprocess."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.engine import URL
from support.processes import shown_as_json
from test_explain import explain_lines

from pgqueue import JobContext, JobState, PgQueue, Settings, Snooze, ValidationError
from pgqueue.data import claim as claim_data
from pgqueue.data import outcomes as outcomes_data
from pgqueue.data.claim import LimitsSeen
from pgqueue.db import executor_for
from pgqueue.jobs import Outcome
from pgqueue.models import MessageQueue, QueueControl
from pgqueue.testing import run_until_final, table_counts


@pytest.fixture
def limited(database_url: URL, settings: Settings) -> Iterator[PgQueue]:
    """A queue object whose jobs may snooze twice for free."""
    queue = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=settings.replace(max_snoozes=2),
    )
    yield queue
    queue.dispose()


def test_job_that_snoozes_five_times_then_succeeds_has_one_attempt(pgq: PgQueue) -> None:
    runs: list[int] = []

    @pgq.task(name="partner_call", pass_context=True, max_attempts=2)
    def partner_call(ctx: JobContext) -> str:
        runs.append(ctx.attempt)
        if len(runs) <= 5:
            raise Snooze(0, reason="partner says come back later")
        return "done"

    job_id = partner_call.enqueue()
    assert run_until_final(pgq, [job_id], concurrency=2) == {job_id: JobState.SUCCEEDED}
    job = pgq.get_job(job_id)
    assert (job.attempts, job.snoozes) == (1, 5)
    assert job.result == "done"
    assert job.errors == [] and job.last_error is None
    # Every run was the job's first attempt: the claim's count was given back each time.
    assert runs == [1] * 6
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0


def test_snooze_reschedules_at_now_plus_delay_and_keeps_the_running_counter(
    pgq: PgQueue, database_url: URL
) -> None:
    pgq.set_queue_limit("partner", 5)

    @pgq.task(name="later_please", queue="partner")
    def later_please() -> None:
        raise Snooze(dt.timedelta(minutes=10))

    job_id = later_please.enqueue()
    stats = pgq.run_worker(drain=True, concurrency=1)
    assert (stats.claimed, stats.snoozed, stats.retried) == (1, 1, 0)
    with pgq.engine.connect() as connection:
        now = connection.execute(text("SELECT now()")).scalar_one()
        ticket_run_at = connection.execute(
            select(MessageQueue.run_at).where(MessageQueue.job_id == job_id)
        ).scalar_one()
        running = connection.execute(
            select(QueueControl.running).where(QueueControl.name == "partner")
        ).scalar_one()
    assert running == 0
    job = pgq.get_job(job_id)
    assert job.state is JobState.QUEUED
    assert (job.attempts, job.snoozes) == (0, 1)
    assert job.errors == [] and job.last_error is None and job.finished_at is None
    assert job.lease_token is None
    assert job.run_at == ticket_run_at
    assert dt.timedelta(minutes=9) < ticket_run_at - now <= dt.timedelta(minutes=10)

    lines = explain_lines(job_id, database_url)
    assert lines[1].strip().startswith("scheduled: snoozed 1 time, next run at "), lines
    assert f"{ticket_run_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC" in lines[1]

    assert shown_as_json(database_url, job_id)["snoozes"] == 1


def test_snoozes_past_the_maximum_count_as_failed_attempts(limited: PgQueue) -> None:
    runs: list[int] = []

    @limited.task(name="always_later", pass_context=True, max_attempts=2)
    def always_later(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        raise Snooze(0)

    @limited.task(name="after_it")
    def after_it() -> None: ...

    job_id = always_later.enqueue()
    dependent = after_it.configure(depends_on=[job_id]).enqueue()
    states = run_until_final(limited, [job_id, dependent], concurrency=1)
    assert states == {job_id: JobState.FAILED, dependent: JobState.CANCELLED}
    # Two free snoozes (attempt 1 both times), the third counts as attempt 1 and is retried,
    # the fourth counts as attempt 2, the last: the job fails.
    assert runs == [1, 1, 1, 2]
    job = limited.get_job(job_id)
    assert (job.attempts, job.snoozes) == (2, 4)
    assert [entry["attempt"] for entry in job.errors] == [1, 2]
    assert job.last_error is not None
    assert job.last_error == (
        "Snooze: snooze 4 of this job is past the max_snoozes setting (2), "
        "so it counts as a failed attempt"
    )
    assert job.errors[0]["error"] == (
        "Snooze: snooze 3 of this job is past the max_snoozes setting (2), "
        "so it counts as a failed attempt"
    )
    assert job.finished_at is not None
    assert limited.get_job(dependent).last_error == (f"dependency {job_id} ended failed; not run")


def test_snooze_in_an_atomic_task_rolls_back_its_writes(pgq: PgQueue) -> None:
    with pgq.engine.begin() as connection:
        connection.execute(text("CREATE TABLE charges (run int)"))
    runs: list[int] = []

    @pgq.task(name="atomic_charge", atomic=True, pass_context=True)
    def atomic_charge(ctx: JobContext) -> None:
        runs.append(len(runs) + 1)
        ctx.session.execute(text("INSERT INTO charges VALUES (:run)"), {"run": len(runs)})
        if len(runs) < 3:
            raise Snooze(0)

    job_id = atomic_charge.enqueue()
    assert run_until_final(pgq, [job_id], concurrency=1) == {job_id: JobState.SUCCEEDED}
    with pgq.engine.connect() as connection:
        kept = connection.execute(text("SELECT run FROM charges")).scalars().all()
    assert kept == [3]
    job = pgq.get_job(job_id)
    assert (job.attempts, job.snoozes) == (1, 2)
    assert job.errors == []


def test_snooze_from_an_async_handler(pgq: PgQueue) -> None:
    runs: list[int] = []

    @pgq.task(name="async_later")
    async def async_later() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise Snooze(0.2)
        return "later"

    job_id = async_later.enqueue()
    assert run_until_final(pgq, [job_id], concurrency=2) == {job_id: JobState.SUCCEEDED}
    job = pgq.get_job(job_id)
    assert (job.attempts, job.snoozes, job.result) == (1, 1, "later")


@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (-1, "Snooze delay must be a finite, non-negative number of seconds, got -1"),
        ("5", "Snooze delay must be seconds (a number or timedelta), got '5'"),
        (None, "Snooze needs a delay: seconds (a number) or a timedelta"),
        (float("nan"), "Snooze delay must be a finite, non-negative number of seconds, got nan"),
    ],
)
def test_bad_snooze_delay_is_a_clear_error(delay: Any, message: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Snooze(delay)
    assert str(raised.value) == message


def test_bad_snooze_delay_in_a_handler_is_an_ordinary_failed_attempt(pgq: PgQueue) -> None:
    @pgq.task(name="bad_snooze", max_attempts=1)
    def bad_snooze() -> None:
        raise Snooze(-5)

    job_id = bad_snooze.enqueue()
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert (job.attempts, job.snoozes) == (1, 0)
    assert job.last_error is not None
    assert "ValidationError: Snooze delay must be a finite, non-negative" in job.last_error


def _claim(pgq: PgQueue, count: int) -> list[Any]:
    with pgq.sessions() as session, session.begin():
        return claim_data.claim(
            executor_for(session),
            worker_id="test-claimer",
            limit=count,
            queues=None,
            lease_seconds=600.0,
            task_leases={},
            limits=LimitsSeen(),
        )


def test_snoozes_are_batched_with_other_outcomes_and_fenced_by_the_lease(pgq: PgQueue) -> None:
    @pgq.task(name="batched")
    def batched() -> None: ...

    ids = [batched.enqueue() for _ in range(5)]
    claimed = sorted(_claim(pgq, 5), key=lambda job: job.id)
    assert [job.id for job in claimed] == ids
    stale = claimed[4]
    stale.lease_token = str(uuid.uuid4())  # as if its lease had been lost to another worker
    outcomes = [
        Outcome.complete(claimed[0]),
        Outcome.snooze(claimed[1], 60.0, 100),
        Outcome.snooze(claimed[2], 60.0, 100),
        Outcome.snooze(claimed[3], 60.0, 100),
        Outcome.snooze(stale, 60.0, 100),
    ]
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(pgq.engine, "before_cursor_execute", count)
    try:
        with pgq.sessions() as session, session.begin():
            lost = outcomes_data.record_outcomes(executor_for(session), outcomes)
    finally:
        event.remove(pgq.engine, "before_cursor_execute", count)
    assert lost == {stale.id}
    # The row lock, one complete, ONE snooze for the four: no statement per job.
    assert len(statements) == 3, statements
    states = {job_id: pgq.get_job(job_id) for job_id in ids}
    assert states[ids[0]].state is JobState.SUCCEEDED
    for job_id in ids[1:4]:
        assert (states[job_id].state, states[job_id].attempts) == (JobState.QUEUED, 0)
        assert states[job_id].snoozes == 1
    # The fenced one is untouched: still RUNNING under the real lease, its attempt counted.
    assert (states[stale.id].state, states[stale.id].attempts) == (JobState.RUNNING, 1)
    assert states[stale.id].snoozes == 0
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 3
