"""Bounded queues on real PostgreSQL: ``set_queue_max_depth`` and ``QueueFull``.

Many threads (and many coroutines of one event loop) race to enqueue into a queue of depth 100,
each in a transaction of its own that also writes a row of the application's, and commit
whether or not ``QueueFull`` was raised: exactly 100 jobs exist, every other call raised, and
every application row is there. Each transaction stays open a few milliseconds after its
enqueue, so without the queue's lock held to the end of the transaction the counts of the
others would not see its job and the queue would overflow. Also: a batch that does not fit
writes nothing (the unnest INSERT and the COPY path alike), the bound frees as jobs leave
waiting, a bound set after an enqueuer last looked is enforced, the bound can be removed, bad
input writes nothing, and ``explain`` reports the bound.

A plan with no parents, roles or dependencies (``enqueue_many``'s) costs one statement, counted
through SQLAlchemy's ``before_cursor_execute``, however its keys fall: one whose key is held adds
the lookup of its holder, whose id comes back in that job's place (the others' in the plan's
order, though the rows go in in key order). The statement's guard stops at a bound this process
has not seen (set by another): a batch that does not fit raises ``QueueFull`` with nothing
written, one that fits goes in through the queue's lock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Engine, create_engine, event, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from pgqueue import (
    ConfigurationError,
    Job,
    JobState,
    MessageQueue,
    PgQueue,
    QueueFull,
    Settings,
    Task,
    ValidationError,
)
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.data import enqueue as enqueue_data
from pgqueue.data.insert_choice import COPY_THRESHOLD
from pgqueue.db import ConnectionExecutor
from pgqueue.explain import BlockerKind
from pgqueue.jobs import NewJob, Plan
from pgqueue.scheduler import Scheduler

DEPTH = 100
THREADS = 20
ATTEMPTS_PER_THREAD = 8
# How long each racing transaction stays open after its enqueue: long enough that, without the
# lock, other enqueuers count while its job is still uncommitted.
HOLD_SECONDS = 0.005


@pytest.fixture
def host(database_url: URL) -> Iterator[Engine]:
    """The application's engine, with a table of its own."""
    engine = create_engine(database_url, pool_size=THREADS, max_overflow=5)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE markers (id serial PRIMARY KEY, who text)"))
    yield engine
    engine.dispose()


@pytest.fixture
def report(pgq: PgQueue) -> Task[[int], None]:
    """A task of the queue the tests bound, ``reports``."""

    @pgq.task(name="report", queue="reports")
    def report(n: int) -> None:
        pass

    return report


@pytest.fixture
def other(database_url: URL, settings: Settings) -> Iterator[PgQueue]:
    """A second PgQueue on the same database: another process's view."""
    queue = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    yield queue
    queue.dispose()


def counts(engine: Engine, queue: str) -> tuple[int, int, int]:
    """(jobs of ``queue``, their tickets, application markers)."""
    with engine.connect() as connection:
        jobs = connection.scalar(select(func.count()).where(Job.queue == queue)) or 0
        tickets = connection.scalar(select(func.count()).where(MessageQueue.queue == queue)) or 0
        markers = connection.scalar(text("SELECT count(*) FROM markers")) or 0
    return jobs, tickets, markers


def test_twenty_threads_fill_a_bounded_queue_exactly_and_lose_no_other_write(
    pgq: PgQueue, host: Engine, report: Task[[int], None]
) -> None:
    pgq.set_queue_max_depth("reports", DEPTH)
    start = threading.Barrier(THREADS)
    full: list[QueueFull] = []
    enqueued: list[int] = []
    failures: list[BaseException] = []

    def enqueuer(thread: int) -> None:
        try:
            start.wait()
            for attempt in range(ATTEMPTS_PER_THREAD):
                with Session(host) as session, session.begin():
                    who = f"{thread}/{attempt}"
                    session.execute(text("INSERT INTO markers (who) VALUES (:who)"), {"who": who})
                    try:
                        enqueued.append(report.configure(session=session).enqueue(thread))
                    except QueueFull as exc:
                        full.append(exc)
                    time.sleep(HOLD_SECONDS)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=enqueuer, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    attempts = THREADS * ATTEMPTS_PER_THREAD
    assert counts(host, "reports") == (DEPTH, DEPTH, attempts)
    assert len(enqueued) == DEPTH
    assert len(full) == attempts - DEPTH
    assert {(e.queue, e.max_depth, e.depth, e.asked) for e in full} == {
        ("reports", DEPTH, DEPTH, 1)
    }
    assert str(full[0]) == (
        "queue 'reports' is full: 100 of at most 100 waiting jobs, 1 more asked for"
    )


