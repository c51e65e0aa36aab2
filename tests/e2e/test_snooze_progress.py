"""Snooze and progress in a real ``pgqueue worker`` process: a job that snoozes five times then
succeeds has one attempt; a job that reports progress 100 times within one heartbeat interval
is written once (counted by a trigger on the real table), its last value readable while it runs
and after it ended."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from support.workers import wait_for_heartbeats

if TYPE_CHECKING:
    from conftest import App

# Appended to the e2e application module (which has ``pgq``, ``mark``, ``text`` and ``time``).
HANDLERS = """

from pgqueue import Snooze

TAGGED = text("SELECT count(*) FROM ledger WHERE job_id = :job AND tag = :tag")


def tagged(job_id, tag):
    with pgq.handler_engine.connect() as connection:
        return connection.execute(TAGGED, {"job": job_id, "tag": tag}).scalar_one()


@pgq.task(name="e2e_snoozer", pass_context=True, max_attempts=2)
def e2e_snoozer(ctx):
    if tagged(ctx.job_id, "snooze") < 5:
        mark(ctx, "snooze")
        raise Snooze(0.1, reason="partner busy")
    mark(ctx, "done")
    return "done"


@pgq.task(name="e2e_progress", pass_context=True)
def e2e_progress(ctx):
    for step in range(1, 101):
        ctx.progress(step / 100, f"step {step} of 100")
    mark(ctx, "reported")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not tagged(ctx.job_id, "finish"):
        time.sleep(0.05)
"""

PROGRESS_WRITES = """
CREATE TABLE progress_writes (job_id bigint, progress double precision, at timestamptz);
CREATE FUNCTION log_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO progress_writes VALUES (NEW.id, NEW.progress, clock_timestamp());
    RETURN NEW;
END $$;
CREATE TRIGGER progress_written AFTER UPDATE OF progress ON pgqueue_jobs
    FOR EACH ROW EXECUTE FUNCTION log_progress_write();
"""


def test_snoozes_and_progress_in_a_worker_process(app: App) -> None:
    app.execute(PROGRESS_WRITES)
    pgq = app.module.pgq

    @pgq.task(name="e2e_snoozer", pass_context=True)
    def e2e_snoozer(ctx: Any) -> None: ...

    @pgq.task(name="e2e_progress", pass_context=True)
    def e2e_progress(ctx: Any) -> None: ...

    snoozer, reporter = e2e_snoozer.enqueue(), e2e_progress.enqueue()
    with (app.directory / "e2eapp.py").open("a") as module:
        module.write(HANDLERS)
    worker = app.start_worker("--concurrency", "2", lease_seconds=3)  # a heartbeat a second
    app.wait_until(lambda: app.ledger("reported"), 60, "the progress reports", interval=0.05)
    app.wait_until(
        lambda: pgq.get_job(reporter).progress == 1.0, 5, "the heartbeat's write", interval=0.05
    )
    running = pgq.get_job(reporter)
    assert (running.state.value, running.progress_message) == ("running", "step 100 of 100")
    wait_for_heartbeats(pgq, reporter, 2, 10)  # more heartbeats, with nothing new to write
    assert app.scalars("SELECT progress FROM progress_writes WHERE job_id = :id", id=reporter) == [
        1.0
    ]
    app.execute(
        "INSERT INTO ledger (job_id, attempt, tag, pid, info) VALUES (:id, 1, 'finish', 0, '')",
        id=reporter,
    )
    jobs = app.wait_final([snoozer, reporter], 60)
    assert {job_id: job.state for job_id, job in jobs.items()} == {
        snoozer: "succeeded",
        reporter: "succeeded",
    }, worker.log()[-3000:]

    snoozed = pgq.get_job(snoozer)
    assert (snoozed.attempts, snoozed.snoozes, snoozed.result) == (1, 5, "done")
    assert snoozed.errors == []
    assert len(app.ledger("snooze")) == 5
    reported = pgq.get_job(reporter)
    assert (reported.progress, reported.progress_message) == (1.0, "step 100 of 100")
    # One write in all: the heartbeat's; the outcome had nothing newer to write.
    assert app.scalars("SELECT count(*) FROM progress_writes WHERE job_id = :id", id=reporter) == [
        1
    ]
    assert "outcome=snooze" in worker.log()
