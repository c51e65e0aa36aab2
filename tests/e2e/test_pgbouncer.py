"""pgqueue through a real PgBouncer in transaction mode (Debian's ``pgbouncer`` package).

PgBouncer refuses startup ``options``, hands each transaction to whichever server session is
free, and (before 1.21) knows nothing of prepared statements. With ``pooler="transaction"``
pgqueue sends no startup options, prepares nothing, keeps its settings inside its own
transactions and polls instead of listening; a worker drains through it with no error, and
the pool's other clients never see pgqueue's settings.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from support.locks import lock_waiters
from support.processes import pgqueue_command, pgqueue_env, run_pgqueue
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue, QueueFull, Settings, Snooze, migrations
from pgqueue.testing import ConcurrencyProbe, states_of, wait_for_states
from pgqueue.worker import Worker

if TYPE_CHECKING:
    from conftest import App


def test_without_the_pooler_setting_pgbouncer_refuses_pgqueue_naming_the_setting(
    bouncer: URL,
) -> None:
    pgq = PgQueue(bouncer, settings=Settings())
    refusal = pytest.raises(Exception, match="unsupported startup parameter")
    with refusal as refused, pgq.engine.connect():
        pass
    assert "set PGQUEUE_POOLER=transaction" in str(refused.value)
    pgq.dispose()
    cli = run_pgqueue("stats", url=bouncer, process=True)
    assert cli.returncode != 0
    [line] = cli.stderr.strip().splitlines()
    assert "unsupported startup parameter" in line and "PGQUEUE_POOLER=transaction" in line


@pytest.mark.slow
def test_enqueue_and_drain_through_pgbouncer_in_transaction_mode(app: App, bouncer: URL) -> None:
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction"))

    @pgq.task(name="record", pass_context=True)
    def record(ctx: object, secret: str = "") -> None:
        """The worker's ``record`` (from the e2e app) runs it; declared here to enqueue it."""

    ids = [record.enqueue() for _ in range(200)]
    ids += record.enqueue_many([{} for _ in range(5000)])
    assert len(set(ids)) == 5200

    returncode, output = app.drain_through_bouncer(bouncer)
    assert returncode == 0, output
    for marker in ("WARNING", "ERROR", "Traceback"):
        assert marker not in output, output
    jobs = app.jobs(ids)
    assert {(j.state, j.attempts) for j in jobs.values()} == {("succeeded", 1)}
    assert app.done_counts() == dict.fromkeys(ids, 1)

    # Another client of the same pool: server defaults for every setting pgqueue changes, no
    # statement left prepared (every server session of the pool served pgqueue's drain).
    defaults = tuple(_server_default(app, name) for name in PGQUEUE_SETTINGS)
    conninfo = bouncer.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as other:
        for _ in range(10):
            row = other.execute(
                "SELECT current_setting('jit'), current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout'), "
                "(SELECT count(*) FROM pg_prepared_statements)"
            ).fetchone()
            assert row == (*defaults, 0)
    pgq.dispose()


def test_asyncio_enqueues_through_pgbouncer_in_transaction_mode(app: App, bouncer: URL) -> None:
    """The asyncio engine pgqueue makes has the sync engine's pooler handling: no startup
    options, nothing prepared however often a statement runs, settings inside its
    transactions; an ``AsyncSession`` of the app's own (through the same pooler) joins too."""
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction", statement_timeout_ms=4321))

    @pgq.task(name="record", pass_context=True)
    def record(ctx: object, secret: str = "") -> None:
        """Enqueued only."""

    async def main() -> tuple[list[int], Any]:
        app_engine = create_async_engine(bouncer, connect_args={"prepare_threshold": None})
        try:
            ids = list(await asyncio.gather(*(record.aenqueue() for _ in range(200))))
            ids += await record.aenqueue_many([{} for _ in range(2000)])
            async with AsyncSession(app_engine) as session, session.begin():
                ids.append(await record.configure(session=session).aenqueue())
            inside = await pgq.async_database.run(
                lambda db: db.rows(text("SELECT current_setting('statement_timeout')"))[0]
            )
            return ids, inside
        finally:
            await app_engine.dispose()
            await pgq.adispose()

    ids, inside = asyncio.run(main())
    assert len(set(ids)) == 2201
    assert tuple(inside) == ("4321ms",)
    assert set(app.jobs(ids)) == set(ids)


