"""Bulk actions by filter: a dry run that counts, then the action, each action recorded in one
audit row written in its transaction.

The acceptance case runs 3,000 jobs through real failure (a worker, ``max_attempts=1``), then
``pgqueue bulk retry`` as a subprocess: the dry run says 3,000, the action re-queues 3,000 with
tickets and room for one more attempt, one audit row, and a worker runs each once more.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import socket
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session
from support.processes import run_pgqueue
from support.roles import app_role, as_role  # noqa: F401  (app_role: a fixture)
from support.workers import in_thread

from pgqueue import JobContext, PgQueue
from pgqueue.admin import JobFilter
from pgqueue.cli import main as cli_main
from pgqueue.errors import BulkCountChanged, ValidationError
from pgqueue.models import AuditRecord, Job, MessageQueue, QueueControl
from pgqueue.states import JobState
from pgqueue.testing import states_of, wait_for_states
from pgqueue.worker import Worker


def _audit_rows(engine: Engine) -> list[AuditRecord]:
    with Session(engine) as session:
        rows = list(session.scalars(select(AuditRecord).order_by(AuditRecord.id)))
        session.expunge_all()
        return rows


def _jobs(engine: Engine, ids: list[int]) -> list[Job]:
    with Session(engine) as session:
        rows = list(session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id)))
        session.expunge_all()
        return rows


def _tickets(engine: Engine) -> set[int]:
    with Session(engine) as session:
        return set(session.scalars(select(MessageQueue.job_id)))


@pytest.mark.slow
def test_bulk_retry_of_3000_failed_jobs_dry_run_action_and_one_audit_row(
    pgq: PgQueue, engine: Engine, database_url: URL
) -> None:
    outage = threading.Event()
    outage.set()
    runs: dict[int, int] = {}
    lock = threading.Lock()

    @pgq.task(name="shop.sync_order", queue="sync", max_attempts=1)
    def sync_order(n: int) -> None:
        if outage.is_set():
            raise RuntimeError(f"upstream timeout for order {n}")
        with lock:
            runs[n] = runs.get(n, 0) + 1

    @pgq.task(name="shop.other", queue="other", max_attempts=1)
    def other(n: int) -> None:
        raise RuntimeError("upstream timeout")

    ids = sync_order.enqueue_many([[n] for n in range(3000)])
    others = other.enqueue_many([[n] for n in range(25)])
    pgq.run_worker(drain=True, concurrency=16)
    assert set(states_of(pgq, ids + others).values()) == {JobState.FAILED}

    dry = run_pgqueue(
        "bulk", "retry", "--state", "failed", "--queue", "sync", "--dry-run", url=database_url
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "dry run: retry would change 3,000 jobs"
    dry_json = run_pgqueue(
        "bulk", "retry", "--state", "failed", "-q", "sync", "--dry-run", "--json", url=database_url
    )
    assert json.loads(dry_json.stdout)["count"] == 3000
    # Without --yes, off a terminal: refused in one line, nothing written.
    refused = run_pgqueue("bulk", "retry", "--state", "failed", "--queue", "sync", url=database_url)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: refusing to retry 3,000 jobs without confirmation: pass --yes (or --dry-run to "
        "only count)"
    ]
    assert _audit_rows(engine) == []
    assert set(states_of(pgq, ids).values()) == {JobState.FAILED}
    assert _tickets(engine) == set()

    done = run_pgqueue(
        "bulk", "retry", "--state", "failed", "--queue", "sync", "--yes", "--json", url=database_url
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["count"] == 3000 and answer["dry_run"] is False

    jobs = _jobs(engine, ids)
    assert {job.state for job in jobs} == {JobState.QUEUED}
    assert {(job.attempts, job.max_attempts) for job in jobs} == {(1, 2)}
    assert {job.finished_at for job in jobs} == {None}
    assert _tickets(engine) == set(ids)
    assert set(states_of(pgq, others).values()) == {JobState.FAILED}
    [record] = _audit_rows(engine)
    assert record.id == answer["audit_id"]
    assert (record.actor, record.source, record.action, record.count) == (
        f"{getpass.getuser()}@{socket.gethostname()}",
        "cli",
        "retry",
        3000,
    )
    assert record.filter == {"queue": "sync", "states": ["failed"]}

    outage.clear()
    pgq.run_worker(drain=True, concurrency=16)
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
    assert runs == {n: 1 for n in range(3000)}
    assert {(job.attempts, job.max_attempts) for job in _jobs(engine, ids)} == {(2, 2)}


def _failing(pgq: PgQueue) -> Any:
    @pgq.task(name="fails", queue="q1", max_attempts=1)
    def fails(message: str) -> None:
        raise RuntimeError(message)

    return fails


def test_filters_narrow_by_task_queue_state_time_and_literal_error_text(
    pgq: PgQueue, engine: Engine
) -> None:
    fails = _failing(pgq)

    @pgq.task(name="fails.too", queue="q1", max_attempts=1)
    def fails_too(message: str) -> None:
        raise RuntimeError(message)

    percent = fails.enqueue("disk 100% full")
    no_percent = fails.enqueue("disk 100 full")
    underscore = fails.enqueue("RATE_LIMIT reached")
    no_underscore = fails.enqueue("rateXlimit reached")
    other_task = fails_too.enqueue("disk 100% full")
    pgq.run_worker(drain=True, concurrency=4)
    # Drained on its own, so its outcome is written after the others': the finish times then
    # differ, however the first drain batched its outcomes.
    other_queue = fails.configure(queue="q2").enqueue("disk 100% full")
    pgq.run_worker(drain=True, concurrency=4)
    everything = [percent, no_percent, underscore, no_underscore, other_task, other_queue]
    assert set(states_of(pgq, everything).values()) == {JobState.FAILED}
    later = fails.enqueue("disk 100% full")  # queued, created last
    admin = pgq.admin

    def matched(job_filter: JobFilter) -> int:
        return admin.bulk_retry(job_filter, dry_run=True).count

    assert matched(JobFilter(error_contains="100% FULL")) == 3
    assert matched(JobFilter(error_contains="100% full", task_name="fails")) == 2
    assert matched(JobFilter(error_contains="100% full", queue="q1")) == 2
    assert matched(JobFilter(error_contains="rate_limit")) == 1
    assert matched(JobFilter(queue="q1", states=frozenset({JobState.CANCELLED}))) == 0
    # A cancel counts waiting jobs only: the queued one.
    assert admin.bulk_cancel(JobFilter(error_contains="%"), dry_run=True).count == 0
    assert admin.bulk_cancel(JobFilter(queue="q1"), dry_run=True).count == 1

    jobs = {job.id: job for job in _jobs(engine, [*everything, later])}
    since = jobs[underscore].created_at
    until = jobs[other_task].created_at
    assert matched(JobFilter(since=since, until=until)) == 2  # underscore, no_underscore
    assert admin.bulk_delete(JobFilter(since=jobs[later].created_at), dry_run=True).count == 1
    finish_times = sorted({jobs[i].finished_at for i in everything})  # type: ignore[type-var]
    assert len(finish_times) >= 2  # outcomes written in a batch share their time
    cut = finish_times[-1]
    by_finish = JobFilter(since=cut, time_column="finished_at")
    finished_since_cut = sum(1 for i in everything if jobs[i].finished_at >= cut)  # type: ignore[operator]
    assert 1 <= finished_since_cut < len(everything)
    assert matched(by_finish) == finished_since_cut
    # The queued job has not finished: a range on finished_at never matches it.
    assert admin.bulk_delete(by_finish, dry_run=True).count == finished_since_cut

    result = admin.bulk_retry(JobFilter(error_contains="rate_limit"), actor="ops")
    assert (result.count, result.dry_run) == (1, False)
    assert states_of(pgq, [underscore, no_underscore]) == {
        underscore: JobState.QUEUED,
        no_underscore: JobState.FAILED,
    }
    [record] = _audit_rows(engine)
    assert (record.actor, record.source, record.count) == ("ops", "api", 1)
    assert record.filter == {"error_contains": "rate_limit"}


def test_empty_or_unfitting_filters_are_refused_and_a_dry_run_writes_nothing(
    pgq: PgQueue, engine: Engine, database_url: URL
) -> None:
    fails = _failing(pgq)
    ids = [fails.enqueue("boom") for _ in range(3)]
    pgq.run_worker(drain=True, concurrency=2)
    admin = pgq.admin
    with pytest.raises(ValidationError, match="refusing to delete every job"):
        admin.bulk_delete(JobFilter())
    with pytest.raises(ValidationError, match="refusing to retry every job"):
        admin.bulk_retry(JobFilter(), dry_run=True)
    with pytest.raises(ValidationError, match=r"cannot retry jobs in state succeeded \(retry"):
        admin.bulk_retry(JobFilter(states=frozenset({JobState.SUCCEEDED})))
    with pytest.raises(ValidationError, match="cannot cancel jobs in state failed"):
        admin.bulk_cancel(JobFilter(states=frozenset({JobState.FAILED})))
    with pytest.raises(ValidationError, match="cannot delete jobs in state running"):
        admin.bulk_delete(JobFilter(states=frozenset({JobState.RUNNING})))
    with pytest.raises(ValidationError, match="timezone-aware"):
        JobFilter(since=dt.datetime(2026, 1, 1))
    with pytest.raises(ValidationError, match="unknown state 'broken'"):
        JobFilter(states=frozenset({"broken"}))  # type: ignore[arg-type]

    assert admin.bulk_delete(JobFilter(queue="q1"), dry_run=True).count == 3
    assert admin.bulk_delete(JobFilter(all_jobs=True), dry_run=True).count == 3
    assert _audit_rows(engine) == []
    assert set(states_of(pgq, ids).values()) == {JobState.FAILED}

    runner = CliRunner()
    url = database_url.render_as_string(hide_password=False)
    for args, message in [
        (["--state", "broken"], "error: unknown state 'broken' (states: queued,"),
        (["--queue", "q1", "--since", "yesterday"], "error: --since 'yesterday' is not a time"),
        (["--queue", "q1", "--time-column", "run_at"], "error: time_column must be one of"),
        ([], "error: refusing to delete every job"),
        (["--state", "running"], "error: cannot delete jobs in state running"),
    ]:
        result = runner.invoke(cli_main, ["bulk", "delete", "--yes", "--database-url", url, *args])
        assert result.exit_code == 2, result.output
        [line] = result.output.strip().splitlines()
        assert line.startswith(message), line
    assert _audit_rows(engine) == []
    assert set(states_of(pgq, ids).values()) == {JobState.FAILED}

    with pytest.raises(BulkCountChanged, match="would now change 3 jobs, not the 2 previewed"):
        admin.bulk_retry(JobFilter(queue="q1"), expected_count=2)
    assert _audit_rows(engine) == []
    assert set(states_of(pgq, ids).values()) == {JobState.FAILED}

    deleted = runner.invoke(
        cli_main, ["bulk", "delete", "--all-jobs", "--yes", "--actor", "me", "--database-url", url]
    )
    assert deleted.output.strip() == "deleted 3 jobs (audit record 1)"
    assert states_of(pgq, ids) == {}
    [record] = _audit_rows(engine)
    assert (record.actor, record.action, record.filter) == ("me", "delete", {"all_jobs": True})


def _running_counter(engine: Engine, queue: str) -> int:
    with Session(engine) as session:
        return int(
            session.scalar(select(QueueControl.running).where(QueueControl.name == queue)) or 0
        )


def test_bulk_cancel_and_delete_keep_limit_counters_tickets_and_dependents(
    pgq: PgQueue, engine: Engine
) -> None:
    started = threading.Event()
    saw_cancel = threading.Event()

    @pgq.task(name="hold", queue="lim", pass_context=True, max_attempts=3)
    def hold(ctx: JobContext, n: int) -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if ctx.cancel_requested:
                saw_cancel.set()
                return "stopped"
            time.sleep(0.02)
        return "ran out"

    @pgq.task(name="step", queue="deps")
    def step(name: str) -> str:
        return name

    pgq.set_queue_limit("lim", 1)
    held = hold.enqueue(0)
    worker = Worker(pgq, queues=["lim"], concurrency=2, lease_seconds=1.5)
    with in_thread(worker):
        assert started.wait(20)
        waiting = [hold.enqueue(n) for n in range(1, 6)]
        parent = step.configure(queue="parents").enqueue("A")
        child = step.configure(depends_on=[parent]).enqueue("B")
        assert _running_counter(engine, "lim") == 1

        admin = pgq.admin
        limited = JobFilter(queue="lim")
        assert admin.bulk_cancel(limited, dry_run=True).count == 6
        result = admin.bulk_cancel(limited)
        assert (result.count, result.flagged_running) == (6, 1)
        assert _running_counter(engine, "lim") == 1
        assert states_of(pgq, waiting) == {i: JobState.CANCELLED for i in waiting}
        assert {job.last_error for job in _jobs(engine, waiting)} == {"cancelled by a bulk action"}
        assert _tickets(engine) == {parent}
        assert saw_cancel.wait(20)
        wait_for_states(pgq, [held], {JobState.CANCELLED}, timeout=20)
        assert _running_counter(engine, "lim") == 0

        # A cancelled dependency cancels what waits on it, as cancel_job does.
        assert admin.bulk_cancel(JobFilter(queue="parents")).count == 1
        assert states_of(pgq, [parent, child]) == {
            parent: JobState.CANCELLED,
            child: JobState.CANCELLED,
        }
        assert _tickets(engine) == set()

        queued = [step.enqueue(str(n)) for n in range(4)]
        assert _tickets(engine) == set(queued)
        gone = admin.bulk_delete(JobFilter(queue="deps", states=frozenset({JobState.QUEUED})))
        assert gone.count == 4
        assert _tickets(engine) == set()
        assert states_of(pgq, queued) == {}
        assert admin.bulk_delete(JobFilter(queue="lim")).count == 6
        assert _running_counter(engine, "lim") == 0
        actions = [r.action for r in _audit_rows(engine)]
        assert actions == ["set_queue_limit", "cancel", "cancel", "delete", "delete"]


def test_a_role_with_dml_rights_only_runs_a_bulk_action(
    database_url: URL,
    app_role: str,  # noqa: F811
) -> None:
    app_url = as_role(database_url, app_role).render_as_string(hide_password=False)
    pgq = PgQueue(app_url)
    try:
        fails = _failing(pgq)
        ids = [fails.enqueue("boom") for _ in range(3)]
        pgq.run_worker(drain=True, concurrency=2)
        result = pgq.admin.bulk_retry(JobFilter(queue="q1"), actor="app")
        assert result.count == 3
        assert set(states_of(pgq, ids).values()) == {JobState.QUEUED}
        assert pgq.admin.bulk_delete(JobFilter(queue="q1")).count == 3
    finally:
        pgq.dispose()
    engine = create_engine(database_url)
    try:
        with Session(engine) as session:
            assert session.scalar(select(func.count()).select_from(AuditRecord)) == 2
    finally:
        engine.dispose()
