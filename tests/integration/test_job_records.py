"""Job records read right: a manual retry stays within the job's maximum attempts (and the
dashboard never shows more attempts than the maximum), a requested ``Retry`` stores its
reason rather than a traceback, and a job that succeeds after failures has no last error
(its failed attempts stay in ``errors``). Leased and atomic tasks alike, on a real
PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask import Flask
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue import JobContext, JobState, PgQueue, Retry
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.testing import run_until_final

dashboard_pgq = FlaskPgQueue()


@dashboard_pgq.task(name="records.noop", queue="records")
def noop() -> None:
    return None


def test_a_manual_retry_of_a_job_out_of_attempts_gives_it_one_more_within_its_maximum(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="records.doomed", max_attempts=2)
    def doomed() -> None:
        raise ValueError("never works")

    job_id = doomed.enqueue()
    run_until_final(pgq, [job_id])
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.max_attempts) == (JobState.FAILED, 2, 2)

    pgq.retry_job(job_id)
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.max_attempts) == (JobState.QUEUED, 2, 3)

    run_until_final(pgq, [job_id])
    job = pgq.get_job(job_id)
    # One more attempt, not retried further: the failure is final at 3 of 3.
    assert (job.state, job.attempts, job.max_attempts) == (JobState.FAILED, 3, 3)
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]


def test_a_manual_retry_of_a_job_cancelled_before_running_keeps_its_maximum(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="records.later", max_attempts=4)
    def later() -> None:
        return None

    job_id = later.configure(delay=3600).enqueue()
    assert pgq.cancel_job(job_id) is JobState.CANCELLED
    pgq.retry_job(job_id)
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.max_attempts) == (JobState.QUEUED, 0, 4)


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_a_requested_retry_stores_its_reason_not_a_traceback(pgq: PgQueue, atomic: bool) -> None:
    @pgq.task(name="records.asks", atomic=atomic, max_attempts=3, pass_context=True)
    def asks(ctx: JobContext, reason: str | None) -> int:
        if ctx.attempt == 1:
            raise Retry(delay=0.1, reason=reason)
        return ctx.attempt

    with_reason = asks.enqueue("gateway busy")
    without = asks.enqueue(None)
    run_until_final(pgq, [with_reason, without])
    errors = {job_id: pgq.get_job(job_id).errors for job_id in (with_reason, without)}
    assert [e["error"] for e in errors[with_reason]] == ["retry requested: gateway busy"]
    assert [e["error"] for e in errors[without]] == ["retry requested"]


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_success_after_failures_clears_last_error_and_keeps_the_history(
    pgq: PgQueue, atomic: bool
) -> None:
    @pgq.task(name="records.flaky", atomic=atomic, max_attempts=3, pass_context=True)
    def flaky(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise RuntimeError("boom on attempt 1")
        return "ok"

    job_id = flaky.enqueue()
    run_until_final(pgq, [job_id])
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.result) == (JobState.SUCCEEDED, 2, "ok")
    assert job.last_error is None
    assert [e["attempt"] for e in job.errors] == [1]
    assert "boom on attempt 1" in job.errors[0]["error"]


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    with dashboard_app(dashboard_pgq, database_url, "job_records") as served:
        yield served


def _set_attempts(engine: Engine, job_id: int, state: str, attempts: int, maximum: int) -> None:
    with engine.begin() as connection:
        connection.execute(
            text("DELETE FROM pgqueue_message_queue WHERE job_id = :id"), {"id": job_id}
        )
        connection.execute(
            text(
                "UPDATE pgqueue_jobs SET state = :state, attempts = :attempts, "
                "max_attempts = :maximum, finished_at = now() WHERE id = :id"
            ),
            {"id": job_id, "state": state, "attempts": attempts, "maximum": maximum},
        )


def test_the_dashboard_never_shows_more_attempts_than_the_maximum(
    app: Flask, engine: Engine
) -> None:
    with app.app_context():
        exhausted, over = noop.enqueue(), noop.enqueue()
    _set_attempts(engine, exhausted, "failed", 5, 5)
    # A row holding more attempts than its maximum (edited by hand, for one).
    _set_attempts(engine, over, "cancelled", 6, 5)
    client = app.test_client()

    page = client.get(f"/pgqueue/jobs/{exhausted}").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None
    response = client.post(f"/pgqueue/jobs/{exhausted}/retry", data={"csrf_token": token[1]})
    assert response.status_code == 302
    assert "5 of 6" in client.get(f"/pgqueue/jobs/{exhausted}").text

    detail = client.get(f"/pgqueue/jobs/{over}").text
    listing = client.get("/pgqueue/jobs?queue=records").text
    assert "6 of 5" not in detail and "6/5" not in listing
    assert "more than its maximum of 5" in detail and "6 (max 5)" in listing
