"""Durable sleep and signals inside a handler (``ctx.sleep``, ``ctx.wait_for_signal``,
``pgq.signal``) on real PostgreSQL with real worker threads: a suspended job holds no slot, no
lease and no attempt, resumes from the top with its steps replayed, gets its signal however the
signal and the wait are ordered, times out with ``SignalTimeout``, can be cancelled, survives a
worker restart, and ``explain`` says what it waits for. Bad signals are refused before any SQL.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import URL
from support.polling import wait_until
from support.roles import app_role, as_role  # noqa: F401  (app_role: a fixture)
from support.workers import in_thread
from test_explain import explain_lines

from pgqueue import (
    InvalidStateTransition,
    JobContext,
    JobNotFound,
    JobState,
    PayloadTooLarge,
    PgQueue,
    Settings,
    SignalTimeout,
    ValidationError,
    Worker,
    migrations,
)
from pgqueue.data import claim as claim_data
from pgqueue.data import outcomes as outcomes_data
from pgqueue.data.claim import LimitsSeen
from pgqueue.db import executor_for
from pgqueue.errors import DowngradeLosesData
from pgqueue.jobs import Outcome
from pgqueue.testing import immediate, table_counts

WAIT = 30.0


def suspended(pgq: PgQueue, job_id: int) -> bool:
    """The job is QUEUED by a suspension (its ticket's wake time in the future)."""
    with pgq.engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT j.state, m.run_at > now() FROM pgqueue_jobs j "
                "JOIN pgqueue_message_queue m ON m.job_id = j.id "
                "JOIN pgqueue_job_suspensions s ON s.job_id = j.id AND s.suspended_at = "
                "j.updated_at WHERE j.id = :id"
            ),
            {"id": job_id},
        ).one_or_none()
    return row is not None and row[0] == JobState.QUEUED.value and bool(row[1])


def ticket_delay(engine: Engine, job_id: int) -> float | None:
    with engine.connect() as connection:
        return connection.execute(
            text(
                "SELECT extract(epoch FROM run_at - now())::float FROM pgqueue_message_queue "
                "WHERE job_id = :id"
            ),
            {"id": job_id},
        ).scalar_one_or_none()


def step_names(engine: Engine, job_id: int) -> list[tuple[str, Any]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT name, result FROM pgqueue_job_steps WHERE job_id = :id ORDER BY name"),
            {"id": job_id},
        ).all()
    return [(row[0], row[1]) for row in rows]


