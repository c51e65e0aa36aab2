"""A worker claims only jobs of tasks it registers: a job of another task waits for a worker
that registers it, with no attempt counted and no error, as during a rolling deploy where old
and new workers share the tables. ``pgqueue explain`` names the wait and the metrics count it.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import URL
from support.network import free_port
from support.polling import wait_until
from support.processes import run_pgqueue
from support.workers import in_thread

from pgqueue import JobState, PgQueue, Settings, metrics
from pgqueue.worker import Worker


def _queue(database_url: URL, settings: Settings) -> PgQueue:
    return PgQueue(database_url.render_as_string(hide_password=False), settings=settings)


@pytest.fixture
def old_and_new(database_url: URL, settings: Settings) -> Iterator[tuple[PgQueue, PgQueue]]:
    """Two deployments of one app on one database: the old code lacks task ``report_v2``."""
    old = _queue(database_url, settings)
    new = _queue(database_url, settings)
    yield old, new
    old.dispose()
    new.dispose()


def _register(pgq: PgQueue, ran: list[tuple[str, str]], label: str, *, atomic: bool) -> Any:
    """Task ``report`` on ``pgq``; returns the task (its handler notes ``label``)."""

    @pgq.task(name="report", atomic=atomic, max_attempts=3)
    def report(n: int) -> None:
        ran.append((label, f"report {n}"))

    return report


def _register_v2(pgq: PgQueue, ran: list[tuple[str, str]], *, atomic: bool) -> Any:
    @pgq.task(name="report_v2", atomic=atomic, max_attempts=3)
    def report_v2(n: int) -> None:
        ran.append(("new", f"report_v2 {n}"))

    return report_v2


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_a_worker_leaves_jobs_of_tasks_it_does_not_register(
    old_and_new: tuple[PgQueue, PgQueue], atomic: bool
) -> None:
    old, new = old_and_new
    ran: list[tuple[str, str]] = []
    _register(old, ran, "old", atomic=atomic)
    report = _register(new, ran, "new", atomic=atomic)
    report_v2 = _register_v2(new, ran, atomic=atomic)
    # The new code's jobs first in line, and among the old code's jobs.
    v2_ids = [report_v2.enqueue(0), report_v2.enqueue(1)]
    report_ids = [report.enqueue(n) for n in range(5)]
    v2_ids.append(report_v2.enqueue(2))

    stats = Worker(old, concurrency=4).run(drain=True)

    assert sorted(ran) == [("old", f"report {n}") for n in range(5)]
    assert {old.get_job(i).state for i in report_ids} == {JobState.SUCCEEDED}
    for job_id in v2_ids:
        job = old.get_job(job_id)
        assert (job.state, job.attempts, job.last_error, job.errors, job.lease_token) == (
            JobState.QUEUED,
            0,
            None,
            [],
            None,
        ), job_id
    assert stats.failed == 0 and stats.retried == 0
    # Given back only until the worker claims around the task: at most once per such job.
    assert 1 <= stats.released <= len(v2_ids)

    Worker(new, concurrency=4).run(drain=True)

    assert sorted(name for label, name in ran if label == "new") == [
        f"report_v2 {n}" for n in range(3)
    ]
    for job_id in v2_ids:
        job = new.get_job(job_id)
        assert (job.state, job.attempts, job.last_error) == (JobState.SUCCEEDED, 1, None)


def _sample(port: int, name: str) -> float | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(rf'^{name}\{{queue="default"\}} (\S+)$', body, re.MULTILINE)
    return None if found is None else float(found.group(1))


def _given_back_so_far() -> float:
    value = metrics.registry().get_sample_value(
        "pgqueue_jobs_given_back_total", {"queue": "default"}
    )
    return float(value or 0.0)


def test_explain_and_metrics_name_jobs_no_live_worker_registers(
    database_url: URL,
) -> None:
    settings = Settings(poll_interval=0.2, lease_seconds=10.0, metrics_interval=0.3)
    old, new = _queue(database_url, settings), _queue(database_url, settings)
    try:
        ran: list[tuple[str, str]] = []
        _register(old, ran, "old", atomic=False)
        report = _register(new, ran, "new", atomic=False)
        report_v2 = _register_v2(new, ran, atomic=False)
        v2_ids = [report_v2.enqueue(n) for n in range(3)]
        report.enqueue(0)
        # The process's metrics outlive a test: count this test's give-backs from here.
        given_back_before = _given_back_so_far()
        port = free_port()
        worker = Worker(old, concurrency=2, metrics_port=port, worker_id="old-worker")
        with in_thread(worker):
            wait_until(lambda: ran == [("old", "report 0")], 20, "the old worker's run", 0.1)
            assert [w.tasks for w in old.admin.list_workers()] == [("report",)]
            wait_until(
                lambda: _sample(port, "pgqueue_queue_jobs_unregistered") == 3.0,
                20,
                "3 unregistered jobs in the metrics",
                0.1,
            )
            given_back = wait_until(
                lambda: _sample(port, "pgqueue_jobs_given_back_total"),
                20,
                "a give-back in the metrics",
                0.1,
            )
            assert given_back is not None and 1 <= given_back - given_back_before <= 3
            result = run_pgqueue("explain", str(v2_ids[0]), url=database_url)
            assert result.returncode == 0, result.stderr[-2000:]
            assert "no live worker registers task report_v2" in result.stdout, result.stdout
            assert "old-worker" in result.stdout
        for job_id in v2_ids:
            job = old.get_job(job_id)
            assert (job.state, job.attempts, job.last_error) == (JobState.QUEUED, 0, None)
    finally:
        old.dispose()
        new.dispose()
