"""Fault tests: real worker processes under load, kills, storms, restarts.

Every test runs ``python -m pgqueue worker`` subprocesses (most under the ``--processes``
supervisor) against a fresh database and checks exact counts in the ``ledger`` table the
``work`` task writes to (see ``conftest.py``): a ``done`` row is committed in the handler's own
session, so it exists once per run that completed its handler; with ``start_mark`` a ``start``
row is committed as the handler begins, so runs cut short are visible too.

Durations are printed (``-s``) so the suite's budget can be checked.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from support.locks import wait_for_lock_waiters

from pgqueue import PgQueue
from pgqueue.connections import conninfo
from pgqueue.database_urls import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres
from pgqueue.errors import PgQueueError
from pgqueue.worker.store import WorkerStore

if TYPE_CHECKING:
    from conftest import App, WorkerProcess

FINAL = ("succeeded", "failed", "cancelled")


def _children(app: App, supervisor_pid: int, count: int) -> list[int]:
    return list(
        app.wait_until(
            lambda: (lambda now: now if len(now) == count else None)(
                app.children_of(supervisor_pid)
            ),
            30,
            f"{count} worker processes",
        )
    )


def _stop(supervisor: WorkerProcess) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0


# -- 1. many workers -------------------------------------------------------------------------


@pytest.mark.slow
def test_many_workers_run_10000_jobs_exactly_once(app: App) -> None:
    """10,000 jobs, 4 processes x 8 threads, random job durations. (The fault harness,
    tests/chaos, runs many workers on other random workloads, with faults.)"""
    began = time.monotonic()
    seed = 1
    rng = random.Random(seed)
    supervisor = app.start_worker("--processes", "4", "--concurrency", "8")
    children = _children(app, supervisor.pid, 4)
    app.wait_listening(count=4)
    ids: list[int] = []
    for _ in range(10):  # enqueued while the workers run: wake-ups and claims race inserts
        durations = [rng.choice([0.0, 0.0, 0.0, rng.uniform(0.0, 0.01)]) for _ in range(1000)]
        ids += app.module.work.enqueue_many([{"seconds": round(d, 4)} for d in durations])
    assert len(set(ids)) == 10_000
    app.wait_all_final(10_000, timeout=240)

    [(rows, distinct)] = app.rows("SELECT count(*), count(DISTINCT job_id) FROM ledger")
    assert (rows, distinct) == (10_000, 10_000)
    assert set(app.scalars("SELECT job_id FROM ledger")) == set(ids)
    assert app.rows("SELECT state, attempts, count(*) FROM pgqueue_jobs GROUP BY 1, 2") == [
        ("succeeded", 1, 10_000)
    ]
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    assert set(app.scalars("SELECT DISTINCT pid FROM ledger")) == set(children)
    assert app.children_of(supervisor.pid) == children  # no worker process died
    _stop(supervisor)
    assert "starting a new one" not in supervisor.log()
    assert "Traceback" not in supervisor.log()
    print(f"seed {seed}: 10,000 jobs in {time.monotonic() - began:.1f}s")


# -- 6. enqueue under load -------------------------------------------------------------------


@pytest.mark.slow
def test_enqueue_under_load_processed_set_equals_committed_set(app: App) -> None:
    """20 threads enqueue in their own transactions, half roll back, while workers drain."""
    began = time.monotonic()
    supervisor = app.start_worker("--processes", "2", "--concurrency", "4")
    _children(app, supervisor.pid, 2)
    app.wait_listening(count=2)
    producer = create_engine(app.url, pool_size=20, max_overflow=0)
    committed: set[int] = set()
    rolled_back: set[int] = set()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                with Session(producer) as session:
                    ids = app.module.work.enqueue_many(
                        [{} for _ in range(rng.randint(1, 5))], session=session
                    )
                    time.sleep(rng.uniform(0, 0.01))  # open while workers claim around it
                    commit = rng.random() < 0.5
                    if commit:
                        session.commit()
                    else:
                        session.rollback()
                with lock:
                    (committed if commit else rolled_back).update(ids)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    producer.dispose()
    # The workers drained while the producers ran (not only afterwards).
    assert app.scalars("SELECT count(*) FROM ledger")[0] > 0
    assert errors == []
    assert not committed & rolled_back
    print(f"{len(committed)} committed, {len(rolled_back)} rolled back")
    assert len(committed) > 1000 and len(rolled_back) > 1000
    app.wait_all_final(len(committed), timeout=120)

    assert app.done_counts() == dict.fromkeys(committed, 1)
    jobs = app.rows("SELECT id, state, attempts FROM pgqueue_jobs")
    assert {j.id for j in jobs} == committed  # nothing of a rolled-back transaction remains
    assert {(j.state, j.attempts) for j in jobs} == {("succeeded", 1)}
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    _stop(supervisor)
    print(f"enqueue under load: {time.monotonic() - began:.1f}s")


# -- 2. repeated kills -----------------------------------------------------------------------


def _db_now(app: App) -> float:
    return float(app.scalars("SELECT extract(epoch FROM clock_timestamp())")[0])


def _runs(app: App) -> dict[int, dict[str, list[Any]]]:
    """``job_id -> {'start': [...], 'done': [...]}`` ledger rows (epoch ``at``), in order."""
    runs: dict[int, dict[str, list[Any]]] = {}
    for row in app.rows(
        "SELECT job_id, attempt, tag, pid, extract(epoch FROM at) AS at FROM ledger ORDER BY id"
    ):
        runs.setdefault(row.job_id, {"start": [], "done": []})[row.tag].append(row)
    return runs


def _assert_lost_attempts_recorded(jobs: dict[int, Any], reason: str) -> None:
    """Every attempt before the last one of every job ended with ``reason`` in its errors."""
    for job in jobs.values():
        recorded = [(e["attempt"], reason in e["error"]) for e in job.errors]
        assert recorded == [(a, True) for a in range(1, job.attempts)], job


@pytest.mark.slow
def test_repeated_sigkills_lose_nothing_and_duplicates_only_follow_a_kill(app: App) -> None:
    """2,000 jobs, 10 SIGKILLs of random worker processes (the supervisor restarts them)."""
    began = time.monotonic()
    rng = random.Random(5)
    supervisor = app.start_worker(
        "--processes", "3", "--concurrency", "8", "--lease-seconds", "2", rescue_interval=0.5
    )
    _children(app, supervisor.pid, 3)
    app.wait_listening(count=3)
    ids = app.module.work.enqueue_many(
        [{"seconds": round(rng.uniform(0.05, 0.15), 3), "start_mark": True} for _ in range(2000)]
    )
    killed: dict[int, float] = {}  # pid -> database time once it was dead
    for _ in range(10):
        time.sleep(0.6)
        victim = rng.choice(
            app.wait_until(lambda: app.children_of(supervisor.pid), 30, "a worker process")
        )
        os.kill(victim, signal.SIGKILL)
        app.wait_until(lambda: victim not in app.children_of(supervisor.pid), 10, "the kill")
        killed[victim] = _db_now(app)
    last_kill = time.monotonic()
    [(open_at_last_kill,)] = app.rows(
        "SELECT count(*) FROM pgqueue_jobs WHERE state NOT IN ('succeeded', 'failed')"
    )
    assert open_at_last_kill > 0, "the kills came after the run: make the jobs longer"
    app.wait_all_final(2000, timeout=30)
    print(f"all final {time.monotonic() - last_kill:.1f}s after the last kill")

    jobs = app.jobs(ids)
    assert {j.state for j in jobs.values()} == {"succeeded"}
    assert app.scalars("SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'") == [0]
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    runs = _runs(app)
    assert set(runs) == set(ids) and all(r["done"] for r in runs.values())  # 2,000 ids
    _assert_lost_attempts_recorded(jobs, "lease expired")
    duplicated = 0
    for job_id, job_runs in runs.items():
        starts, dones = job_runs["start"], job_runs["done"]
        job = jobs[job_id]
        # The last run is the one that succeeded; every run before it was cut short by a kill:
        # it ran in a process killed afterwards, and its attempt ended "lease expired".
        assert [s.attempt for s in starts] == sorted({s.attempt for s in starts})
        assert starts[-1].attempt == job.attempts
        for run in starts[:-1] + [d for d in dones if d.attempt != job.attempts]:
            assert run.pid in killed and run.at < killed[run.pid], (job_id, run)
        assert [d.attempt for d in dones].count(job.attempts) == 1
        if len(starts) > 1 or len(dones) > 1:
            duplicated += 1
            assert job.attempts >= 2
    assert app.children_of(supervisor.pid) and supervisor.popen.poll() is None
    assert supervisor.log().count("starting a new one") == 10
    print(
        f"repeated kills: {duplicated} jobs ran more than once, "
        f"max attempts {max(j.attempts for j in jobs.values())}, "
        f"{time.monotonic() - began:.1f}s"
    )
    _stop(supervisor)


# -- 3. connection storm ---------------------------------------------------------------------

# Every connection pgqueue opens names itself (own engine, LISTEN, handler sessions).
TERMINATE_PGQUEUE = (
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND application_name LIKE 'pgqueue%'"
)


@pytest.mark.slow
def test_connection_storm_no_worker_exits_and_nothing_is_lost(app: App) -> None:
    """pg_terminate_backend on every pgqueue connection every 500 ms for 20 s, 5,000 jobs."""
    began = time.monotonic()
    # A poll interval far above the 1 s budget below: only LISTEN can start the last job.
    supervisor = app.start_worker(
        "--processes", "2", "--concurrency", "8", "--poll-interval", "30", rescue_interval=0.5
    )
    children = _children(app, supervisor.pid, 2)
    app.wait_listening(count=2)
    # The producer's and the storm's connections are not pgqueue's: they survive the storm.
    producer = create_engine(app.url, connect_args={"application_name": "storm-producer"})
    storm = create_engine(
        app.url, isolation_level="AUTOCOMMIT", connect_args={"application_name": "storm"}
    )
    ids: list[int] = []
    terminated: list[int] = []
    with storm.connect() as connection:
        for _ in range(40):  # 20 s: 125 new jobs and one round of terminations every 500 ms
            tick = time.monotonic()
            with Session(producer) as session, session.begin():
                ids += app.module.work.enqueue_many([{"seconds": 0.02}] * 125, session=session)
            terminated.append(connection.execute(text(TERMINATE_PGQUEUE)).scalar_one())
            time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
    producer.dispose()
    storm.dispose()
    print(f"storm: terminated {sum(terminated)} connections, per round {terminated}")
    assert all(count >= 2 for count in terminated)  # at least both listeners, every round

    storm_over = time.monotonic()
    app.wait_all_final(5000, timeout=120)
    print(f"all jobs final {time.monotonic() - storm_over:.1f}s after the storm")
    jobs = app.jobs(ids)
    assert {j.state for j in jobs.values()} == {"succeeded"}
    done = app.done_counts()
    assert set(done) == set(ids)  # 0 lost
    # No job waited for a lease to expire (30 s): a claim whose answer was lost to a terminated
    # connection is taken back by the worker's retry, not left RUNNING under its name.
    assert not [j.id for j in jobs.values() if "lease expired" in str(j.errors)]
    # A handler whose session was cut off failed and was retried; the error says so.
    for job_id, count in done.items():
        assert count <= jobs[job_id].attempts
    assert app.children_of(supervisor.pid) == children  # no worker process exited
    assert "starting a new one" not in supervisor.log()
    assert "Traceback" not in supervisor.log()

    # After the storm: LISTEN is back in both processes, and a new job starts within 1 s.
    app.wait_listening(count=2)
    time.sleep(0.5)
    [job_id] = app.module.work.enqueue_many([{}])
    enqueued = _db_now(app)
    [at] = app.wait_until(
        lambda: app.scalars(
            "SELECT extract(epoch FROM at) FROM ledger WHERE job_id = :j", j=job_id
        ),
        10,
        "the job after the storm",
        interval=0.01,
    )
    assert float(at) - enqueued < 1.0
    retried = sum(1 for j in jobs.values() if j.attempts > 1)
    print(f"connection storm: {retried} jobs retried, {time.monotonic() - began:.1f}s")
    _stop(supervisor)


# -- 4. database restart ---------------------------------------------------------------------


REFUSED_AT_SHUTDOWN = "the database system is shutting down"


@pytest.mark.slow
def test_database_restart_workers_ride_it_out(tmp_path: Path, app_factory: Any) -> None:
    """The server is stopped (fast shutdown) for 2 s and started again on the same port."""
    began = time.monotonic()
    # Its own server: stopping the session's shared one would break every other test.
    root = Path(tempfile.mkdtemp(prefix="pgqueue-restart-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    try:
        url = normalize_database_url(server.url())
        owner = PgQueue(url)
        owner.migrate()
        owner.dispose()
        with app_factory(tmp_path, url) as app:
            _ride_out_a_restart(app, server)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"database restart: {time.monotonic() - began:.1f}s")


def _ride_out_a_restart(app: App, server: EmbeddedPostgres) -> None:
    supervisor = app.start_worker("--processes", "2", "--concurrency", "8", rescue_interval=0.5)
    children = _children(app, supervisor.pid, 2)
    app.wait_listening(count=2)
    ids = app.module.work.enqueue_many([{"seconds": 0.02, "start_mark": True}] * 5000)
    app.wait_until(lambda: len(app.done_counts()) >= 1000, 60, "1,000 jobs done")

    log_offset = len(supervisor.log())
    server.stop()
    stopped = time.monotonic()
    # In flight at the stop: RUNNING in the data directory as the server left it, read from a
    # server started on it on another port, which no worker knows (statements that were under
    # way at the shutdown either committed, and show here, or did not). On the same port its
    # socket would be the one the workers reconnect to, and they would claim and record
    # outcomes on it while it is read.
    inspector = EmbeddedPostgres(server.data_dir, durable=False, port=server.port + 1)
    inspector.start()
    try:
        url = normalize_database_url(inspector.url(str(app.url.database)))
        with psycopg.connect(conninfo(url)) as connection:
            in_flight = {
                row[0]
                for row in connection.execute("SELECT id FROM pgqueue_jobs WHERE state = 'running'")
            }
    finally:
        inspector.stop()
    assert in_flight
    time.sleep(max(0.0, 2.0 - (time.monotonic() - stopped)))
    server.start()
    print(f"down for {time.monotonic() - stopped:.2f}s; {len(in_flight)} jobs in flight")
    app.module.pgq.dispose()  # the test's own pooled connections died with the server
    app.engine.dispose()
    app.wait_all_final(5000, timeout=120)

    jobs = app.jobs(ids)
    assert {j.state for j in jobs.values()} == {"succeeded"}
    runs = _runs(app)
    assert set(runs) == set(ids) and all(r["done"] for r in runs.values())  # 0 lost
    repeated = {i for i, r in runs.items() if len(r["start"]) > 1 or len(r["done"]) > 1}
    assert repeated <= in_flight  # duplicates only among jobs in flight at the stop
    # Outside those, a job ran more than once only when the shutdown refused its handler's
    # connection as the attempt began: that failure is recorded as the attempt's error, and its
    # retry can commit on a worker connection the shutdown had not reached yet.
    more_than_once = {
        i: (jobs[i].attempts, jobs[i].errors, runs[i])
        for i in set(ids) - in_flight
        if jobs[i].attempts != 1
        and not all(REFUSED_AT_SHUTDOWN in e["error"] for e in jobs[i].errors)
    }
    assert not more_than_once, (sorted(in_flight), more_than_once)
    for job in jobs.values():  # an attempt cut off by the outage ended with a recorded error
        assert [e["attempt"] for e in job.errors] == list(range(1, job.attempts))
    reasons = sorted(
        {e["error"].strip().splitlines()[-1][:80] for i in in_flight for e in jobs[i].errors}
    )
    print(f"{len(repeated)} of the jobs in flight ran again; recorded errors: {reasons}")

    # The workers rode it out: same processes, reconnects logged with a growing backoff, no
    # crash loop, LISTEN back.
    assert app.children_of(supervisor.pid) == children
    assert "starting a new one" not in supervisor.log()
    outage_log = supervisor.log()[log_offset:]
    delays = [
        float(d) for d in re.findall(r"database unavailable .*retrying in ([\d.]+)s", outage_log)
    ]
    print(f"{len(delays)} reconnect attempts logged, longest wait {max(delays):.2f}s")
    assert delays and max(delays) >= 0.4
    assert len(delays) < 200
    app.wait_listening(count=2)
    _stop(supervisor)


# -- 5. statement timeout and deadlocks ------------------------------------------------------


def test_pgqueue_statements_carry_a_statement_timeout(app: App) -> None:
    """pgqueue's own connections set ``statement_timeout``; a blocked claim is cancelled by it."""
    with app.module.pgq.engine.connect() as connection:
        settings = connection.execute(
            text("SELECT current_setting('statement_timeout'), current_setting('application_name')")
        ).one()
    assert tuple(settings) == ("10s", "pgqueue")
    with app.module.pgq.handler_engine.connect() as connection:  # the app's queries: no limit
        assert connection.execute(text("SHOW statement_timeout")).scalar_one() == "0"

    worker = app.start_worker("--concurrency", "2", statement_timeout_ms=300)
    app.wait_listening()
    blocker = psycopg.connect(conninfo(app.url))  # not a pgqueue connection
    try:
        blocker.execute("LOCK TABLE pgqueue_message_queue IN ACCESS EXCLUSIVE MODE")
        # The worker's claim queues behind the lock and is cancelled after 300 ms, again and
        # again (it backs off), instead of waiting as long as the lock is held.
        app.wait_until(
            lambda: worker.log().count("canceling statement due to statement timeout") >= 2,
            10,
            "the worker's blocked statements to time out",
        )
    finally:
        blocker.close()
    [job_id] = app.module.work.enqueue_many([{}])
    [job] = app.wait_final([job_id], timeout=30).values()
    assert (job.state, job.attempts) == ("succeeded", 1)
    assert worker.popen.poll() is None