@pytest.mark.slow
def test_coroutines_of_one_event_loop_fill_a_bounded_queue_exactly(
    pgq: PgQueue, host: Engine, database_url: URL, report: Task[[int], None]
) -> None:
    pgq.set_queue_max_depth("reports", DEPTH)
    coroutines, attempts_each = 40, 4

    async def main() -> tuple[int, int]:
        engine = create_async_engine(
            database_url.set(drivername="postgresql+psycopg_async"), pool_size=coroutines
        )
        done = full = 0

        async def enqueuer(n: int) -> None:
            nonlocal done, full
            for attempt in range(attempts_each):
                async with AsyncSession(engine) as session, session.begin():
                    marker = text("INSERT INTO markers (who) VALUES (:who)")
                    await session.execute(marker, {"who": f"{n}/{attempt}"})
                    try:
                        await report.configure(session=session).aenqueue(n)
                        done += 1
                    except QueueFull:
                        full += 1
                    await asyncio.sleep(HOLD_SECONDS)

        try:
            await asyncio.gather(*(enqueuer(n) for n in range(coroutines)))
            # pgqueue's own asyncio units of work (no session), single and batch, once full.
            with pytest.raises(QueueFull):
                await report.aenqueue(0)
            with pytest.raises(QueueFull):
                await report.aenqueue_many([[1], [2]])
        finally:
            await engine.dispose()
            await pgq.adispose()
        return done, full

    done, full = asyncio.run(main())
    attempts = coroutines * attempts_each
    assert (done, full) == (DEPTH, attempts - DEPTH)
    assert counts(host, "reports") == (DEPTH, DEPTH, attempts)


def test_a_batch_that_does_not_fit_writes_nothing(
    pgq: PgQueue, host: Engine, report: Task[[int], None]
) -> None:
    pgq.set_queue_max_depth("reports", 10)
    assert len(report.enqueue_many([[n] for n in range(8)])) == 8
    with pytest.raises(QueueFull) as raised:
        report.enqueue_many([[n] for n in range(3)])
    assert (raised.value.depth, raised.value.asked, raised.value.max_depth) == (8, 3, 10)
    assert counts(host, "reports")[:2] == (8, 8)
    # In the caller's transaction: the refused batch leaves the caller's own write in place.
    with Session(host) as session, session.begin():
        session.execute(text("INSERT INTO markers (who) VALUES ('caller')"))
        with pytest.raises(QueueFull):
            report.configure(session=session).enqueue_many([[n] for n in range(5)])
        assert len(report.configure(session=session).enqueue_many([[1], [2]])) == 2
    assert counts(host, "reports") == (10, 10, 1)
    with pytest.raises(QueueFull):
        report.enqueue(11)
    assert counts(host, "reports")[:2] == (10, 10)


def test_a_large_batch_on_the_copy_path_is_checked_too(
    pgq: PgQueue, other: PgQueue, host: Engine, report: Task[[int], None]
) -> None:
    assert pgq.database.uses_driver  # the COPY path is taken where nothing watches statements
    # Set by another process: this PgQueue has not seen the bound, so its COPY path meets it.
    other.set_queue_max_depth("reports", COPY_THRESHOLD + 500)
    first = report.enqueue_many([[n] for n in range(COPY_THRESHOLD)])
    assert len(first) == COPY_THRESHOLD
    with pytest.raises(QueueFull) as raised:
        report.enqueue_many([[n] for n in range(COPY_THRESHOLD)])
    assert raised.value.asked == COPY_THRESHOLD
    assert counts(host, "reports")[:2] == (COPY_THRESHOLD, COPY_THRESHOLD)
    other.set_queue_max_depth("reports", None)
    report.enqueue_many([[n] for n in range(COPY_THRESHOLD)])  # through the lock: unbounded now
    report.enqueue_many([[n] for n in range(COPY_THRESHOLD)])  # COPY again
    assert counts(host, "reports")[:2] == (3 * COPY_THRESHOLD, 3 * COPY_THRESHOLD)