def test_flow_control_and_lifecycle_through_pgbouncer_in_transaction_mode(
    app: App, bouncer: URL
) -> None:
    """Key limits, a rate limit, a bounded queue under concurrent enqueues, snooze, progress
    and durable steps, each transaction on whichever server session the pool hands out."""
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction", poll_interval=0.1))
    probe = ConcurrencyProbe()
    runs: dict[int, int] = {}

    @pgq.task(name="pb.keyed", concurrency_key=lambda account: f"pb:{account}", key_limit=1)
    def keyed(account: int) -> None:
        probe.run(0.05)

    @pgq.task(name="pb.rated", queue="pb_rated")
    def rated(n: int) -> int:
        return n

    @pgq.task(name="pb.bounded", queue="pb_bounded")
    def bounded(n: int) -> int:
        return n

    @pgq.task(name="pb.lifecycle", pass_context=True)
    def lifecycle(ctx: JobContext) -> str:
        runs[ctx.job_id] = runs.get(ctx.job_id, 0) + 1
        ctx.progress(0.5)
        if runs[ctx.job_id] < 3:
            raise Snooze(0)
        return str(ctx.step("once", lambda: "done"))

    try:
        pgq.set_rate_limit("pb_rated", 100, per=1)
        pgq.set_queue_max_depth("pb_bounded", 10)
        refused: list[int] = []

        def enqueue_bounded(n: int) -> int | None:
            try:
                return bounded.enqueue(n)
            except QueueFull:
                refused.append(n)
                return None

        with ThreadPoolExecutor(8) as pool:
            bounded_ids = [i for i in pool.map(enqueue_bounded, range(30)) if i is not None]
        assert (len(bounded_ids), len(refused)) == (10, 20)
        ids = keyed.enqueue_many([[1]] * 4 + [[2]] * 4)
        ids += rated.enqueue_many([[n] for n in range(20)])
        [lifecycle_id] = lifecycle.enqueue_many([[]])
        stats = pgq.run_worker(drain=True, concurrency=6)
        assert stats.failed == 0
        assert probe.peak == 2  # one per key
        everything = [*ids, *bounded_ids, lifecycle_id]
        assert set(states_of(pgq, everything).values()) == {JobState.SUCCEEDED}
        job = pgq.get_job(lifecycle_id)
        assert (job.attempts, job.result, [step.name for step in job.steps]) == (
            1,
            "done",
            ["once"],
        )
    finally:
        pgq.dispose()


# The settings pgqueue gives its own statements (per transaction behind a pooler).
PGQUEUE_SETTINGS = ("jit", "statement_timeout", "idle_in_transaction_session_timeout")


def _server_default(app: App, name: str) -> str:
    engine = create_engine(app.url)
    with engine.connect() as connection:
        value = connection.execute(text("SELECT current_setting(:n)"), {"n": name}).scalar_one()
    engine.dispose()
    return str(value)


def test_a_backend_terminated_inside_a_transaction_is_a_lost_connection_through_pgbouncer(
    bouncer: URL, server_tcp_url: URL
) -> None:
    """PgBouncer closes the client's connection when its backend dies mid-transaction, and the
    COMMIT that follows fails with psycopg's InternalError ("received 2 results"), no SQLSTATE.
    pgqueue must read that as a lost connection (retried, an outcome never turned into a
    failed attempt), as it reads the same termination outside a transaction."""
    from sqlalchemy.exc import DBAPIError

    from pgqueue.db import Database
    from pgqueue.sqlstates import is_connection_error

    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction"))
    direct = server_tcp_url.set(database=bouncer.database, drivername="postgresql")
    database = Database(pgq.engine)

    def terminated_before_commit(ex: Any) -> None:
        pid = ex.rows(text("SELECT pg_backend_pid()"))[0][0]
        with psycopg.connect(direct.render_as_string(hide_password=False)) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        time.sleep(0.5)  # the backend's FATAL reaches PgBouncer before the COMMIT is sent

    try:
        with pytest.raises(DBAPIError) as raised:
            database.run(terminated_before_commit, autocommit=False)
        assert "received 2 results" in str(raised.value)
        assert is_connection_error(raised.value)
        # The pool dropped the connection: the next unit of work runs.
        assert database.run(lambda ex: ex.rows(text("SELECT 1"))[0][0], autocommit=False) == 1
    finally:
        pgq.dispose()