def signal_rows(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM pgqueue_job_signals")).scalar())


def test_sleep_frees_the_slot_resumes_later_and_uses_no_attempt(pgq: PgQueue) -> None:
    calls: Counter[str] = Counter()
    order: list[str] = []

    def charge() -> str:
        calls["charge"] += 1
        return "ch_1"

    @pgq.task(name="sleeper", pass_context=True, max_attempts=1)
    def sleeper(ctx: JobContext) -> list[Any]:
        calls["runs"] += 1
        charged = ctx.step("charge", charge)
        ctx.sleep(1.5)
        order.append("sleeper woke")
        return [charged, ctx.attempt]

    @pgq.task(name="quick")
    def quick() -> None:
        order.append("quick ran")

    # The queue's limit of one running job is given back too, not only the worker's slot.
    pgq.set_queue_limit("default", 1)
    started = time.monotonic()
    job_id = sleeper.enqueue()
    with in_thread(Worker(pgq, concurrency=1)) as worker:
        wait_until(lambda: suspended(pgq, job_id), WAIT, "the sleeper is suspended")
        job = pgq.get_job(job_id)
        assert (job.state, job.attempts, job.lease_token) == (JobState.QUEUED, 0, None)
        # The only slot is free: another job runs while the first sleeps.
        quick_id = quick.enqueue()
        assert pgq.wait_for(quick_id, timeout=WAIT).state is JobState.SUCCEEDED
        assert order == ["quick ran"]
        done = pgq.wait_for(job_id, timeout=WAIT)
        assert worker.stats.suspended == 1
    assert time.monotonic() - started >= 1.5
    assert done.state is JobState.SUCCEEDED
    # Two runs of the handler, one attempt, the step before the sleep run once.
    assert (done.result, done.attempts) == (["ch_1", 1], 1)
    assert (calls["runs"], calls["charge"]) == (2, 1)
    assert order == ["quick ran", "sleeper woke"]
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0


@pytest.mark.slow
def test_signal_wakes_a_waiting_job_with_its_payload(pgq: PgQueue, database_url: URL) -> None:
    runs: list[int] = []

    @pgq.task(name="approval", pass_context=True)
    def approval(ctx: JobContext, order_id: int) -> dict[str, Any]:
        runs.append(ctx.attempt)
        decision = ctx.wait_for_signal("approved", timeout=86400)
        return {"order": order_id, "decision": decision}

    @pgq.task(name="quick")
    def quick() -> None: ...

    job_id = approval.enqueue(7)
    with in_thread(Worker(pgq, concurrency=1)):
        wait_until(lambda: suspended(pgq, job_id), WAIT, "the job waits for its signal")
        delay = ticket_delay(pgq.engine, job_id)
        assert delay is not None and 86000 < delay <= 86400
        # No slot held while it waits.
        assert pgq.wait_for(quick.enqueue(), timeout=WAIT).state is JobState.SUCCEEDED

        explained = pgq.explain_job(job_id)
        assert [b.kind.value for b in explained.blockers][:1] == ["suspended"]
        assert explained.blockers[0].data["signal"] == "approved"
        lines = explain_lines(job_id, database_url)
        assert "waiting for signal 'approved' (ctx.wait_for_signal) until " in lines[1], lines

        sent = time.monotonic()
        assert pgq.signal(job_id, "approved", {"by": "ana"}) is True
        done = pgq.wait_for(job_id, timeout=WAIT)
        assert time.monotonic() - sent < 10  # woken by the signal, not by its deadline
    assert done.state is JobState.SUCCEEDED
    assert done.result == {"order": 7, "decision": {"by": "ana"}}
    assert (done.attempts, runs) == (1, [1, 1])


def test_an_async_handler_waits_and_resumes_with_asignal(pgq: PgQueue) -> None:
    @pgq.task(name="async_waits", pass_context=True, max_attempts=1)
    async def async_waits(ctx: JobContext) -> Any:
        await asyncio.sleep(0)
        return ctx.wait_for_signal("go", timeout=3600)

    job_id = async_waits.enqueue()
    with in_thread(Worker(pgq, concurrency=1)):
        wait_until(lambda: suspended(pgq, job_id), WAIT, "the async handler waits for its signal")
        assert asyncio.run(pgq.asignal(job_id, "go", [1, 2])) is True
        done = pgq.wait_for(job_id, timeout=WAIT)
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, [1, 2], 1)


def test_async_handlers_sleep_and_wait_with_asleep_and_await_signal(pgq: PgQueue) -> None:
    @pgq.task(name="async_sleeps_then_waits", pass_context=True, max_attempts=1)
    async def async_sleeps_then_waits(ctx: JobContext) -> Any:
        runs = await ctx.astep("count", lambda: 1)
        await ctx.asleep(0.3)
        payload = await ctx.await_signal("go", timeout=3600)
        return [runs, payload]

    job_id = async_sleeps_then_waits.enqueue()
    with in_thread(Worker(pgq, concurrency=1)):
        wait_until(
            lambda: suspended(pgq, job_id) and (ticket_delay(pgq.engine, job_id) or 0) > 60,
            WAIT,
            "the async handler slept, then waits for its signal",
        )
        assert pgq.signal(job_id, "go", {"by": "ana"}) is True
        done = pgq.wait_for(job_id, timeout=WAIT)
    assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, [1, {"by": "ana"}], 1)
    assert sorted(name for name, _ in step_names(pgq.engine, job_id)) == [
        "count",
        "pgqueue:signal:go",
        "pgqueue:sleep:1",
    ]


