"""``ctx.progress(fraction, message)``: kept in memory by the worker, written by the job's next
heartbeat (at most one write per heartbeat interval however often it is called) and with the
attempt's outcome when no heartbeat wrote it; shown by ``get_job``, ``pgqueue show`` and the
dashboard's job page. Each write of a job's progress is counted by a trigger on the real table
(``UPDATE OF progress``: it fires for every statement that sets the column, changed or not)."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.polling import wait_until
from support.processes import shown_as_json
from support.workers import in_thread, wait_for_heartbeats

from pgqueue import JobContext, JobState, PgQueue, Snooze, ValidationError
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.testing import run_until_final, wait_for_states
from pgqueue.worker import Worker

PROGRESS_WRITES = """
CREATE TABLE progress_writes (
    job_id bigint, progress double precision, message text, at timestamptz
);
CREATE FUNCTION log_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO progress_writes VALUES (NEW.id, NEW.progress, NEW.progress_message, clock_timestamp());
    RETURN NEW;
END $$;
CREATE TRIGGER progress_written AFTER UPDATE OF progress ON pgqueue_jobs
    FOR EACH ROW EXECUTE FUNCTION log_progress_write();
"""


@pytest.fixture
def counted(pgq: PgQueue) -> PgQueue:
    with pgq.engine.begin() as connection:
        connection.execute(text(PROGRESS_WRITES))
    return pgq


def writes(pgq: PgQueue, job_id: int) -> list[Any]:
    with pgq.engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT progress, message, at FROM progress_writes WHERE job_id = :id ORDER BY at"
                ),
                {"id": job_id},
            )
        )


def test_hundred_reports_in_one_heartbeat_interval_are_one_write(counted: PgQueue) -> None:
    pgq = counted
    reported = threading.Event()
    finish = threading.Event()

    @pgq.task(name="import_rows", pass_context=True)
    def import_rows(ctx: JobContext) -> None:
        for step in range(1, 101):
            ctx.progress(step / 100, f"row {step} of 100")
        reported.set()
        finish.wait(30)

    job_id = import_rows.enqueue()
    worker = Worker(pgq, concurrency=1, lease_seconds=3.0)  # a heartbeat every second
    with in_thread(worker, before_stop=finish.set):
        assert reported.wait(30)
        # Visible while the job runs, after at most one heartbeat interval (plus slack).
        wait_until(lambda: pgq.get_job(job_id).progress == 1.0, 5, "the heartbeat's write")
        current = pgq.get_job(job_id)
        assert current.state is JobState.RUNNING
        assert current.progress_message == "row 100 of 100"
        assert current.progress_at is not None
        wait_for_heartbeats(pgq, job_id, 2, 10)  # more heartbeats: nothing new to write
        assert [(w.progress, w.message) for w in writes(pgq, job_id)] == [(1.0, "row 100 of 100")]
        finish.set()
        wait_for_states(pgq, [job_id], {JobState.SUCCEEDED}, timeout=30)
    done = pgq.get_job(job_id)
    assert (done.progress, done.progress_message) == (1.0, "row 100 of 100")
    assert len(writes(pgq, job_id)) == 1  # the outcome had nothing new to write


def test_steady_reports_are_written_at_most_once_per_heartbeat_interval(
    counted: PgQueue,
) -> None:
    pgq = counted
    reports = 0

    @pgq.task(name="crunch", pass_context=True)
    def crunch(ctx: JobContext) -> None:
        nonlocal reports
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            reports += 1
            ctx.progress(min(reports / 1000, 1.0))
            time.sleep(0.005)

    job_id = crunch.enqueue()
    worker_options = {"concurrency": 1, "lease_seconds": 3.0}
    assert run_until_final(pgq, [job_id], **worker_options) == {job_id: JobState.SUCCEEDED}
    written = writes(pgq, job_id)
    assert reports > 300
    # About three heartbeats in 3.5 s, plus the outcome's write of the last report.
    assert 2 <= len(written) <= 5, written
    heartbeats = written[:-1]  # the last write may be the outcome's, soon after a heartbeat
    gaps = [(b.at - a.at).total_seconds() for a, b in itertools.pairwise(heartbeats)]
    assert all(gap > 0.7 for gap in gaps), gaps  # heartbeats a second apart, never bursts
    job = pgq.get_job(job_id)
    assert job.progress == written[-1].progress == min(reports / 1000, 1.0)


def test_final_progress_is_written_with_the_outcome_when_no_heartbeat_ran(
    counted: PgQueue, database_url: URL
) -> None:
    pgq = counted

    @pgq.task(name="quick", pass_context=True)
    def quick(ctx: JobContext) -> None:
        ctx.progress(0.5, "halfway")
        ctx.progress(1, "done")

    job_id = quick.enqueue()
    pgq.run_worker(drain=True, concurrency=1, lease_seconds=60.0)  # heartbeat every 20 s
    job = pgq.get_job(job_id)
    assert job.state is JobState.SUCCEEDED
    assert (job.progress, job.progress_message) == (1.0, "done")
    assert job.progress_at is not None and job.progress_at <= job.finished_at
    assert [(w.progress, w.message) for w in writes(pgq, job_id)] == [(1.0, "done")]

    record = shown_as_json(database_url, job_id)
    assert (record["progress"], record["progress_message"]) == (1.0, "done")
    assert record["progress_at"] is not None


def test_progress_goes_with_snooze_failure_and_atomic_outcomes(counted: PgQueue) -> None:
    pgq = counted
    with pgq.engine.begin() as connection:
        connection.execute(text("CREATE TABLE touched (n int)"))

    @pgq.task(name="snoozer", pass_context=True)
    def snoozer(ctx: JobContext) -> None:
        ctx.progress(0.25, "waiting for the partner")
        raise Snooze(3600)

    @pgq.task(name="breaks", pass_context=True, max_attempts=1)
    def breaks(ctx: JobContext) -> None:
        ctx.progress(0.75)
        raise RuntimeError("broke at three quarters")

    @pgq.task(name="atomic_steps", pass_context=True, atomic=True)
    def atomic_steps(ctx: JobContext) -> None:
        ctx.session.execute(text("INSERT INTO touched VALUES (1)"))
        ctx.progress(0.6, "in the claim's transaction")

    snoozed, failed, atomic = snoozer.enqueue(), breaks.enqueue(), atomic_steps.enqueue()
    pgq.run_worker(drain=True, concurrency=3, lease_seconds=60.0)
    job = pgq.get_job(snoozed)
    assert (job.state, job.snoozes, job.progress) == (JobState.QUEUED, 1, 0.25)
    assert job.progress_message == "waiting for the partner"
    job = pgq.get_job(failed)
    assert (job.state, job.progress, job.progress_message) == (JobState.FAILED, 0.75, None)
    job = pgq.get_job(atomic)
    assert (job.state, job.progress) == (JobState.SUCCEEDED, 0.6)
    assert job.progress_message == "in the claim's transaction"


def test_bad_progress_is_a_clear_error_in_the_handler_and_writes_nothing(pgq: PgQueue) -> None:
    refused: list[str] = []

    @pgq.task(name="sloppy", pass_context=True)
    def sloppy(ctx: JobContext) -> None:
        for fraction, message in (
            (1.5, None),
            (-0.1, None),
            (math.nan, None),
            (True, None),
            ("0.5", None),
            (0.5, 42),
        ):
            try:
                ctx.progress(fraction, message)  # type: ignore[arg-type]
            except ValueError as exc:
                assert isinstance(exc, ValidationError)
                refused.append(str(exc))

    job_id = sloppy.enqueue()
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.SUCCEEDED}
    assert refused == [
        "progress must be a number from 0 to 1, got 1.5",
        "progress must be a number from 0 to 1, got -0.1",
        "progress must be a number from 0 to 1, got nan",
        "progress must be a number from 0 to 1, got True",
        "progress must be a number from 0 to 1, got '0.5'",
        "progress message must be a string or None, got int",
    ]
    job = pgq.get_job(job_id)
    assert (job.progress, job.progress_message, job.progress_at) == (None, None, None)


def test_long_or_unstorable_messages_are_cut_and_stored(pgq: PgQueue) -> None:
    @pgq.task(name="chatty", pass_context=True)
    def chatty(ctx: JobContext) -> None:
        ctx.progress(0.1, "nul\x00here " + "é" * 5000)

    job_id = chatty.enqueue()
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.SUCCEEDED}
    message = pgq.get_job(job_id).progress_message
    assert message is not None
    assert message.startswith("nul\\x00here é")
    assert len(message.encode()) <= 1000


app_queue = FlaskPgQueue()
reported_in_app = threading.Event()
finish_in_app = threading.Event()


@app_queue.task(name="dashboard_progress", pass_context=True, queue="shown")
def dashboard_progress(ctx: JobContext) -> None:
    ctx.progress(0.42, "<b>42 of 100</b>")
    reported_in_app.set()
    finish_in_app.wait(30)


@pytest.fixture
def dashboard(database_url: URL) -> Iterator[Any]:
    finish_in_app.clear()
    reported_in_app.clear()
    with dashboard_app(app_queue, database_url, "progress_page") as app:
        yield app
    finish_in_app.set()


def test_dashboard_job_page_shows_progress_and_snoozes(dashboard: Any) -> None:
    queue = app_queue.state(dashboard).queue
    with dashboard.app_context():
        job_id = dashboard_progress.enqueue()
    worker = Worker(queue, queues=["shown"], concurrency=1, lease_seconds=1.5, maintenance=False)
    with in_thread(worker, before_stop=finish_in_app.set):
        assert reported_in_app.wait(30)
        wait_until(lambda: queue.get_job(job_id).progress == 0.42, 5, "the heartbeat's write")
        with queue.engine.begin() as connection:
            connection.execute(
                text("UPDATE pgqueue_jobs SET snoozes = 3 WHERE id = :id"), {"id": job_id}
            )
        page = dashboard.test_client().get(f"/pgqueue/jobs/{job_id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert '<progress max="1" value="0.42"></progress>' in html
    assert '<span class="progress-percent">42%</span>' in html
    assert "&lt;b&gt;42 of 100&lt;/b&gt;" in html  # escaped, never markup
    assert '<dd id="job-snoozes">3 times (not counted as attempts)</dd>' in html