def test_enqueue_from_sql_through_pgbouncer_in_transaction_mode(bouncer: URL) -> None:
    """``pgqueue_enqueue`` through the pooler: plain calls (autocommit, unprepared as a client
    of a transaction pooler sends them), a unique key held, a bounded queue's lock and count
    inside the caller's transaction and its refusal; a worker through the same pooler runs the
    jobs with their arguments."""
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction", poll_interval=0.1))

    @pgq.task(name="sqlpool.add")
    def add(a: int, b: int) -> int:
        return a + b

    pgq.set_queue_max_depth("tight", 2)
    conninfo = bouncer.set(drivername="postgresql").render_as_string(hide_password=False)
    call = (
        "SELECT pgqueue_enqueue(task_name => 'sqlpool.add', args => %s::jsonb,"
        " queue => %s, unique_key => %s)"
    )
    try:
        with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as client:
            ids = [
                client.execute(call, [f"[{i}, 1]", "default", None]).fetchone()[0]  # type: ignore[index]
                for i in range(20)
            ]
            keyed = client.execute(call, ["[100, 0]", "default", "once"]).fetchone()[0]  # type: ignore[index]
            again = client.execute(call, ["[100, 0]", "default", "once"]).fetchone()[0]  # type: ignore[index]
            with client.transaction():
                tight = [
                    client.execute(call, [f"[{i}, 0]", "tight", None]).fetchone()[0]  # type: ignore[index]
                    for i in (200, 201)
                ]
            with pytest.raises(psycopg.Error) as full, client.transaction():
                client.execute(call, ["[202, 0]", "tight", None])
            assert full.value.sqlstate == "PQ001"
            assert client.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (23,)
        assert again == keyed
        pgq.run_worker(queues=["default", "tight"], drain=True)
        results = {i: pgq.get_job(i).result for i in [*ids, keyed, *tight]}
        assert results == {
            **{job_id: n + 1 for n, job_id in enumerate(ids)},
            keyed: 100,
            tight[0]: 200,
            tight[1]: 201,
        }
    finally:
        pgq.dispose()


def test_durable_sleep_and_signals_through_pgbouncer_in_transaction_mode(bouncer: URL) -> None:
    """A worker through the pooler suspends jobs that sleep or wait, resumes them when their
    time comes or their signal arrives (sent through the pooler too, also from an asyncio
    session), and their steps before the sleep run once."""
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction", poll_interval=0.1))
    steps_run: list[int] = []

    @pgq.task(name="poolwait.sleeper", pass_context=True, max_attempts=1)
    def sleeper(ctx: JobContext) -> str:
        ctx.step("before", lambda: steps_run.append(ctx.job_id) or 1)
        ctx.sleep(0.5)
        return "slept"

    @pgq.task(name="poolwait.waiter", pass_context=True, max_attempts=1)
    def waiter(ctx: JobContext) -> Any:
        ctx.step("before", lambda: steps_run.append(ctx.job_id) or 1)
        return ctx.wait_for_signal("go", timeout=60)

    async def signal_async(job_id: int) -> bool:
        return await pgq.asignal(job_id, "go", {"from": "asyncio"})

    slept = sleeper.enqueue()
    waiting = [waiter.enqueue() for _ in range(3)]
    try:
        pgq.run_worker(drain=True)  # each runs up to its sleep or wait, then suspends
        assert states_of(pgq, waiting) == dict.fromkeys(waiting, JobState.QUEUED)
        assert pgq.signal(waiting[0], "go", {"from": "sync"}) is True
        assert asyncio.run(signal_async(waiting[1])) is True
        time.sleep(0.6)  # the sleep's time comes
        pgq.run_worker(drain=True)
        results = {i: (pgq.get_job(i).state, pgq.get_job(i).result) for i in [slept, *waiting]}
        assert results == {
            slept: (JobState.SUCCEEDED, "slept"),
            waiting[0]: (JobState.SUCCEEDED, {"from": "sync"}),
            waiting[1]: (JobState.SUCCEEDED, {"from": "asyncio"}),
            waiting[2]: (JobState.QUEUED, None),
        }
        assert sorted(steps_run) == sorted([slept, *waiting])
        assert [pgq.get_job(i).attempts for i in [slept, *waiting]] == [1, 1, 1, 0]
    finally:
        pgq.dispose()