def test_async_waits_refuse_an_atomic_task(pgq: PgQueue) -> None:
    @pgq.task(name="atomic_async_sleeps", pass_context=True, atomic=True, max_attempts=1)
    async def atomic_async_sleeps(ctx: JobContext) -> None:
        await ctx.asleep(1)

    job_id = atomic_async_sleeps.enqueue()
    with in_thread(Worker(pgq, concurrency=1)):
        done = pgq.wait_for(job_id, timeout=WAIT)
    assert done.state is JobState.FAILED
    assert "ctx.asleep in atomic task 'atomic_async_sleeps'" in (done.last_error or "")


def test_a_signal_sent_before_the_wait_is_returned_at_once_and_the_first_one_wins(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="early", pass_context=True)
    def early(ctx: JobContext) -> Any:
        return ctx.wait_for_signal("go", timeout=60)

    job_id = early.enqueue()
    assert pgq.signal(job_id, "go", 7) is True
    assert pgq.signal(job_id, "go", 8) is False
    stats = pgq.run_worker(drain=True, concurrency=1)
    assert (stats.succeeded, stats.suspended) == (1, 0)
    assert pgq.get_job(job_id).result == 7


def test_a_signal_sent_while_the_job_is_being_suspended_still_wakes_it(pgq: PgQueue) -> None:
    """The signal committed after the handler looked for it and before its suspension was
    written: the suspension's own statement finds it and moves the ticket to now."""

    @pgq.task(name="raced")
    def raced() -> None: ...

    job_id = raced.enqueue()
    with pgq.sessions() as session, session.begin():
        [claimed] = claim_data.claim(
            executor_for(session),
            worker_id="test-claimer",
            limit=1,
            queues=None,
            lease_seconds=600.0,
            task_leases={},
            limits=LimitsSeen(),
        )
    assert pgq.signal(job_id, "go", "now") is True  # finds the job RUNNING: stored only
    with pgq.engine.connect() as connection:
        now = connection.execute(text("SELECT extract(epoch FROM now())::float")).scalar_one()
    with pgq.sessions() as session, session.begin():
        lost = outcomes_data.record_outcomes(
            executor_for(session), [Outcome.suspend(claimed, now + 3600, "go")]
        )
    assert lost == set()
    delay = ticket_delay(pgq.engine, job_id)
    assert delay is not None and delay <= 0
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)


def test_a_signal_in_a_rolled_back_session_does_nothing(pgq: PgQueue) -> None:
    @pgq.task(name="held", pass_context=True)
    def held(ctx: JobContext) -> Any:
        return ctx.wait_for_signal("approved", timeout=3600)

    job_id = held.enqueue()
    with in_thread(Worker(pgq, concurrency=1)):
        wait_until(lambda: suspended(pgq, job_id), WAIT, "the job waits for its signal")
        with pgq.sessions() as session:
            assert pgq.signal(job_id, "approved", "yes", session=session) is True
            session.rollback()
        assert signal_rows(pgq.engine) == 0
        time.sleep(0.5)
        assert suspended(pgq, job_id)
        assert pgq.get_job(job_id).state is JobState.QUEUED
        # Committed in the caller's session, it wakes the job.
        with pgq.sessions() as session, session.begin():
            assert pgq.signal(job_id, "approved", "yes", session=session) is True
        assert pgq.wait_for(job_id, timeout=WAIT).result == "yes"