def _deadlocks(app: App) -> int:
    return int(
        app.scalars("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")[0]
    )


def _provoke_one_deadlock(app: App) -> None:
    """Two plain connections lock two rows in opposite orders: the server detects a deadlock.

    Shows that the checks below (the counter, the server log) do see a deadlock when one
    happens."""
    app.execute("CREATE TABLE deadlock_probe (id int PRIMARY KEY)")
    app.execute("INSERT INTO deadlock_probe VALUES (1), (2)")
    first, second = psycopg.connect(conninfo(app.url)), psycopg.connect(conninfo(app.url))
    detected: list[str] = []

    def update(connection: psycopg.Connection[Any], row: int) -> None:
        try:
            connection.execute("UPDATE deadlock_probe SET id = id WHERE id = %s", (row,))
        except psycopg.errors.DeadlockDetected as exc:
            detected.append(exc.sqlstate or "")
        connection.rollback()

    try:
        first.execute("UPDATE deadlock_probe SET id = id WHERE id = 1")
        second.execute("UPDATE deadlock_probe SET id = id WHERE id = 2")
        waiter = threading.Thread(target=update, args=(first, 2))
        waiter.start()
        wait_for_lock_waiters(app.engine, statement="UPDATE deadlock_probe")
        update(second, 1)
        waiter.join(30)
    finally:
        first.close()
        second.close()
    assert detected == ["40P01"]