def test_the_plain_inserts_write_nothing_into_a_bounded_queue(pgq: PgQueue, host: Engine) -> None:
    """The guard of the one-row insert, the one insert that does not read the bounds first: it
    is what catches a bound set after an enqueuer last looked."""
    pgq.set_queue_max_depth("reports", 5)
    job = NewJob("t", "reports", "[]", "{}", 0, 3, None, None, None, False)
    with pgq.engine.begin() as connection:
        executor = ConnectionExecutor(connection)
        assert enqueue_data.insert_one_job(executor, job) is None
    assert counts(host, "reports")[:2] == (0, 0)


def test_the_bound_frees_as_jobs_leave_waiting(
    pgq: PgQueue, host: Engine, report: Task[[int], None]
) -> None:
    pgq.set_queue_max_depth("reports", 3)
    ids = [report.enqueue(n) for n in range(3)]
    with pytest.raises(QueueFull):
        report.enqueue(3)
    assert pgq.cancel_job(ids[0]) is JobState.CANCELLED
    fourth = report.enqueue(4)
    assert pgq.admin.delete_job(ids[1])
    report.enqueue(5)
    with pytest.raises(QueueFull):
        report.enqueue(6)
    # A job waiting on a dependency counts; claimed and finished jobs do not.
    pgq.run_worker(queues=["reports"], concurrency=2, drain=True)
    assert pgq.get_job(fourth).state is JobState.SUCCEEDED
    first = report.enqueue(7)
    report.configure(depends_on=[first]).enqueue(8)
    report.enqueue(9)
    with pytest.raises(QueueFull) as raised:
        report.enqueue(10)
    assert raised.value.depth == 3
    pgq.run_worker(queues=["reports"], concurrency=2, drain=True)
    assert len(report.enqueue_many([[n] for n in range(3)])) == 3


def test_a_bound_set_after_a_process_looked_is_enforced_and_removable(
    pgq: PgQueue, other: PgQueue, host: Engine, report: Task[[int], None]
) -> None:
    report.enqueue(0)  # this process has enqueued into the queue while it was unbounded
    other.set_queue_max_depth("reports", 3)
    report.enqueue(1)
    with Session(host) as session, session.begin():
        report.configure(session=session).enqueue(2)
    with pytest.raises(QueueFull):
        report.enqueue(3)
    assert pgq.admin.queue_settings()["reports"].max_depth == 3
    other.set_queue_max_depth("reports", None)  # this process still believes it bounded
    report.enqueue(3)
    report.enqueue_many([[4], [5]])
    assert counts(host, "reports")[:2] == (6, 6)
    assert pgq.admin.queue_settings()["reports"].max_depth is None


def test_a_bounded_queue_refuses_repeatable_read_and_the_transaction_stays_usable(
    pgq: PgQueue, host: Engine, report: Task[[int], None]
) -> None:
    pgq.set_queue_max_depth("reports", 3)
    repeatable = host.execution_options(isolation_level="REPEATABLE READ")
    with Session(repeatable) as session, session.begin():
        session.execute(text("INSERT INTO markers (who) VALUES ('caller')"))
        with pytest.raises(ConfigurationError, match="READ COMMITTED or SERIALIZABLE"):
            report.configure(session=session).enqueue(1)
    serializable = host.execution_options(isolation_level="SERIALIZABLE")
    with Session(serializable) as session, session.begin():
        report.configure(session=session).enqueue(2)
    assert counts(host, "reports") == (1, 1, 1)


