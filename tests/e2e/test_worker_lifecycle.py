"""Graceful shutdown, lost database connections, and ``--processes`` under a supervisor."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pgqueue import PgQueue
from pgqueue.database_urls import normalize_database_url
from pgqueue.embedded import EmbeddedPostgres
from pgqueue.states import JobState

if TYPE_CHECKING:
    from conftest import App


def test_sigterm_lets_running_jobs_finish_and_exits_0(app: App) -> None:
    worker = app.start_worker("--concurrency", "4", "--shutdown-timeout", "20")
    ids = app.module.sleep.enqueue_many([{"seconds": 1.5}] * 3)
    app.wait_until(lambda: len(app.ledger("start")) == 3, 30, "3 running jobs")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert time.monotonic() - signalled < 15
    jobs = app.jobs(ids)
    assert {(j.state, j.attempts) for j in jobs.values()} == {("succeeded", 1)}
    # Stopped claiming: a job enqueued after the signal is still waiting.
    [later] = app.module.record.enqueue_many([{}])
    time.sleep(0.5)
    assert app.jobs([later])[later].state == "queued"


def test_sigterm_releases_a_job_longer_than_the_timeout(app: App) -> None:
    # A long lease: only the release (not an expiry) can let another worker have it quickly.
    worker = app.start_worker(
        "--concurrency", "2", "--shutdown-timeout", "1", "--lease-seconds", "60"
    )
    [job_id] = app.module.sleep.enqueue_many([{"seconds": 120, "first_run_only": True}])
    app.wait_until(lambda: app.ledger("start"), 30, "the job to start")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert time.monotonic() - signalled < 10
    [released] = app.jobs([job_id]).values()
    assert (released.state, released.attempts, released.lease_token) == ("queued", 0, None)
    assert "releasing job" in worker.log()

    other = app.start_worker("--concurrency", "2", "--lease-seconds", "60")
    [job] = app.wait_final([job_id], timeout=30).values()
    assert (job.state, job.attempts, job.result["pid"]) == ("succeeded", 1, other.pid)


def test_second_signal_exits_at_once_naming_the_jobs_left_to_their_leases(app: App) -> None:
    worker = app.start_worker(
        "--concurrency", "2", "--shutdown-timeout", "60", "--lease-seconds", "45"
    )
    [job_id] = app.module.sleep.enqueue_many([{"seconds": 120}])
    app.wait_until(lambda: app.ledger("start"), 30, "the job to start")
    worker.signal(signal.SIGTERM)
    app.wait_until(
        lambda: f"waiting up to 60s for job {job_id} to finish" in worker.log(),
        10,
        "the worker to name the job it waits for",
    )
    assert worker.popen.poll() is None  # waiting for the running job
    worker.signal(signal.SIGINT)
    assert worker.wait(10) != 0
    assert (
        f"second signal: exiting now; job {job_id} left to its lease: another worker takes "
        "each back once its lease expires (within 45s)"
    ) in worker.log()


def test_terminated_connections_reconnect_and_listen_again(app: App) -> None:
    # A poll interval far above the 1 s budget: only LISTEN (and the reconnect) can be in time.
    worker = app.start_worker("--concurrency", "2", "--poll-interval", "30", rescue_interval=30)
    [old_listener] = app.wait_listening()
    [warm] = app.module.record.enqueue_many([{}])
    app.wait_final([warm], timeout=30)

    app.module.pgq.dispose()  # the test's own pgqueue connections are not the worker's
    backends = app.scalars(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND application_name LIKE 'pgqueue%'"
    )
    assert len(backends) >= 2
    # An aggregate, so every backend is terminated (not just the first row a LIMIT would pull).
    # A backend of the test's own just-closed connections may be gone already (false).
    [(killed, killed_at)] = app.rows(
        "SELECT array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), "
        "extract(epoch FROM clock_timestamp()) FROM unnest(CAST(:pids AS int[])) AS pid",
        pids=backends,
    )
    assert old_listener in killed and len(killed) >= 2
    killed_at = float(killed_at)
    [job_id] = app.module.record.enqueue_many([{}])
    [row] = app.wait_until(
        lambda: app.rows(
            "SELECT extract(epoch FROM at) AS at FROM ledger WHERE job_id = :j", j=job_id
        ),
        10,
        "the job after the kill to start",
        interval=0.01,
    )
    assert float(row.at) - killed_at < 1.0
    [new_listener] = app.wait_listening()
    assert new_listener != old_listener
    app.wait_until(
        lambda: (
            not app.scalars(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(:pids)", pids=backends
            )
        ),
        10,
        "the terminated backends to be gone",
    )

    # LISTEN is live again: a job enqueued now starts long before the next poll.
    time.sleep(0.5)
    [next_id] = app.module.record.enqueue_many([{}])
    enqueued = time.monotonic()
    app.wait_until(lambda: app.rows("SELECT 1 FROM ledger WHERE job_id = :j", j=next_id), 10, "x")
    assert time.monotonic() - enqueued < 1.0
    assert worker.popen.poll() is None
    assert app.wait_final([job_id, next_id], timeout=10)[job_id].state == JobState.SUCCEEDED


@pytest.mark.slow
def test_two_processes_run_2000_jobs_exactly_once_and_a_killed_child_is_replaced(
    app: App,
) -> None:
    supervisor = app.start_worker("--processes", "2", "--concurrency", "8")
    app.wait_listening(count=2)
    children = app.wait_until(lambda: len(app.children_of(supervisor.pid)) == 2, 30, "2 children")
    children = app.children_of(supervisor.pid)
    ids: list[int] = []
    for _ in range(4):
        ids += app.module.record.enqueue_many([{}] * 500)
    jobs = app.wait_final(ids, timeout=240)
    assert {(j.state, j.attempts) for j in jobs.values()} == {("succeeded", 1)}
    counts = app.rows(
        "SELECT count(*) AS n, count(DISTINCT job_id) AS jobs FROM ledger WHERE tag = 'done'"
    )[0]
    assert (counts.n, counts.jobs) == (2000, 2000)
    by_pid = dict(app.rows("SELECT pid, count(*) FROM ledger GROUP BY pid"))
    assert set(by_pid) == set(children), by_pid  # both children worked

    victim = children[0]
    os.kill(victim, signal.SIGKILL)
    replaced = app.wait_until(
        lambda: (lambda now: now if len(now) == 2 and victim not in now else None)(
            app.children_of(supervisor.pid)
        ),
        30,
        "the supervisor to start a new child",
    )
    [newcomer] = set(replaced) - set(children)
    app.wait_listening(count=2)
    more = app.module.record.enqueue_many([{}] * 200)
    app.wait_final(more, timeout=60)
    pids = set(app.scalars("SELECT pid FROM ledger WHERE job_id = ANY(:ids)", ids=more))
    assert pids <= {children[1], newcomer}
    assert supervisor.popen.poll() is None

    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0
    assert app.children_of(supervisor.pid) == []


def test_the_supervisor_of_processes_holds_no_database_connection(app: App) -> None:
    # A host's connections are its worker processes' and nothing more: the supervisor checks
    # the schema before it starts them, and must not keep that connection for its life.
    supervisor = app.start_worker("--processes", "2")
    app.wait_listening(count=2)
    sockets = [
        fd.name
        for fd in Path(f"/proc/{supervisor.pid}/fd").iterdir()
        if os.readlink(fd).startswith("socket:")
    ]
    assert sockets == [], f"the supervisor has open sockets: {sockets}"
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0


def test_worker_processes_keep_their_startup_heap_out_of_garbage_collections(app: App) -> None:
    # Each worker process freezes what it loaded before its first claim (its collections then
    # skip the app, SQLAlchemy and pgqueue), and still collects what it allocates later.
    supervisor = app.start_worker("--processes", "2", "--concurrency", "2")
    app.wait_listening(count=2)
    ids = app.module.heap_state.enqueue_many([{}] * 20)
    jobs = app.wait_final(ids, timeout=30)
    assert {job.state for job in jobs.values()} == {"succeeded"}
    results = [job.result for job in jobs.values()]
    assert {result["pid"] for result in results} <= set(app.children_of(supervisor.pid))
    assert all(result["enabled"] for result in results), results
    assert min(result["frozen"] for result in results) > 10_000, results
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) pgqueue process; an orphan is reaped by init, not
    by this test, so a zombie counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and b"pgqueue" in cmdline


def test_children_of_a_killed_supervisor_finish_or_release_their_jobs_and_exit(app: App) -> None:
    shutdown = 6.0
    supervisor = app.start_worker(
        "--processes", "2", "--concurrency", "3", "--shutdown-timeout", str(shutdown),
        "--lease-seconds", "3",
    )  # fmt: skip
    children: list[int] = app.wait_until(
        lambda: (lambda now: now if len(now) == 2 else None)(app.children_of(supervisor.pid)),
        30,
        "2 children",
    )
    try:
        app.wait_listening(count=2)
        # Three slots per child and six jobs: each child runs three when the supervisor dies.
        short = app.module.sleep.enqueue_many([{"seconds": 3}] * 4)
        long = app.module.sleep.enqueue_many([{"seconds": 300, "first_run_only": True}] * 2)
        app.wait_until(lambda: len(app.ledger("start")) == 6, 30, "6 running jobs")
        assert {row.pid for row in app.ledger("start")} == set(children)

        supervisor.popen.kill()
        assert supervisor.wait(10) == -signal.SIGKILL
        killed = time.monotonic()
        app.wait_until(
            lambda: not any(_running(pid) for pid in children),
            shutdown + 10,
            "both children to exit",
        )
        # The shutdown timeout, plus the child's parent check (a quarter second), the release
        # of the long jobs and the interpreter's exit.
        exited = time.monotonic() - killed
        print(f"children exited {exited:.2f} s after the supervisor was killed")
        assert exited < shutdown + 3, exited

        # Past the leases (3 s): nothing is RUNNING; the short jobs finished, the long ones
        # were released (attempt not counted), and nothing else was claimed meanwhile.
        time.sleep(4)
        jobs = app.jobs(short + long)
        assert {(j.state, j.attempts) for i, j in jobs.items() if i in short} == {("succeeded", 1)}
        assert [(j.state, j.attempts, j.lease_token) for i, j in jobs.items() if i in long] == [
            ("queued", 0, None)
        ] * 2
        assert len(app.ledger("start")) == 6
        assert sorted(row.job_id for row in app.ledger("end")) == sorted(short)

        # A new worker runs the released jobs: every job ran to exactly one outcome.
        assert app.start_worker("--concurrency", "2", "--drain").wait(60) == 0
        jobs = app.jobs(short + long)
        assert {(j.state, j.attempts) for j in jobs.values()} == {("succeeded", 1)}
        starts = collections.Counter(row.job_id for row in app.ledger("start"))
        assert starts == {**dict.fromkeys(short, 1), **dict.fromkeys(long, 2)}
        assert sorted(row.job_id for row in app.ledger("end")) == sorted(short + long)
    finally:
        # Orphans are not the test's children: end any still running by PID.
        for pid in children:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.slow
def test_worker_rides_out_a_database_outage(tmp_path: Path, app_factory: Any) -> None:
    # Its own server: stopping the shared one would break every other test.
    root = Path(tempfile.mkdtemp(prefix="pgqueue-outage-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    restarted: EmbeddedPostgres | None = None
    try:
        url = normalize_database_url(server.url())
        PgQueue(url).migrate()
        with app_factory(tmp_path, url) as app:
            worker = app.start_worker("--poll-interval", "0.2", rescue_interval=0.5)
            app.wait_listening()
            [before] = app.module.record.enqueue_many([{}])
            app.wait_final([before], timeout=30)

            server.stop()
            cpu_before = _cpu_seconds(worker.pid)
            log_before = len(worker.log().splitlines())
            time.sleep(5)
            cpu = _cpu_seconds(worker.pid) - cpu_before
            complaints = len(worker.log().splitlines()) - log_before
            print(f"outage of 5 s: worker used {cpu:.2f} s CPU, wrote {complaints} log lines")
            assert worker.popen.poll() is None
            assert cpu < 1.0  # backing off, not spinning
            assert complaints < 100

            restarted = EmbeddedPostgres(root / "data", durable=False, port=server.port)
            restarted.start()
            app.module.pgq.dispose()
            app.engine.dispose()
            [after] = app.module.record.enqueue_many([{}])
            [job] = app.wait_final([after], timeout=30).values()
            assert job.state == "succeeded"
            app.wait_listening()
            assert worker.popen.poll() is None
    finally:
        (restarted or server).stop()
        shutil.rmtree(root, ignore_errors=True)
