"""Transactional enqueue, retries with backoff, atomic tasks, delays, bad input, manual retry,
unknown tasks. All against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from pgqueue import (
    ConfigurationError,
    JobContext,
    JobState,
    PgQueue,
    PgQueueError,
    Retry,
    SerializationError,
    Settings,
    ValidationError,
    backoff,
    embedded,
)
from pgqueue.db import executor_for
from pgqueue.errors import InvalidStateTransition, JobNotFound
from pgqueue.testing import run_until_final, table_counts

ledger_metadata = MetaData()
ledger = Table("ledger", ledger_metadata, Column("job_id", Integer, nullable=False))
orders = Table("orders", ledger_metadata, Column("id", Integer, primary_key=True))


@pytest.fixture
def app_tables(engine: object) -> None:
    ledger_metadata.create_all(engine)  # type: ignore[arg-type]


# Transactions of one enqueue each, rolled back then committed: enough for eight threads to
# claim them concurrently.
ENQUEUES = 300


@pytest.mark.slow
def test_transactional_enqueue_rollback_and_commit(pgq: PgQueue, engine, app_tables) -> None:
    runs: list[int] = []
    lock = threading.Lock()

    @pgq.task(name="record")
    def record(n: int) -> None:
        with lock:
            runs.append(n)

    for n in range(ENQUEUES):
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=n))
            record.configure(session=session).enqueue(n)
            session.rollback()
    assert table_counts(engine) == {"pgqueue_jobs": 0, "pgqueue_message_queue": 0}
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(orders)).scalar_one() == 0
    stats = pgq.run_worker(concurrency=4, drain=True)
    assert stats.claimed == 0 and runs == []

    committed: list[int] = []
    for n in range(ENQUEUES):
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=n))
            committed.append(record.configure(session=session).enqueue(n))
    stats = pgq.run_worker(concurrency=8, drain=True)
    assert stats.succeeded == ENQUEUES
    assert sorted(runs) == list(range(ENQUEUES))
    assert len(set(committed)) == ENQUEUES


def test_enqueue_returns_ids_and_results_round_trip(pgq: PgQueue) -> None:
    @pgq.task(name="add")
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    single = add.enqueue(1, b=2)
    many = add.enqueue_many([{"a": 1, "b": 1}, [2, 3], {"a": 10, "b": -4}])
    assert isinstance(single, int) and len(many) == 3 and many == sorted(many)
    run_until_final(pgq, [single, *many])
    results = [pgq.get_job(i).result for i in (single, *many)]
    assert results == [{"sum": 3}, {"sum": 2}, {"sum": 5}, {"sum": 6}]
    job = pgq.get_job(single)
    assert job.state is JobState.SUCCEEDED and job.attempts == 1
    assert job.started_at is not None and job.finished_at is not None
    assert job.lease_token is None and job.args == [1] and job.kwargs == {"b": 2}


def test_failing_twice_then_succeeding_clears_last_error_and_keeps_the_history(
    pgq: PgQueue,
) -> None:
    attempts: list[int] = []

    @pgq.task(name="flaky", retry=backoff.constant(0.1), max_attempts=5, pass_context=True)
    def flaky(ctx: JobContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"boom on attempt {ctx.attempt}")
        return "ok"

    job_id = flaky.enqueue()
    run_until_final(pgq, [job_id])
    job = pgq.get_job(job_id)
    assert job.state is JobState.SUCCEEDED
    assert job.attempts == 3 and attempts == [1, 2, 3]
    assert job.result == "ok"
    assert job.last_error is None
    assert [e["attempt"] for e in job.errors] == [1, 2]
    assert "boom on attempt 2" in job.errors[1]["error"]
    assert "Traceback" in job.errors[0]["error"]


def test_always_failing_task_fails_after_max_attempts_with_backoff_gaps(
    pgq: PgQueue, engine
) -> None:
    @pgq.task(name="doomed", retry=backoff.linear(0.5), max_attempts=3)
    def doomed() -> None:
        raise ValueError("never works")

    job_id = doomed.enqueue()
    run_until_final(pgq, [job_id], timeout=30)
    job = pgq.get_job(job_id)
    assert job.state is JobState.FAILED and job.attempts == 3
    assert "never works" in (job.last_error or "")
    # Gaps between attempts by the database clock: linear(0.5) -> 0.5 s after attempt 1, 1.0 s
    # after attempt 2. The errors' timestamps are when each attempt failed; the next attempt's
    # start cannot precede failure time + delay.
    failures = [dt.datetime.fromisoformat(e["at"]) for e in job.errors]
    assert len(failures) == 3
    gap1 = (failures[1] - failures[0]).total_seconds()
    gap2 = (failures[2] - failures[1]).total_seconds()
    assert gap1 >= 0.5 and gap2 >= 1.0
    assert gap1 < 0.5 + 2.0 and gap2 < 1.0 + 2.0  # run within a poll interval or so of run_at

    # retry_job makes it run again (once more: the attempt count is kept, the maximum raised)
    pgq.retry_job(job_id)
    assert pgq.get_job(job_id).state is JobState.QUEUED
    run_until_final(pgq, [job_id])
    again = pgq.get_job(job_id)
    assert again.state is JobState.FAILED and again.attempts == 4
    assert again.max_attempts == 4


def test_retry_job_refuses_jobs_that_did_not_fail(pgq: PgQueue) -> None:
    @pgq.task(name="fine")
    def fine() -> int:
        return 1

    job_id = fine.enqueue()
    run_until_final(pgq, [job_id])
    with pytest.raises(InvalidStateTransition, match="it has succeeded"):
        pgq.retry_job(job_id)
    assert pgq.get_job(job_id).state is JobState.SUCCEEDED


def test_retry_exception_sets_delay(pgq: PgQueue) -> None:
    @pgq.task(name="later", max_attempts=2, pass_context=True)
    def later(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise Retry(delay=0.3)
        return ctx.attempt

    job_id = later.enqueue()
    run_until_final(pgq, [job_id])
    job = pgq.get_job(job_id)
    assert job.state is JobState.SUCCEEDED and job.result == 2


def test_atomic_task_commits_with_the_job_or_not_at_all(pgq: PgQueue, engine, app_tables) -> None:
    @pgq.task(
        name="atomic_write",
        atomic=True,
        pass_context=True,
        max_attempts=2,
        retry=backoff.constant(0),
    )
    def atomic_write(ctx: JobContext, n: int, fail: bool) -> int:
        ctx.session.execute(ledger.insert().values(job_id=n))
        if fail and ctx.attempt == 1:
            raise RuntimeError("after writing")
        return n

    bad = atomic_write.enqueue(1, fail=True)
    good = atomic_write.enqueue(2, fail=False)
    # Drain once: attempt 1 of the failing job must leave no row and a retrying job.
    pgq.run_worker(concurrency=1, drain=True)
    with engine.connect() as connection:
        rows = sorted(r[0] for r in connection.execute(select(ledger.c.job_id)))
    first = pgq.get_job(bad)
    if first.state is JobState.RETRYING:
        assert rows == [2]
    run_until_final(pgq, [bad, good])
    with engine.connect() as connection:
        rows = sorted(r[0] for r in connection.execute(select(ledger.c.job_id)))
    assert rows == [1, 2]  # job 1's second attempt wrote once; the failed attempt's row is gone
    bad_job, good_job = pgq.get_job(bad), pgq.get_job(good)
    assert bad_job.state is JobState.SUCCEEDED and bad_job.attempts == 2
    assert bad_job.last_error is None and "after writing" in bad_job.errors[0]["error"]
    assert good_job.state is JobState.SUCCEEDED and good_job.attempts == 1


def test_an_atomic_jobs_times_span_its_run(pgq: PgQueue) -> None:
    """``started_at`` is the claim, ``finished_at`` the outcome, though both are written in one
    transaction: the difference is the run's duration, and a retry's backoff counts from the
    end of the attempt."""
    run = dt.timedelta(seconds=0.3)

    @pgq.task(name="atomic_slow", atomic=True, max_attempts=1)
    def atomic_slow(fail: bool) -> None:
        time.sleep(run.total_seconds())
        if fail:
            raise RuntimeError("slow and broken")

    @pgq.task(name="atomic_slow_retry", atomic=True, max_attempts=2, retry=backoff.constant(60))
    def atomic_slow_retry() -> None:
        time.sleep(run.total_seconds())
        raise RuntimeError("again later")

    ok, failed = atomic_slow.enqueue(False), atomic_slow.enqueue(True)
    retried = atomic_slow_retry.enqueue()
    pgq.run_worker(concurrency=1, drain=True)
    for job_id, state in ((ok, JobState.SUCCEEDED), (failed, JobState.FAILED)):
        job = pgq.get_job(job_id)
        assert job.state is state
        assert job.started_at is not None and job.finished_at is not None
        assert run <= job.finished_at - job.started_at < dt.timedelta(seconds=30)
        assert job.updated_at == job.finished_at
    again = pgq.get_job(retried)
    assert again.state is JobState.RETRYING and again.started_at is not None
    assert again.run_at - again.started_at >= dt.timedelta(seconds=60) + run


def test_atomic_failure_rolls_back_handler_writes(pgq: PgQueue, engine, app_tables) -> None:
    @pgq.task(name="atomic_fail", atomic=True, pass_context=True, max_attempts=1)
    def atomic_fail(ctx: JobContext) -> None:
        ctx.session.execute(ledger.insert().values(job_id=99))
        raise RuntimeError("rolled back")

    job_id = atomic_fail.enqueue()
    run_until_final(pgq, [job_id])
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(ledger)).scalar_one() == 0
    job = pgq.get_job(job_id)
    assert job.state is JobState.FAILED and "rolled back" in (job.last_error or "")


def test_atomic_crash_rolls_back_the_claim(pgq: PgQueue, engine, database_url: URL) -> None:
    """A transaction that dies mid-handler leaves the ticket claimable again at once."""
    from pgqueue.data import claim as claim_data

    @pgq.task(name="atomic_crash", atomic=True)
    def atomic_crash() -> None:
        return None

    job_id = atomic_crash.enqueue()
    session = pgq.handler_session()
    session.begin()
    claimed = claim_data.claim(
        executor_for(session),
        worker_id="doomed",
        limit=1,
        queues=None,
        lease_seconds=30,
        task_leases={},
        atomic=True,
    )
    assert [c.id for c in claimed] == [job_id]
    # While the claim is open the ticket is locked: another claimer skips it.
    with Session(engine) as other, other.begin():
        assert (
            claim_data.claim(
                executor_for(other),
                worker_id="other",
                limit=1,
                queues=None,
                lease_seconds=30,
                task_leases={},
                atomic=True,
            )
            == []
        )
    # The worker "crashes": its connection is terminated by the server.
    pid = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    with create_engine(database_url, isolation_level="AUTOCOMMIT").connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    session.invalidate()  # the connection is gone; a rollback could not be sent
    job = pgq.get_job(job_id)
    assert job.state is JobState.QUEUED and job.attempts == 0
    run_until_final(pgq, [job_id])
    assert pgq.get_job(job_id).state is JobState.SUCCEEDED


def test_delayed_job_waits_for_the_database_clock(pgq: PgQueue, engine) -> None:
    @pgq.task(name="delayed", pass_context=True)
    def delayed(ctx: JobContext) -> str:
        return str(ctx.session.execute(text("SELECT clock_timestamp()")).scalar_one())

    job_id = delayed.configure(delay=2).enqueue()
    stats = pgq.run_worker(concurrency=2, drain=True)
    assert stats.claimed == 0
    assert pgq.get_job(job_id).state is JobState.QUEUED
    run_until_final(pgq, [job_id], timeout=20)
    job = pgq.get_job(job_id)
    assert job.state is JobState.SUCCEEDED
    assert job.started_at is not None
    assert (job.started_at - job.created_at).total_seconds() >= 2.0
    assert (job.started_at - job.created_at).total_seconds() < 2.0 + 2.0


def test_run_at_in_the_past_runs_now(pgq: PgQueue) -> None:
    @pgq.task(name="past")
    def past() -> int:
        return 7

    job_id = past.configure(run_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=3649)).enqueue()
    run_until_final(pgq, [job_id])
    assert pgq.get_job(job_id).result == 7


def test_a_task_the_worker_does_not_register_waits_unrun(pgq: PgQueue, database_url: URL) -> None:
    other = PgQueue(database_url.render_as_string(hide_password=False), settings=pgq.settings)

    @other.task(name="only.in.producer")
    def producer_only() -> None:
        return None

    @pgq.task(name="known")
    def known() -> int:
        return 1

    orphan = producer_only.enqueue()
    fine = known.enqueue()
    run_until_final(pgq, [fine])
    orphan_job = pgq.get_job(orphan)
    assert (orphan_job.state, orphan_job.attempts, orphan_job.last_error) == (
        JobState.QUEUED,
        0,
        None,
    )
    assert pgq.get_job(fine).state is JobState.SUCCEEDED
    other.dispose()


def test_bad_input_is_refused_before_any_sql(pgq: PgQueue, engine) -> None:
    @pgq.task(name="takes_one")
    def takes_one(x: object) -> None:
        return None

    statements: list[str] = []
    from sqlalchemy import event

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    pgq.engine
    event.listen(pgq.engine, "before_cursor_execute", count)
    before = table_counts(engine)
    cases = [
        (lambda: takes_one.enqueue(object()), SerializationError),
        (lambda: takes_one.enqueue(float("nan")), SerializationError),
        (lambda: takes_one.enqueue(b"raw"), SerializationError),
        (lambda: takes_one.configure(queue="bad'queue").enqueue(1), ValidationError),
        (lambda: takes_one.configure(queue="has space").enqueue(1), ValidationError),
        (lambda: takes_one.configure(queue="x" * 64).enqueue(1), ValidationError),
        (lambda: takes_one.configure(delay=-1).enqueue(1), ValidationError),
        (lambda: takes_one.configure(priority=10**6).enqueue(1), ValidationError),
        (lambda: takes_one.enqueue(1, 2), ValidationError),  # does not fit the signature
        (lambda: takes_one.enqueue_many([{"x": 1}, {"y": 2}]), ValidationError),
        # A batch large enough for the COPY path, its last item bad: nothing is written.
        (
            lambda: takes_one.enqueue_many([[i] for i in range(1500)] + [[{"x": {1}}]]),
            SerializationError,
        ),
        (lambda: takes_one.enqueue("x" * 2_000_000), ValidationError),
        (lambda: pgq.get_job(-5), ValidationError),
    ]
    for call, error in cases:
        with pytest.raises(error) as caught:
            call()
        assert isinstance(caught.value, PgQueueError)
        assert str(caught.value)
    assert statements == []
    assert table_counts(engine) == before
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        PgQueue("mysql://user@localhost/db")
    with pytest.raises(ConfigurationError):
        PgQueue("::not a url::")
    with pytest.raises(JobNotFound):
        pgq.get_job(123456789)


def test_task_names_must_be_unique_and_valid(pgq: PgQueue) -> None:
    @pgq.task(name="dup")
    def first() -> None:
        return None

    with pytest.raises(ValidationError, match="already registered"):

        @pgq.task(name="dup")
        def second() -> None:
            return None

    with pytest.raises(ValidationError):
        pgq.task(name="bad name")(lambda: None)


def test_settings_statement_timeout_applies_to_pgqueue_engine(database_url: URL) -> None:
    queue = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(statement_timeout_ms=1234),
    )
    with queue.engine.connect() as connection:
        assert connection.execute(text("SHOW statement_timeout")).scalar_one() == "1234ms"
    queue.dispose()


def test_large_enqueue_many_copies_jobs_and_tickets_in_input_order(
    pgq: PgQueue, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ``COPY_THRESHOLD`` jobs on, an own-transaction ``enqueue_many`` uses COPY: the ids,
    the JSON text (COPY escaping), run_at, the tickets and the NOTIFY must be what the INSERT
    path gives, and the jobs must run."""
    import psycopg

    from pgqueue import core
    from pgqueue.data import enqueue as enqueue_data

    seen: list[int] = []

    @pgq.task(name="echo")
    def echo(*args: object, **kwargs: object) -> None:
        seen.append(1)

    copies: list[int] = []
    real_copy = enqueue_data.copy_jobs

    def spy(*args: Any) -> None:
        copies.append(len(args[2]))
        real_copy(*args)

    monkeypatch.setattr(enqueue_data, "copy_jobs", spy)
    tricky = ["tab\there", "line\nbreak", "back\\slash", "\\N", "", "quote\"'", "é€𝄞", "\r\x01"]
    n = core.COPY_THRESHOLD + 234
    items: list[dict[str, object] | list[object]] = [
        {"i": i, "s": tricky[i % len(tricky)]} if i % 3 else [i, tricky[i % len(tricky)], None]
        for i in range(n)
    ]
    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue")
        ids = echo.configure(delay=3600).enqueue_many(items)
        notified = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert copies == [n]
    assert notified and notified[0].startswith("default ")  # a future ticket: queue + epoch
    assert len(ids) == n and ids == sorted(ids) and len(set(ids)) == n
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                """SELECT j.id, j.args::text, j.kwargs::text, j.state, j.run_at = t.run_at,
                          t.queue, round(extract(epoch FROM j.run_at - now()))
                   FROM pgqueue_jobs j JOIN pgqueue_message_queue t ON t.job_id = j.id
                   ORDER BY j.id"""
            )
        ).all()
    assert [r[0] for r in rows] == ids
    for row, item in zip(rows, items, strict=True):
        args, kwargs = ([], item) if isinstance(item, dict) else (item, {})
        assert row[1] == json.dumps(args, ensure_ascii=False, separators=(",", ":"))
        assert row[2] == json.dumps(kwargs, ensure_ascii=False, separators=(",", ":"))
        assert row[3:6] == ("queued", True, "default")
        assert 3590 <= row[6] <= 3600
    # The same batch due now runs, each job once.
    ids_now = echo.enqueue_many(items)
    assert copies == [n, n]
    with engine.begin() as connection:
        connection.execute(
            text("DELETE FROM pgqueue_message_queue WHERE job_id = ANY(:ids)"), {"ids": ids}
        )
        connection.execute(text("DELETE FROM pgqueue_jobs WHERE id = ANY(:ids)"), {"ids": ids})
    states = run_until_final(pgq, ids_now, concurrency=20)
    assert set(states.values()) == {JobState.SUCCEEDED} and len(seen) == n