def test_pgqueue_migrate_swaps_indexes_online_through_pgbouncer(app: App, bouncer: URL) -> None:
    env = pgqueue_env(bouncer, pooler="transaction")

    def migrate(*args: str) -> str:
        done = run_pgqueue("migrate", *args, env=env, process=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def predicates() -> set[str | None]:
        return set(
            app.scalars(
                "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i"
                " JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indisvalid"
                " AND c.relname IN ('ix_pgqueue_jobs_queue_state_id',"
                " 'ix_pgqueue_jobs_task_name_state_id')"
            )
        )

    # Each CONCURRENTLY statement runs outside a transaction, each on whichever server session
    # PgBouncer hands it; none may leave a setting behind on the sessions others get.
    assert "pgqueue schema at pgqueue_0024" in migrate("downgrade", "pgqueue_0024", "--yes")
    assert predicates() == {None}
    # An older transaction that wrote to pgqueue_jobs: the upgrade's first concurrent build
    # waits for it (a plain build would wait for its lock, and time out).
    holder = create_engine(app.url)
    try:
        with holder.connect() as older:
            older.execute(text("INSERT INTO pgqueue_jobs (task_name, queue) VALUES ('t', 'q')"))
            upgrade = subprocess.Popen(
                pgqueue_command("migrate"),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            app.wait_until(
                lambda: (
                    upgrade.poll() is not None
                    or lock_waiters(app.engine, "CREATE INDEX CONCURRENTLY")
                ),
                60,
                "a concurrent build waiting",
            )
            assert upgrade.poll() is None, upgrade.communicate()[0]
            older.commit()
        output, _ = upgrade.communicate(timeout=120)
    finally:
        holder.dispose()
    assert upgrade.returncode == 0, output
    assert f"pgqueue schema at {migrations.head()}" in output
    assert predicates() == {"((state)::text <> 'running'::text)"}
    with psycopg.connect(bouncer.set(drivername="postgresql").render_as_string(False)) as other:
        row = other.execute(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
        ).fetchone()
    assert row == ("0", "0")


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_timeouts_end_attempts_through_pgbouncer_in_transaction_mode(
    bouncer: URL, pool: str
) -> None:
    """Through the pooler an atomic task's timeout ends its transaction on the server (the
    session behind the pooler is the one terminated), and a leased one's attempt ends at its
    deadline, its writes rolled back; in the process pool its child is stopped."""
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction", poll_interval=0.1))
    release = threading.Event()

    @pgq.task(name=f"pooltimeout.atomic_{pool}", atomic=True, timeout=1.0, max_attempts=1)
    def atomic_sleeps() -> None:
        release.wait(10)

    @pgq.task(name=f"pooltimeout.leased_{pool}", timeout=1.0, max_attempts=1, pass_context=True)
    def leased_sleeps(ctx: JobContext) -> None:
        ctx.session.execute(text("SELECT 1"))
        while not ctx.cancel_requested and not release.is_set():
            time.sleep(0.01)

    ids = [atomic_sleeps.enqueue(), leased_sleeps.enqueue()]
    try:
        with in_thread(Worker(pgq, concurrency=2, pool=pool), before_stop=release.set):
            final = wait_for_states(pgq, ids, timeout=30)
        assert final == dict.fromkeys(ids, JobState.FAILED)
        for job_id in ids:
            job = pgq.get_job(job_id)
            assert job.started_at is not None and job.finished_at is not None
            assert (job.finished_at - job.started_at).total_seconds() < 2.5
            assert "JobTimeout" in (job.last_error or ""), job.last_error
    finally:
        pgq.dispose()