def _server_log(app: App) -> Path | None:
    """The embedded test server's log (beside its data directory), when this process can see it."""
    data_dir = app.scalars("SELECT current_setting('data_directory')")[0]
    log = Path(data_dir + ".log")
    return log if log.is_file() else None


# How many freezes, and of every other kind of conflict, the conflicting workload runs to.
FREEZES = 8
CONFLICTS = 50


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_conflicting_workload_no_deadlock_and_short_transactions(app: App) -> None:
    """Cancels, reruns, rescues, freezes and claims on the same jobs until each kind has happened
    often enough (at most 60 s): 0 deadlocks (40P01), and no pgqueue transaction open longer
    than 2 s (pg_stat_activity sampled every 100 ms)."""
    began = time.monotonic()
    pgq = app.module.pgq
    flaky = app.module.flaky
    log = _server_log(app)
    # The control: a deadlock outside pgqueue shows in the counter and the log.
    counted = _deadlocks(app)
    log_offset = log.stat().st_size if log else 0
    _provoke_one_deadlock(app)
    app.wait_until(lambda: _deadlocks(app) == counted + 1, 10, "the deadlock to be counted")
    if log is not None:
        with log.open("rb") as server_log:
            server_log.seek(log_offset)
            assert b"deadlock detected" in server_log.read()
    log_offset = log.stat().st_size if log else 0
    deadlocks_before = _deadlocks(app)

    supervisor = app.start_worker(
        "--processes", "2", "--concurrency", "4", "--lease-seconds", "0.5", rescue_interval=0.2
    )
    _children(app, supervisor.pid, 2)
    app.wait_listening(count=2)

    ids: list[int] = list(flaky.enqueue_many([{"seconds": 0.05}] * 200))
    stop = threading.Event()
    failures: list[BaseException] = []
    counts = {"cancel": 0, "rerun": 0, "rescued": 0, "freeze": 0}
    longest: dict[str, Any] = {"age": 0.0, "row": None}
    lock = threading.Lock()

    def loop(name: str, interval: float, step: Any) -> None:
        rng = random.Random(name)
        try:
            while not stop.is_set():
                step(rng)
                stop.wait(interval)
        except BaseException as exc:
            failures.append(exc)
            stop.set()

    def recent(rng: random.Random) -> int:
        with lock:
            return rng.choice(ids[-300:])  # the live end of the pool: the most contention

    def cancel(rng: random.Random) -> None:
        try:
            pgq.cancel_job(recent(rng))
            counts["cancel"] += 1
        except PgQueueError:
            pass  # already final: the race is the point

    def rerun(rng: random.Random) -> None:
        try:
            pgq.retry_job(recent(rng))
            counts["rerun"] += 1
        except PgQueueError:
            pass

    rescuer = WorkerStore(pgq.engine, stopping=threading.Event())

    def rescue(rng: random.Random) -> None:
        counts["rescued"] += len(rescuer.rescue_expired(limit=50, error="lease expired (test)"))

    def enqueue(rng: random.Random) -> None:
        new = flaky.enqueue_many([{"seconds": round(rng.uniform(0, 0.3), 3)}] * 10)
        with lock:
            ids.extend(new)

    def freeze(rng: random.Random) -> None:
        # A stopped process keeps its leases past expiry (0.5 s): the other process and the
        # test's rescuer take its jobs back while its heartbeats and outcomes are in flight. A
        # transaction it has open stays open as long as it is stopped: 0.8 s, well below the
        # 2 s bound checked below, so a longer one is pgqueue's doing.
        children = app.children_of(supervisor.pid)
        if children:
            victim = rng.choice(children)
            os.kill(victim, signal.SIGSTOP)
            stop.wait(0.8)
            os.kill(victim, signal.SIGCONT)
            counts["freeze"] += 1

    # An 'idle' backend has no client transaction open, but while it delivers a notification
    # (the LISTEN connection) it shows a momentary internal one, dated from its last statement.
    sampler = create_engine(app.url, isolation_level="AUTOCOMMIT")

    def sample(rng: random.Random) -> None:
        with sampler.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT extract(epoch FROM clock_timestamp() - xact_start) AS age, pid, "
                    "application_name, state, wait_event_type, left(query, 200) AS query "
                    "FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name IN ('pgqueue', 'pgqueue-listener') "
                    "AND xact_start IS NOT NULL AND state <> 'idle' ORDER BY 1 DESC LIMIT 1"
                )
            ).all()
        if rows and float(rows[0].age) > longest["age"]:
            longest["age"], longest["row"] = float(rows[0].age), tuple(rows[0])

    threads = [
        threading.Thread(target=loop, args=args)
        for args in [
            ("cancel-1", 0.01, cancel),
            ("cancel-2", 0.01, cancel),
            ("rerun-1", 0.01, rerun),
            ("rerun-2", 0.01, rerun),
            ("rescue", 0.05, rescue),
            ("enqueue", 0.2, enqueue),
            ("freeze", 1.5, freeze),
            ("sample", 0.1, sample),
        ]
    ]
    for thread in threads:
        thread.start()
    # Until every kind of conflict has happened often enough (FREEZES freezes take the longest,
    # about 2.3 s each), at most 60 s.
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        others = [n for kind, n in counts.items() if kind != "freeze"]
        if counts["freeze"] >= FREEZES and min(others) >= CONFLICTS:
            break
        stop.wait(0.2)
    stop.set()
    for thread in threads:
        thread.join(30)
    sampler.dispose()
    assert failures == []
    for child in app.children_of(supervisor.pid):
        os.kill(child, signal.SIGCONT)  # in case the freezer was stopped mid-freeze

    # Everything settles: no job stuck, every ticket belongs to a waiting job.
    app.wait_until(
        lambda: (
            not app.scalars(
                "SELECT count(*) FROM pgqueue_jobs WHERE state NOT IN "
                "('succeeded', 'failed', 'cancelled')"
            )[0]
        ),
        60,
        "the jobs to settle",
    )
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    states = dict(app.rows("SELECT state, count(*) FROM pgqueue_jobs GROUP BY 1"))
    lease_lost = supervisor.log().count("lease lost")
    print(
        f"workload: {counts}, {len(ids)} jobs {states}, {lease_lost} lost leases reported, "
        f"longest pgqueue transaction {longest['age']:.3f}s {longest['row']}"
    )
    assert all(counts.values()), counts  # each kind of conflict really happened
    assert lease_lost > 0

    assert longest["age"] < 2.0, longest
    # Deadlocks: none detected by the server (its counter is flushed by each backend within
    # a second or at exit: the workers are stopped first), none retried by a worker.
    _stop(supervisor)
    time.sleep(1.5)
    assert _deadlocks(app) - deadlocks_before == 0
    assert "deadlock" not in supervisor.log()
    if log is not None:
        with log.open("rb") as server_log:
            server_log.seek(log_offset)
            assert b"deadlock detected" not in server_log.read()
    print(f"conflicting workload: {time.monotonic() - began:.1f}s")
