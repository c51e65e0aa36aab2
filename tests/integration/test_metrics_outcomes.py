"""A worker records its outcomes, claims and gauges in ``pgqueue.metrics`` when metrics are on,
atomic jobs and retries included, and leaves the registry alone when they are off."""

from __future__ import annotations

import threading

import pytest
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobContext, PgQueue, backoff, metrics
from pgqueue.worker import Worker


def value(recorded: metrics.Metrics, name: str, **labels: str) -> float:
    found = recorded.registry.get_sample_value(name, labels)
    return 0.0 if found is None else float(found)


def test_retries_atomic_jobs_and_claims_are_counted(
    pgq: PgQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = metrics.Metrics()
    monkeypatch.setattr(metrics, "_active", recorded)

    @pgq.task(name="flaky", retry=backoff.constant(0), max_attempts=2, pass_context=True)
    def flaky(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    @pgq.task(name="atomic_ok", atomic=True, queue="books")
    def atomic_ok() -> None:
        pass

    flaky.enqueue()
    atomic_ok.enqueue()
    stats = Worker(pgq, concurrency=2).run(drain=True)
    assert (stats.succeeded, stats.retried) == (2, 1)

    finished = "pgqueue_jobs_finished_total"
    assert value(recorded, finished, queue="default", task="flaky", outcome="retried") == 1
    assert value(recorded, finished, queue="default", task="flaky", outcome="succeeded") == 1
    assert value(recorded, finished, queue="books", task="atomic_ok", outcome="succeeded") == 1
    durations = "pgqueue_job_duration_seconds_count"
    assert value(recorded, durations, queue="default", task="flaky") == 2
    assert value(recorded, "pgqueue_claims_total") == stats.claimed == 3


def test_metrics_off_records_nothing(pgq: PgQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_active", None)

    @pgq.task(name="noop")
    def noop() -> None:
        pass

    noop.enqueue()
    worker = Worker(pgq, concurrency=1)
    assert worker.metrics is metrics.NO_METRICS
    assert worker.run(drain=True).succeeded == 1
    assert metrics.active() is metrics.NO_METRICS


def test_running_gauge_counts_atomic_jobs_while_they_run(
    pgq: PgQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = metrics.Metrics()
    monkeypatch.setattr(metrics, "_active", recorded)
    release = threading.Event()

    @pgq.task(name="atomic_wait", atomic=True, queue="books")
    def atomic_wait() -> None:
        release.wait(30)

    atomic_wait.enqueue()
    with in_thread(Worker(pgq, concurrency=2), before_stop=release.set):
        gauge = "pgqueue_jobs_running"
        wait_until(lambda: value(recorded, gauge, queue="books") == 1, 15, "the atomic job counted")
        release.set()
        wait_until(lambda: value(recorded, gauge, queue="books") == 0, 15, "its end counted")