@pytest.mark.parametrize(
    ("queue", "max_depth", "on_full", "problem"),
    [
        ("reports", 0, "reject", "max_depth must be a positive int or None, got 0"),
        ("reports", -5, "reject", "max_depth must be a positive int or None, got -5"),
        ("reports", 2.5, "reject", "max_depth must be a positive int or None, got 2.5"),
        ("reports", True, "reject", "max_depth must be a positive int or None, got True"),
        ("reports", "10", "reject", "max_depth must be a positive int or None, got '10'"),
        ("reports", 2**31, "reject", "max_depth must be at most 2147483647, got 2147483648"),
        ("reports", 10, "drop", "on_full must be 'reject' (the only mode), got 'drop'"),
        ("", 10, "reject", "queue name '' has characters outside"),
        ("bad queue", 10, "reject", "queue name 'bad queue' has characters outside"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    pgq: PgQueue, queue: Any, max_depth: Any, on_full: Any, problem: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        pgq.set_queue_max_depth(queue, max_depth, on_full=on_full)
    message = str(raised.value)
    assert "\n" not in message
    assert problem in message
    assert pgq.admin.queue_settings() == {}


def test_explain_reports_the_bound_and_the_depth(pgq: PgQueue, report: Task[[int], None]) -> None:
    pgq.set_queue_max_depth("reports", 2)
    job_id = report.enqueue(1)
    last = pgq.explain_job(job_id).blockers[-1]
    assert last.kind is BlockerKind.BOUNDED
    assert last.data == {"queue": "reports", "max_depth": 2, "depth": 1, "full": False}
    report.enqueue(2)
    last = pgq.explain_job(job_id).blockers[-1]
    assert last.data["full"] is True
    assert "bounded at 2 waiting jobs and holds 2 now" in last.message
    kinds = pgq.explain_job(job_id).kinds
    assert kinds.count(BlockerKind.BOUNDED) == 1 and BlockerKind.NO_LIVE_WORKER in kinds


def test_a_flask_request_catches_queue_full_and_commits_its_own_write(database_url: URL) -> None:
    """Flask's request session: the enqueue joins ``db.session``; a full queue raises in the
    view, which still commits the order. The Queues page shows the bound."""
    db = SQLAlchemy()
    flask_pgq = FlaskPgQueue(db=db)

    @flask_pgq.task(name="mail.send", queue="mail")
    def send(order: int) -> None:
        pass

    app = Flask("bounded")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url.render_as_string(hide_password=False),
        SECRET_KEY="test-secret",
    )
    db.init_app(app)
    flask_pgq.init_app(app)
    init_dashboard(app, public=True)

    @app.post("/orders/<int:order>")
    def create_order(order: int) -> str:
        db.session.execute(text("INSERT INTO markers (who) VALUES (:who)"), {"who": str(order)})
        try:
            send.enqueue(order)
            answer = "queued"
        except QueueFull:
            answer = "full"
        db.session.commit()
        return answer

    try:
        with app.app_context():
            db.session.execute(text("CREATE TABLE markers (id serial PRIMARY KEY, who text)"))
            db.session.commit()
        queue = flask_pgq.state(app).queue
        queue.set_queue_max_depth("mail", 1)
        client = app.test_client()
        assert client.post("/orders/1").text == "queued"
        assert client.post("/orders/2").text == "full"
        with app.app_context():
            assert counts(db.engine, "mail") == (1, 1, 2)
        page = client.get("/pgqueue/queues").text
        assert '<td class="num max-depth">1</td>' in page
    finally:
        flask_pgq.state(app).queue.dispose()
        with app.app_context():
            db.engine.dispose()


def test_a_periodic_tick_into_a_full_queue_waits_for_room_and_others_still_run(
    pgq: PgQueue, caplog: pytest.LogCaptureFixture
) -> None:
    @pgq.periodic("* * * * *", name="bounded_tick")
    @pgq.task(name="tick", queue="reports")
    def tick() -> None:
        pass

    @pgq.periodic("* * * * *", name="free_tick")
    @pgq.task(name="free")
    def free() -> None:
        pass

    pgq.set_queue_max_depth("reports", 1)
    filler = tick.enqueue()
    now = [dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.UTC)]
    scheduler = Scheduler(pgq.sessions, pgq.schedules, clock=lambda: now[0])
    assert scheduler.run_pending() == []  # first sight: nothing is replayed
    now[0] += dt.timedelta(minutes=1)
    with caplog.at_level(logging.WARNING, logger="pgqueue.scheduler"):
        created = scheduler.run_pending()
    assert [pgq.get_job(i).task_name for i in created] == ["free"]
    assert (
        "schedule bounded_tick: tick 2026-01-01 12:01:00+00:00 not enqueued: queue 'reports'"
        in (caplog.text)
    )
    pgq.cancel_job(filler)
    created = scheduler.run_pending()
    assert [pgq.get_job(i).task_name for i in created] == ["tick"]


# -- a plan with no parents, roles or dependencies (enqueue_many's) is one statement ----------


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """The statements sent on ``engine`` meanwhile (a listener also keeps the driver path off,
    so every statement passes through SQLAlchemy)."""
    sent: list[str] = []

    def record(*args: object) -> None:
        sent.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def written(pgq: PgQueue, queue: str) -> tuple[int, int]:
    """(jobs of ``queue``, their tickets)."""
    with pgq.engine.connect() as connection:
        jobs = connection.scalar(select(func.count()).where(Job.queue == queue)) or 0
        tickets = connection.scalar(select(func.count()).where(MessageQueue.queue == queue)) or 0
    return jobs, tickets


def test_enqueue_many_of_plain_jobs_is_one_statement(
    pgq: PgQueue, report: Task[[int], None]
) -> None:
    with statements(pgq.engine) as sent:
        ids = report.enqueue_many([[n] for n in range(10)])
    assert len(sent) == 1, sent
    with pgq.engine.connect() as connection:
        args = dict(connection.execute(select(Job.id, Job.args).where(Job.id.in_(ids))).all())
    assert [args[i] for i in ids] == [[n] for n in range(10)]
    assert written(pgq, "reports") == (10, 10)


def test_a_plain_plan_of_keyed_jobs_is_one_statement_and_a_held_key_adds_its_lookup(
    pgq: PgQueue,
) -> None:
    def job(n: int, key: str | None) -> NewJob:
        return NewJob("t", "keyed", f"[{n}]", "{}", 0, 3, None, None, key, False)

    with statements(pgq.engine) as sent, pgq.engine.begin() as connection:
        first = enqueue_data.write(ConnectionExecutor(connection), Plan([job(0, "b"), job(9, "d")]))
    assert len(sent) == 1, sent
    holder = first.ids[0]
    # The keys out of the plan's order.
    plan = Plan([job(1, "c"), job(2, None), job(3, "b"), job(4, "a")])
    with statements(pgq.engine) as sent, pgq.engine.begin() as connection:
        ids = enqueue_data.write(ConnectionExecutor(connection), plan).ids
    assert len(sent) == 2, sent
    assert ids[2] == holder
    with pgq.engine.connect() as connection:
        args = dict(connection.execute(select(Job.id, Job.args).where(Job.id.in_(ids))).all())
    assert [args[i] for i in ids] == [[1], [2], [0], [4]]
    assert ids[0] < ids[1] < ids[3]
    assert written(pgq, "keyed") == (5, 5)


def test_the_guard_of_a_plain_plan_stops_at_a_bound_this_process_has_not_seen(
    pgq: PgQueue, other: PgQueue, report: Task[[int], None]
) -> None:
    other.set_queue_max_depth("reports", 5)
    with pytest.raises(QueueFull) as raised:
        report.enqueue_many([[n] for n in range(6)])
    assert (raised.value.depth, raised.value.asked, raised.value.max_depth) == (0, 6, 5)
    assert written(pgq, "reports") == (0, 0)
    other.set_queue_max_depth("reports", None)
    report.enqueue_many([[0]])  # unbounded, as this process now learns
    other.set_queue_max_depth("reports", 5)
    ids = report.enqueue_many([[n] for n in range(4)])
    assert len(ids) == len(set(ids)) == 4
    assert written(pgq, "reports") == (5, 5)
    with pytest.raises(QueueFull):
        report.enqueue_many([[n] for n in range(2)])
    assert written(pgq, "reports") == (5, 5)
