"""``pgqueue.testing.immediate`` against real PostgreSQL: jobs run in the committing thread right
after their commit, never for a rollback, through the real claim and outcome statements."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from sqlalchemy import URL, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from pgqueue import JobContext, JobState, PgQueue, Settings, Snooze
from pgqueue.errors import ValidationError
from pgqueue.testing import immediate, states_of, table_counts


def test_a_committed_enqueue_has_run_when_commit_returns(pgq: PgQueue) -> None:
    seen: list[tuple[int, str]] = []

    @pgq.task(name="greet")
    def greet(n: int) -> str:
        seen.append((n, threading.current_thread().name))
        return f"hello {n}"

    with immediate(pgq) as mode, pgq.sessions() as session:
        job_id = greet.configure(session=session).enqueue(1)
        assert seen == []  # not before the commit
        session.commit()
        assert seen == [(1, threading.current_thread().name)]
    job = pgq.get_job(job_id)
    assert (job.state, job.result, job.attempts) == (JobState.SUCCEEDED, "hello 1", 1)
    assert [(r.job_id, r.task, r.args, r.state, r.result) for r in mode.runs] == [
        (job_id, greet.name, (1,), JobState.SUCCEEDED, "hello 1")
    ]
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0


def test_a_rolled_back_enqueue_never_runs(pgq: PgQueue) -> None:
    seen: list[int] = []

    @pgq.task(name="greet")
    def greet(n: int) -> None:
        seen.append(n)

    with immediate(pgq) as mode:
        with pgq.sessions() as session:
            greet.configure(session=session).enqueue(1)
            session.rollback()
        with pgq.sessions() as session:
            greet.configure(session=session).enqueue(2)
            session.commit()
    assert seen == [2]
    assert [r.args for r in mode.runs] == [(2,)]
    assert table_counts(pgq.engine)["pgqueue_jobs"] == 1


def test_a_job_of_a_rolled_back_savepoint_never_runs_and_a_released_one_waits_for_the_commit(
    pgq: PgQueue,
) -> None:
    seen: list[int] = []

    @pgq.task(name="greet")
    def greet(n: int) -> None:
        seen.append(n)

    with immediate(pgq), pgq.sessions() as session:
        greet.configure(session=session).enqueue(1)
        savepoint = session.begin_nested()
        greet.configure(session=session).enqueue(2)
        savepoint.rollback()
        with session.begin_nested():
            greet.configure(session=session).enqueue(3)
        assert seen == []  # the savepoint's release is not the commit
        session.commit()
    assert seen == [1, 3]


def test_an_enqueue_in_its_own_transaction_runs_before_enqueue_returns(pgq: PgQueue) -> None:
    seen: list[int] = []

    @pgq.task(name="greet")
    def greet(n: int) -> None:
        seen.append(n)

    with immediate(pgq):
        greet.enqueue(1)
        assert seen == [1]
        greet.enqueue_many([[2], [3]])
        assert seen == [1, 2, 3]
    greet.enqueue(4)  # outside the block: left for a worker
    assert seen == [1, 2, 3]
    assert "insert_jobs" not in vars(pgq)


def test_a_delayed_job_runs_at_once_and_a_paused_queues_job_is_left_for_a_worker(
    pgq: PgQueue,
) -> None:
    seen: list[str] = []

    @pgq.task(name="note")
    def note(text: str) -> None:
        seen.append(text)

    pgq.pause_queue("paused")
    with immediate(pgq) as mode:
        later = note.configure(delay=3600).enqueue("later")
        held = note.configure(queue="paused").enqueue("held")
    assert seen == ["later"]
    assert mode.states() == {later: JobState.SUCCEEDED}
    assert states_of(pgq, [held]) == {held: JobState.QUEUED}


def test_failed_attempts_are_retried_at_once_until_final(pgq: PgQueue) -> None:
    attempts: list[int] = []

    @pgq.task(name="flaky", max_attempts=3, pass_context=True)
    def flaky(ctx: JobContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} failed")
        return "third time lucky"

    @pgq.task(name="broken", max_attempts=2)
    def broken() -> None:
        raise ValueError("always")

    with immediate(pgq) as mode:
        flaky_id = flaky.enqueue()
        broken_id = broken.enqueue()
    assert attempts == [1, 2, 3]
    assert [(r.job_id, r.attempt, r.state) for r in mode.runs] == [
        (flaky_id, 1, JobState.RETRYING),
        (flaky_id, 2, JobState.RETRYING),
        (flaky_id, 3, JobState.SUCCEEDED),
        (broken_id, 1, JobState.RETRYING),
        (broken_id, 2, JobState.FAILED),
    ]
    assert mode.runs[0].error is not None and "RuntimeError: attempt 1 failed" in mode.runs[0].error
    job = pgq.get_job(broken_id)
    assert job.state == JobState.FAILED and "ValueError: always" in (job.last_error or "")


def test_without_retries_a_failed_attempt_stays_retrying(pgq: PgQueue) -> None:
    @pgq.task(name="broken", max_attempts=3)
    def broken() -> None:
        raise ValueError("always")

    with immediate(pgq, retries=False) as mode:
        job_id = broken.enqueue()
    assert [(r.attempt, r.state) for r in mode.runs] == [(1, JobState.RETRYING)]
    assert states_of(pgq, [job_id]) == {job_id: JobState.RETRYING}


def test_atomic_jobs_commit_their_writes_with_their_outcome(pgq: PgQueue) -> None:
    with pgq.engine.begin() as connection:
        connection.execute(text("CREATE TABLE effects (n int PRIMARY KEY)"))

    @pgq.task(name="record", atomic=True, pass_context=True, max_attempts=1)
    def record(ctx: JobContext, n: int, fail: bool) -> None:
        ctx.session.execute(text("INSERT INTO effects VALUES (:n)"), {"n": n})
        if fail:
            raise RuntimeError("no")

    with immediate(pgq) as mode:
        ok = record.enqueue(1, False)
        failed = record.enqueue(2, True)
    assert mode.states() == {ok: JobState.SUCCEEDED, failed: JobState.FAILED}
    with pgq.engine.connect() as connection:
        assert list(connection.execute(text("SELECT n FROM effects"))) == [(1,)]


def test_async_handlers_run_to_completion(pgq: PgQueue) -> None:
    @pgq.task(name="slow_double")
    async def slow_double(n: int) -> int:
        await asyncio.sleep(0.01)
        return n * 2

    with immediate(pgq) as mode:
        slow_double.enqueue(21)
    assert [(r.state, r.result) for r in mode.runs] == [(JobState.SUCCEEDED, 42)]


def test_jobs_enqueued_by_a_job_run_after_it_in_order(pgq: PgQueue) -> None:
    order: list[str] = []

    @pgq.task(name="child")
    def child(name: str) -> None:
        order.append(name)

    @pgq.task(name="parent", pass_context=True)
    def parent(ctx: JobContext) -> None:
        order.append("parent start")
        child.enqueue("own transaction")
        child.configure(session=ctx.session).enqueue("parent's session")
        order.append("parent end")

    with immediate(pgq):
        parent.enqueue()
    assert order == ["parent start", "parent end", "own transaction", "parent's session"]


def test_jobs_enqueued_by_an_async_handler_run_after_it(pgq: PgQueue) -> None:
    order: list[str] = []

    @pgq.task(name="async_child")
    async def async_child(name: str) -> None:
        order.append(name)

    @pgq.task(name="async_parent")
    async def async_parent() -> None:
        order.append("parent")
        async_child.enqueue("child")
        await asyncio.sleep(0)
        order.append("parent end")

    with immediate(pgq) as mode:
        async_parent.enqueue()
    assert order == ["parent", "parent end", "child"]
    assert [r.state for r in mode.runs] == [JobState.SUCCEEDED, JobState.SUCCEEDED]


def test_a_dependent_runs_once_its_parent_finished(pgq: PgQueue) -> None:
    order: list[str] = []

    @pgq.task(name="step")
    def step(name: str, fail: bool = False) -> None:
        order.append(name)
        if fail:
            raise RuntimeError(name)

    with immediate(pgq) as mode, pgq.sessions() as session:
        first = step.configure(session=session).enqueue("first")
        second = step.configure(session=session, depends_on=[first]).enqueue("second")
        doomed = step.configure(session=session, max_attempts=1).enqueue("doomed", fail=True)
        orphan = step.configure(session=session, depends_on=[doomed]).enqueue("orphan")
        session.commit()
    assert order == ["first", "second", "doomed"]
    assert mode.states() == {
        first: JobState.SUCCEEDED,
        second: JobState.SUCCEEDED,
        doomed: JobState.FAILED,
    }
    assert states_of(pgq, [orphan]) == {orphan: JobState.CANCELLED}


def test_a_commit_in_another_thread_runs_its_jobs_in_that_thread(pgq: PgQueue) -> None:
    threads: list[str] = []

    @pgq.task(name="where")
    def where() -> None:
        threads.append(threading.current_thread().name)

    def enqueue() -> None:
        where.enqueue()

    with immediate(pgq):
        other = threading.Thread(target=enqueue, name="committer")
        other.start()
        other.join()
    assert threads == ["committer"]


def test_immediate_refuses_what_is_not_a_queue_and_a_second_block(pgq: PgQueue) -> None:
    with pytest.raises(ValidationError, match=r"expected a pgqueue\.PgQueue, got str"):
        immediate("postgresql://x").__enter__()
    with immediate(pgq), pytest.raises(RuntimeError, match="already on"), immediate(pgq):
        pass  # pragma: no cover
    assert "insert_jobs" not in vars(pgq)


def test_an_async_session_enqueue_runs_when_its_commit_returns_and_never_after_rollback(
    pgq: PgQueue, database_url: URL
) -> None:
    seen: list[int] = []

    @pgq.task(name="greet")
    def greet(n: int) -> str:
        seen.append(n)
        return f"hello {n}"

    async def main() -> tuple[list[int], list[int], int]:
        engine = create_async_engine(database_url.set(drivername="postgresql+psycopg_async"))
        try:
            async with AsyncSession(engine) as session:
                await greet.configure(session=session).aenqueue(1)
                await session.rollback()
            async with AsyncSession(engine) as session:
                committed = await greet.configure(session=session).aenqueue(2)
                before_commit = list(seen)
                await session.commit()
                after_commit = list(seen)
            return before_commit, after_commit, committed
        finally:
            await engine.dispose()
            await pgq.adispose()

    with immediate(pgq) as mode:
        before_commit, after_commit, job_id = asyncio.run(main())
    assert (before_commit, after_commit) == ([], [2])
    assert [(r.job_id, r.args, r.state) for r in mode.runs] == [(job_id, (2,), JobState.SUCCEEDED)]
    assert table_counts(pgq.engine)["pgqueue_jobs"] == 1


def test_an_aenqueue_in_its_own_transaction_has_run_when_it_returns(pgq: PgQueue) -> None:
    seen: list[int] = []

    @pgq.task(name="greet")
    def greet(n: int) -> None:
        seen.append(n)

    async def main() -> tuple[list[int], list[int]]:
        try:
            await greet.aenqueue(1)
            after_one = list(seen)
            await greet.aenqueue_many([(2,), (3,)])
            return after_one, list(seen)
        finally:
            await pgq.adispose()

    with immediate(pgq) as mode:
        after_one, after_many = asyncio.run(main())
    assert (after_one, after_many) == ([1], [1, 2, 3])
    ids = [run.job_id for run in mode.runs]
    assert len(ids) == 3
    assert states_of(pgq, ids) == dict.fromkeys(ids, JobState.SUCCEEDED)


def test_a_snoozed_job_runs_again_at_once_without_using_an_attempt(pgq: PgQueue) -> None:
    runs: list[int] = []

    @pgq.task(name="partner_call", pass_context=True, max_attempts=2)
    def partner_call(ctx: JobContext) -> str:
        runs.append(ctx.attempt)
        if len(runs) <= 3:
            raise Snooze(3600, reason="partner says come back later")
        return "done"

    with immediate(pgq) as mode:
        job_id = partner_call.enqueue()
    assert runs == [1, 1, 1, 1]
    job = pgq.get_job(job_id)
    assert (job.state, job.result, job.attempts, job.snoozes) == (JobState.SUCCEEDED, "done", 1, 3)
    assert [(r.attempt, r.state, r.error) for r in mode.runs] == [
        (1, JobState.QUEUED, None),
        (1, JobState.QUEUED, None),
        (1, JobState.QUEUED, None),
        (1, JobState.SUCCEEDED, None),
    ]
    assert table_counts(pgq.engine)["pgqueue_message_queue"] == 0


def test_a_job_that_keeps_snoozing_ends_failed_after_max_snoozes_and_its_attempts(
    database_url: URL, settings: Settings
) -> None:
    url = database_url.render_as_string(hide_password=False)
    pgq = PgQueue(url, settings=settings.replace(max_snoozes=2))  # two free snoozes

    @pgq.task(name="never_ready", max_attempts=2, atomic=True)
    def never_ready() -> None:
        raise Snooze(60)

    try:
        with immediate(pgq) as mode:
            job_id = never_ready.enqueue()
        assert [(r.attempt, r.state) for r in mode.runs] == [
            (1, JobState.QUEUED),
            (1, JobState.QUEUED),
            (1, JobState.RETRYING),
            (2, JobState.FAILED),
        ]
        past = "Snooze: snooze 3 of this job is past the max_snoozes setting (2)"
        assert mode.runs[2].error is not None and mode.runs[2].error.startswith(past)
        job = pgq.get_job(job_id)
        assert (job.state, job.attempts, job.snoozes) == (JobState.FAILED, 2, 4)
    finally:
        pgq.dispose()


def test_without_retries_a_snoozed_job_stays_queued_until_its_delay(pgq: PgQueue) -> None:
    @pgq.task(name="later")
    def later() -> None:
        raise Snooze(3600)

    with immediate(pgq, retries=False) as mode:
        job_id = later.enqueue()
    assert [(r.attempt, r.state) for r in mode.runs] == [(1, JobState.QUEUED)]
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, job.snoozes) == (JobState.QUEUED, 0, 1)
    assert job.run_at > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=59)