def test_a_wait_past_its_timeout_raises_signal_timeout(pgq: PgQueue) -> None:
    @pgq.task(name="patient", pass_context=True, max_attempts=1)
    def patient(ctx: JobContext) -> str:
        try:
            ctx.wait_for_signal("approved", timeout=0.5)
        except SignalTimeout as exc:
            assert (exc.job_id, exc.signal, exc.timeout) == (ctx.job_id, "approved", 0.5)
            return str(exc)
        return "signalled"

    @pgq.task(name="impatient", pass_context=True, max_attempts=1)
    def impatient(ctx: JobContext) -> None:
        ctx.wait_for_signal("approved", timeout=dt.timedelta(seconds=0.5))

    caught, uncaught = patient.enqueue(), impatient.enqueue()
    with in_thread(Worker(pgq, concurrency=2)):
        first = pgq.wait_for(caught, timeout=WAIT)
        second = pgq.wait_for(uncaught, timeout=WAIT)
    assert first.state is JobState.SUCCEEDED
    assert first.result == f"job {caught} waited 0.5 s for signal 'approved'"
    assert second.state is JobState.FAILED and second.attempts == 1
    assert second.last_error is not None
    assert f"SignalTimeout: job {uncaught} waited 0.5 s for signal 'approved'" in (
        second.last_error
    )
    # Too late: the job finished, nothing waits for the signal any more.
    with pytest.raises(InvalidStateTransition, match="it has succeeded"):
        pgq.signal(caught, "approved")


def test_a_suspended_job_can_be_cancelled(pgq: PgQueue) -> None:
    @pgq.task(name="cancelled_while_waiting", pass_context=True)
    def waiting(ctx: JobContext) -> None:
        ctx.wait_for_signal("never", timeout=3600)

    @pgq.task(name="cancelled_while_sleeping", pass_context=True)
    def sleeping(ctx: JobContext) -> None:
        ctx.sleep(3600)

    ids = [waiting.enqueue(), sleeping.enqueue()]
    with in_thread(Worker(pgq, concurrency=2)):
        for job_id in ids:
            wait_until(lambda job_id=job_id: suspended(pgq, job_id), WAIT, "the job is suspended")
        [sleeping_blocker] = [
            b for b in pgq.explain_job(ids[1]).blockers if b.kind.value == "suspended"
        ]
        assert sleeping_blocker.message.startswith("sleeping (ctx.sleep) until ")
        assert sleeping_blocker.data["signal"] is None
        assert 3500 < sleeping_blocker.data["seconds"] <= 3600
        for job_id in ids:
            assert pgq.cancel_job(job_id) is JobState.CANCELLED
    assert {pgq.get_job(job_id).state for job_id in ids} == {JobState.CANCELLED}
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0
    with pytest.raises(InvalidStateTransition, match="was cancelled"):
        pgq.signal(ids[0], "never")


def test_a_worker_restart_while_jobs_are_suspended_loses_nothing(pgq: PgQueue) -> None:
    calls: Counter[str] = Counter()

    @pgq.task(name="restart_wait", pass_context=True)
    def restart_wait(ctx: JobContext) -> Any:
        ctx.step("before", lambda: calls.update(["before wait"]))
        return ctx.wait_for_signal("go", timeout=3600)

    @pgq.task(name="restart_sleep", pass_context=True)
    def restart_sleep(ctx: JobContext) -> str:
        ctx.step("before", lambda: calls.update(["before sleep"]))
        ctx.sleep(2)
        return "rested"

    waiting, sleeping = restart_wait.enqueue(), restart_sleep.enqueue()
    with in_thread(Worker(pgq, concurrency=2)):
        for job_id in (waiting, sleeping):
            wait_until(lambda job_id=job_id: suspended(pgq, job_id), WAIT, "the job is suspended")
    # No worker runs now: the signal is stored and waits with the job.
    assert pgq.signal(waiting, "go", {"n": 1}) is True
    with in_thread(Worker(pgq, concurrency=2)):
        first = pgq.wait_for(waiting, timeout=WAIT)
        second = pgq.wait_for(sleeping, timeout=WAIT)
    assert (first.state, first.result, first.attempts) == (JobState.SUCCEEDED, {"n": 1}, 1)
    assert (second.state, second.result, second.attempts) == (JobState.SUCCEEDED, "rested", 1)
    assert calls == Counter({"before wait": 1, "before sleep": 1})


