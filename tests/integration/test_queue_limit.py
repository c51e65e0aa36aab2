"""A queue-wide concurrency limit holds across worker processes (enforced in the claim)."""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL
from support.locks import wait_for_lock_waiters
from support.processes import pgqueue_command, pgqueue_env
from support.workers import in_thread

from pgqueue import JobState, PgQueue
from pgqueue.data import claim as claim_data
from pgqueue.db import ConnectionExecutor
from pgqueue.testing import ConcurrencyProbe, states_of, wait_for_states
from pgqueue.worker import Worker

APP = """
import os
import time

from sqlalchemy import create_engine, text

from pgqueue import PgQueue, Settings

# prune_interval 0.2: every worker's maintenance loop also recounts the limited queue's running
# counter many times during the run, so the limit is shown to hold with those recounts racing
# the claims and outcomes.
pgq = PgQueue(
    os.environ["DB_URL"],
    settings=Settings(poll_interval=0.05, rescue_interval=0.2, prune_interval=0.2),
)
ledger = create_engine(os.environ["DB_URL"], pool_size=8)


@pgq.task(queue="reports", name="report")
def report(n: int) -> None:
    with ledger.begin() as c:
        c.execute(text("INSERT INTO ledger VALUES (:n, 'start', clock_timestamp(), :pid)"), {"n": n, "pid": os.getpid()})
    time.sleep(0.2)
    with ledger.begin() as c:
        c.execute(text("INSERT INTO ledger VALUES (:n, 'end', clock_timestamp(), :pid)"), {"n": n, "pid": os.getpid()})
"""


def _max_overlap(events: list[tuple[object, str]]) -> int:
    running = peak = 0
    # At equal timestamps count ends first: touching intervals do not overlap.
    for _, event in sorted(events, key=lambda e: (e[0], e[1] != "end")):
        running += 1 if event == "start" else -1
        peak = max(peak, running)
    return peak


@pytest.mark.slow
def test_limit_two_across_four_worker_processes(
    database_url: URL, pgq: PgQueue, tmp_path: Path
) -> None:
    url = database_url.render_as_string(hide_password=False)
    (tmp_path / "limitapp.py").write_text(textwrap.dedent(APP))
    with pgq.engine.begin() as c:
        c.execute(text("CREATE TABLE ledger (n int, event text, at timestamptz, pid int)"))

    @pgq.task(queue="reports", name="report")
    def report(n: int) -> None:  # the workers' copy runs it; this one only enqueues
        raise AssertionError("runs in the worker processes")

    pgq.set_queue_limit("reports", 2)
    ids = report.enqueue_many([[i] for i in range(40)])
    env = {**pgqueue_env(), "DB_URL": url}
    workers = [
        subprocess.Popen(
            # One job at a time per process: any overlap is across processes, which is what
            # this test is about (the in-process limit has its own test below). With four
            # threads each, the process that finishes a job reclaims first and, on a busy
            # machine, could end up doing all the work alone.
            pgqueue_command("worker", "limitapp:pgq", "--concurrency", "1"),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    try:
        wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=120)
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    with pgq.engine.connect() as c:
        events = [(row.at, row.event) for row in c.execute(text("SELECT at, event FROM ledger"))]
        processes = c.execute(text("SELECT count(DISTINCT pid) FROM ledger")).scalar()
    assert len(events) == 80
    assert _max_overlap(events) == 2
    assert processes is not None and processes >= 2  # overlaps were across processes
    reports = pgq.admin.queue_settings()["reports"]
    assert (reports.paused, reports.concurrency_limit, reports.running) == (False, 2, 0)


def test_limit_applies_within_one_worker_and_can_be_lifted(pgq: PgQueue) -> None:
    probe = ConcurrencyProbe()

    @pgq.task(queue="q1", name="slow")
    def slow() -> None:
        probe.run(0.1)

    pgq.set_queue_limit("q1", 1)
    ids = [slow.enqueue() for _ in range(6)]
    stats = pgq.run_worker(drain=True, concurrency=6)
    assert stats.succeeded == 6
    assert probe.peak == 1
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
    pgq.set_queue_limit("q1", None)
    probe.peak = 0
    ids = [slow.enqueue() for _ in range(6)]
    stats = pgq.run_worker(drain=True, concurrency=6)
    assert stats.succeeded == 6
    assert probe.peak > 1


def test_limit_set_while_a_worker_runs_holds_at_once(
    pgq: PgQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker last saw no limits (lean claim); a limit set now is never exceeded."""
    monkeypatch.setattr(claim_data, "LIMITS_CHECK_SECONDS", 0.3)
    probe = ConcurrencyProbe()

    @pgq.task(queue="q2", name="busy")
    def busy() -> None:
        probe.run(0.1)

    with in_thread(Worker(pgq, concurrency=4)):
        first = busy.enqueue()
        wait_for_states(pgq, [first], {JobState.SUCCEEDED}, timeout=30)
        time.sleep(0.6)  # past the claimer's limits check: it has seen "no limits"
        probe.peak = 0
        pgq.set_queue_limit("q2", 1)
        ids = [busy.enqueue() for _ in range(6)]
        wait_for_states(pgq, ids, {JobState.SUCCEEDED}, timeout=60)
    assert probe.peak == 1


def test_a_limit_set_while_a_claim_waits_keeps_that_claim_counted(pgq: PgQueue) -> None:
    """Setting a limit starts the counter from the queue's RUNNING jobs. A claim that counted
    a job against the queue while waiting for that job's row (another transaction holds it, an
    application's or an operator's) holds the queue's row until it commits; the limit's count
    waits for that row and must see the claimed job. Counted from what was committed when the
    setting began, the counter forgets the job, and the queue runs one over its limit."""

    @pgq.task(queue="q3", name="held")
    def held() -> None:
        pass

    pgq.set_queue_limit("q3", 1)
    first = held.enqueue()
    second = held.enqueue()

    def claim() -> list[int]:
        autocommit = pgq.engine.execution_options(isolation_level="AUTOCOMMIT")
        with autocommit.connect() as connection:
            jobs = claim_data.claim(
                ConnectionExecutor(connection),
                worker_id="limit-test",
                limit=2,
                queues=["q3"],
                lease_seconds=30,
                task_leases={},
                limits=claim_data.LimitsSeen(),
                autocommit=True,
            )
        return [job.id for job in jobs]

    claimed: list[int] = []
    claimer = threading.Thread(target=lambda: claimed.extend(claim()))
    setter = threading.Thread(target=pgq.set_queue_limit, args=("q3", 1))
    with pgq.engine.begin() as locker:
        locker.execute(text("SELECT 1 FROM pgqueue_jobs WHERE id = :id FOR UPDATE"), {"id": first})
        claimer.start()
        wait_for_lock_waiters(pgq.engine, statement="WITH")  # the claim, holding the queue's row
        setter.start()
        wait_for_lock_waiters(pgq.engine, statement="INSERT INTO pgqueue_queues")
    for thread in (claimer, setter):
        thread.join(30)
        assert not thread.is_alive()
    assert claimed == [first]
    # The queue is at its limit: the second job waits.
    assert claim() == []
    assert states_of(pgq, [first, second]) == {first: JobState.RUNNING, second: JobState.QUEUED}
    with pgq.engine.connect() as connection:
        running = connection.execute(
            text("SELECT running FROM pgqueue_queues WHERE name = 'q3'")
        ).scalar_one()
    assert running == 1
