"""``pgqueue.testing``'s assertions and ``run_jobs`` against real PostgreSQL."""

from __future__ import annotations

import pytest

from pgqueue import JobContext, JobState, PgQueue, Retry, Snooze
from pgqueue.errors import SerializationError, ValidationError
from pgqueue.testing import (
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
    run_jobs,
)


def test_arguments_match_by_meaning_and_only_those_given(pgq: PgQueue) -> None:
    @pgq.task(name="ship", pass_context=True)
    def ship(ctx: JobContext, order_id: int, items: list[str], express: bool = False) -> None:
        del ctx

    first = ship.enqueue(1, ["tea", "mug"])
    ship.configure(priority=5).enqueue(order_id=1, items=["pen"], express=True)
    assert assert_enqueued(ship, order_id=1).job_id == first  # the oldest of the two
    assert assert_enqueued(ship, 1, ["tea", "mug"], False).job_id == first
    with pytest.raises(SerializationError, match="args\\[0\\] is a tuple"):
        assert_enqueued(ship, ("tea", "mug"))  # checked as an enqueue checks it
    assert assert_enqueued(ship, express=True).priority == 5
    assert_not_enqueued(ship, order_id=2)
    with pytest.raises(ValidationError, match=r"ship\(color='red'\) does not fit the signature"):
        assert_enqueued(ship, color="red")


def test_failures_say_what_is_enqueued(pgq: PgQueue) -> None:
    @pgq.task(name="ping")
    def ping(n: int) -> None:
        del n

    with pytest.raises(AssertionError) as nothing:
        assert_enqueued(ping, 1)
    assert str(nothing.value) == "no job ping(1) is enqueued; no job is enqueued at all"
    first, second = ping.enqueue(1), ping.enqueue(n=1)
    with pytest.raises(AssertionError) as twice:
        assert_not_enqueued(ping, n=1)
    assert str(twice.value) == (
        f"2 job(s) ping(n=1) enqueued: #{first} ping(1) queued, #{second} ping(n=1) queued"
    )


def test_finished_jobs_are_not_enqueued_and_run_jobs_reports_each_attempt(pgq: PgQueue) -> None:
    @pgq.task(name="twice", pass_context=True, max_attempts=3)
    def twice(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise Retry(delay=0, reason="once more")
        return ctx.attempt

    @pgq.task(name="later")
    def later() -> None:
        pass

    job_id = twice.enqueue()
    waiting = later.configure(delay=3600).enqueue()
    runs = run_jobs(pgq)
    assert [(r.job_id, r.task, r.attempt, r.state, r.result) for r in runs] == [
        (job_id, "twice", 1, JobState.RETRYING, None),
        (job_id, "twice", 2, JobState.SUCCEEDED, 2),
    ]
    assert runs[0].error == "retry requested: once more"
    assert_not_enqueued(twice)
    assert [job.job_id for job in enqueued_jobs(pgq)] == [waiting]  # not due: not run
    assert run_jobs(pgq) == []


def test_enqueued_jobs_reads_every_page(pgq: PgQueue) -> None:
    @pgq.task(name="many")
    def many(n: int) -> None:
        del n

    ids = many.enqueue_many([[n] for n in range(1500)])
    listed = enqueued_jobs(pgq, "many")
    assert [job.job_id for job in listed] == ids
    assert enqueued_jobs(pgq, many)[-1].args == (1499,)


def test_run_jobs_numbers_attempts_across_snoozes(pgq: PgQueue) -> None:
    pgq.settings = pgq.settings.replace(max_snoozes=2)
    calls: list[int] = []

    @pgq.task(name="patient", pass_context=True, max_attempts=2)
    def patient(ctx: JobContext) -> int:
        calls.append(ctx.attempt)
        if len(calls) < 4:
            raise Snooze(0)
        return len(calls)

    job_id = patient.enqueue()
    runs = run_jobs(pgq)
    # Two free snoozes keep attempt 1; the third is past max_snoozes and counts as attempt 1's
    # failure; attempt 2 succeeds.
    assert [(r.job_id, r.attempt, r.state) for r in runs] == [
        (job_id, 1, JobState.QUEUED),
        (job_id, 1, JobState.QUEUED),
        (job_id, 1, JobState.RETRYING),
        (job_id, 2, JobState.SUCCEEDED),
    ]
    assert calls == [1, 1, 1, 2]