def test_bad_signals_are_refused_before_anything_is_written(pgq: PgQueue) -> None:
    @pgq.task(name="target")
    def target() -> None: ...

    job_id = target.enqueue()
    too_big = "x" * (pgq.settings.max_payload_bytes + 1)
    for bad_id in (0, -1, "1", True, None):
        with pytest.raises(ValidationError, match="job id must be a positive int"):
            pgq.signal(bad_id, "go")  # type: ignore[arg-type]
    for bad_name, why in [
        ("", "must not be empty"),
        ("x" * 201, "longer than 200"),
        ("a\x00b", "control characters"),
        (5, "must be a string"),
    ]:
        with pytest.raises(ValidationError, match=why):
            pgq.signal(job_id, bad_name)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="payload of signal 'go'"):
        pgq.signal(job_id, "go", object())
    with pytest.raises(PayloadTooLarge, match="payload of signal 'go' is larger than"):
        pgq.signal(job_id, "go", too_big)
    with pytest.raises(JobNotFound, match=f"no job with id {job_id + 1000}"):
        pgq.signal(job_id + 1000, "go")
    assert signal_rows(pgq.engine) == 0


def test_bad_waits_fail_the_attempt_naming_the_problem(pgq: PgQueue) -> None:
    @pgq.task(name="bad_wait", pass_context=True, max_attempts=1)
    def bad_wait(ctx: JobContext) -> None:
        ctx.wait_for_signal("", timeout=60)

    @pgq.task(name="atomic_sleep", pass_context=True, atomic=True, max_attempts=1)
    def atomic_sleep(ctx: JobContext) -> None:
        ctx.sleep(1)

    @pgq.task(name="negative_sleep", pass_context=True, max_attempts=1)
    def negative_sleep(ctx: JobContext) -> None:
        ctx.sleep(-1)

    @pgq.task(name="reserved_step", pass_context=True, max_attempts=1)
    def reserved_step(ctx: JobContext) -> None:
        ctx.step("pgqueue:sleep:1", lambda: None)

    others = [
        bad_wait.enqueue(),
        atomic_sleep.enqueue(),
        reserved_step.enqueue(),
        negative_sleep.enqueue(),
    ]
    pgq.run_worker(drain=True, concurrency=1)
    errors = [pgq.get_job(other).last_error or "" for other in others]
    assert "signal name must not be empty" in errors[0]
    assert "ctx.sleep in atomic task 'atomic_sleep'" in errors[1]
    assert "starts with 'pgqueue:'" in errors[2]
    assert "sleep must be a finite, non-negative number of seconds, got -1" in errors[3]
    assert {pgq.get_job(other).state for other in others} == {JobState.FAILED}


def test_sleep_and_signal_with_dml_rights_only(
    database_url: URL,
    app_role: str,  # noqa: F811
) -> None:
    pgq = PgQueue(
        as_role(database_url, app_role).render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.1, rescue_interval=0.2),
    )

    @pgq.task(name="lp.suspends", pass_context=True)
    def suspends(ctx: JobContext) -> Any:
        ctx.sleep(0.2)
        return ctx.wait_for_signal("go", timeout=3600)

    try:
        job_id = suspends.enqueue()
        with in_thread(Worker(pgq, concurrency=1)):
            wait_until(
                lambda: pgq.explain_job(job_id).blockers[0].data.get("signal") == "go",
                WAIT,
                "the job waits for its signal",
            )
            assert pgq.signal(job_id, "go", "ok") is True
            done = pgq.wait_for(job_id, timeout=WAIT)
        assert (done.state, done.result, done.attempts) == (JobState.SUCCEEDED, "ok", 1)
    finally:
        pgq.dispose()