def test_enqueue_errors_are_sqlalchemy_errors_on_every_path(pgq: PgQueue, engine) -> None:
    """One-job and COPY enqueues run on the driver connection; their errors must still be
    SQLAlchemy's (what callers catch), and a failed COPY batch must leave nothing behind."""
    import socket

    from sqlalchemy.exc import DBAPIError, OperationalError

    from pgqueue import core

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = PgQueue(f"postgresql+psycopg://nobody@127.0.0.1:{port}/none", settings=pgq.settings)

    @down.task(name="t_down")
    def t_down(n: int) -> None:
        return None

    with pytest.raises(OperationalError):
        t_down.enqueue(1)
    with pytest.raises(OperationalError):
        t_down.enqueue_many([[i] for i in range(core.COPY_THRESHOLD)])
    down.dispose()

    @pgq.task(name="t_up", queue="q")
    def t_up(n: int) -> None:
        return None

    before = table_counts(engine)
    with engine.begin() as connection:  # every ticket insert now fails, after the jobs' COPY
        connection.execute(
            text("ALTER TABLE pgqueue_message_queue ADD CONSTRAINT no_q CHECK (queue <> 'q')")
        )
    with pytest.raises(DBAPIError):
        t_up.enqueue(1)
    with pytest.raises(DBAPIError):
        t_up.enqueue_many([[i] for i in range(core.COPY_THRESHOLD)])
    assert table_counts(engine) == before