def test_migration_0021_goes_both_ways_with_jobs_and_signals_present(
    empty_database_url: URL,
) -> None:
    engine = create_engine(empty_database_url)
    pgq = PgQueue(
        empty_database_url.render_as_string(hide_password=False),
        settings=Settings(poll_interval=0.1),
    )

    @pgq.task(name="m.waits", pass_context=True)
    def waits(ctx: JobContext) -> Any:
        return ctx.wait_for_signal("go", timeout=3600)

    @pgq.task(name="m.plain")
    def plain(n: int) -> int:
        return n

    try:
        with engine.begin() as connection:
            migrations.upgrade(connection, "pgqueue_0020")
        before = [plain.enqueue(n) for n in range(3)]
        with engine.begin() as connection:
            migrations.upgrade(connection, "pgqueue_0021")
        waiting = waits.enqueue()
        with in_thread(Worker(pgq, concurrency=1)):
            wait_until(lambda: suspended(pgq, waiting), WAIT, "the job waits for its signal")
        assert pgq.signal(waiting, "go", 1) is True
        # The signal and the suspension are data a downgrade would drop: refused unless asked.
        with (
            engine.begin() as connection,
            pytest.raises(DowngradeLosesData, match="pgqueue_job_signals"),
        ):
            migrations.downgrade(connection, "pgqueue_0020", refuse_data_loss=True)
        with engine.begin() as connection:
            migrations.downgrade(connection, "pgqueue_0020")
            tables = set(inspect(connection).get_table_names())
            assert not {"pgqueue_job_signals", "pgqueue_job_suspensions"} & tables
            migrations.upgrade(connection)
        pgq.run_worker(drain=True)
        assert [pgq.get_job(i).result for i in before] == [0, 1, 2]
        # Its signal went with the downgrade; sent again, it still resumes the job.
        assert pgq.signal(waiting, "go", 2) is True
        with in_thread(Worker(pgq, concurrency=1)):
            assert pgq.wait_for(waiting, timeout=WAIT).result == 2
    finally:
        pgq.dispose()
        engine.dispose()


def test_immediate_mode_leaves_a_suspended_job_for_a_worker(pgq: PgQueue) -> None:
    @pgq.task(name="im.waits", pass_context=True)
    def waits(ctx: JobContext) -> Any:
        return ctx.wait_for_signal("go", timeout=3600)

    done = threading.Event()
    modes: list[Any] = []

    def run() -> None:
        with immediate(pgq) as mode:
            modes.append(mode)
            waits.enqueue()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(WAIT), "immediate mode kept running the suspended job"
    [run_record] = modes[0].runs
    assert (run_record.state, run_record.attempt) == (JobState.QUEUED, 1)
    assert suspended(pgq, run_record.job_id)
    assert pgq.signal(run_record.job_id, "go", "later") is True
    with in_thread(Worker(pgq, concurrency=1)):
        assert pgq.wait_for(run_record.job_id, timeout=WAIT).result == "later"


def test_a_signal_never_waits_for_a_ticket_another_transaction_holds(pgq: PgQueue) -> None:
    """A claim or a cancel takes the ticket first and the job's row next; the signal holds the
    job's row, so waiting for the ticket could deadlock. It skips a held ticket instead: the
    payload is stored, and the job's run (here: at its deadline) returns it."""

    @pgq.task(name="held_ticket", pass_context=True)
    def held_ticket(ctx: JobContext) -> Any:
        return ctx.wait_for_signal("go", timeout=3)

    job_id = held_ticket.enqueue()
    with in_thread(Worker(pgq, concurrency=1)):
        wait_until(lambda: suspended(pgq, job_id), WAIT, "the job waits for its signal")
        with pgq.engine.connect() as holder, holder.begin():
            holder.execute(
                text("SELECT 1 FROM pgqueue_message_queue WHERE job_id = :id FOR UPDATE"),
                {"id": job_id},
            )
            with ThreadPoolExecutor(1) as pool:
                sent = pool.submit(pgq.signal, job_id, "go", "held")
                assert sent.result(timeout=10) is True
        assert pgq.wait_for(job_id, timeout=WAIT).result == "held"