@pytest.mark.slow
def test_two_apps_on_the_embedded_server_never_see_each_others_tables(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unconfigured apps run from two directories get a database each, named after the
    directory (the warning says which); a second queue object run from one of them (its
    worker, its CLI) shares that app's database."""
    root = Path(tempfile.mkdtemp(prefix="pgqueue-test-apps-"))
    root.chmod(0o755)
    data_dir = root / "postgres"
    settings = Settings(embedded_data_dir=str(data_dir))
    columns = {"Shop-A": "quantity integer", "shop_b": "title text"}
    try:
        for directory, column in columns.items():
            (root / directory).mkdir()
            monkeypatch.chdir(root / directory)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="pgqueue"):
                pgq = PgQueue(settings=settings)
            [warning] = [r.getMessage() for r in caplog.records]
            assert f"uses database {directory.lower().replace('-', '_')} " in warning
            with pgq.engine.begin() as connection:
                connection.execute(text(f"CREATE TABLE orders (id serial, {column})"))
            pgq.dispose()
        for directory, column in columns.items():
            monkeypatch.chdir(root / directory)
            pgq = PgQueue(settings=settings)
            with pgq.engine.connect() as connection:
                found = connection.scalars(
                    text(
                        "SELECT column_name || ' ' || data_type FROM information_schema.columns"
                        " WHERE table_name = 'orders' AND column_name <> 'id'"
                    )
                ).all()
            assert found == [column]
            pgq.dispose()
        named = PgQueue(settings=settings.replace(embedded_database="orders_dev"))
        assert named.url.database == "orders_dev"
        named.dispose()
    finally:
        server = embedded.shared._SHARED.pop(data_dir, None)
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_no_configuration_warns_once_and_its_server_refuses_tcp(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``PgQueue()`` with nothing configured: the embedded development server, said so once
    (naming its data directory), and reachable through its Unix socket only."""
    # Not tmp_path: as root the server runs as another user, who cannot traverse pytest's 0700
    # dirs.
    root = Path(tempfile.mkdtemp(prefix="pgqueue-test-default-"))
    root.chmod(0o755)
    data_dir = root / "postgres"
    try:
        with caplog.at_level(logging.INFO, logger="pgqueue"):
            pgq = PgQueue(settings=Settings(embedded_data_dir=str(data_dir)))
            url = pgq.url
            with pgq.engine.connect() as connection:
                assert connection.scalar(text("SELECT current_setting('data_directory')")) == (
                    str(data_dir)
                )
            pgq.dispose()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        message = warnings[0].getMessage()
        assert str(data_dir) in message
        assert "PGQUEUE_DATABASE_URL" in message
        assert "development" in message

        port = int(str(url.query.get("port") or url.port))
        assert port > 0
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(
                host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2
            ).close()
    finally:
        server = embedded.shared._SHARED.pop(data_dir, None)
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_a_configured_database_gives_no_warning(
    database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pgqueue"):
        PgQueue(database_url, settings=Settings())
        PgQueue(settings=Settings(database_url=database_url.render_as_string(False)))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
