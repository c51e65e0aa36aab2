"""The worker registry: a worker's row is written before it claims, refreshed by its heartbeat
(idle or holding leases), deleted at a clean stop; stale rows are hidden and deleted; the admin
API lists workers with their running jobs and names the worker holding a job."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import PgQueue
from pgqueue.data import workers as workers_data
from pgqueue.db import ConnectionExecutor
from pgqueue.errors import ValidationError
from pgqueue.jobs import WorkerEntry
from pgqueue.worker import Worker
from pgqueue.worker.registry import pgqueue_version


def _last_seen(pgq: PgQueue, worker_id: str) -> Any:
    with pgq.engine.connect() as connection:
        return connection.execute(
            text("SELECT last_seen_at FROM pgqueue_workers WHERE id = :id"), {"id": worker_id}
        ).scalar()


def _hold_jobs(pgq: PgQueue, count: int) -> tuple[threading.Event, list[int]]:
    release = threading.Event()
    started = threading.Semaphore(0)

    @pgq.task(name="hold", max_attempts=1)
    def hold() -> None:
        started.release()
        release.wait(30)

    ids = hold.enqueue_many([{}] * count)
    return release, ids


def test_a_worker_registers_before_claiming_and_removes_its_row_at_a_clean_stop(
    pgq: PgQueue,
) -> None:
    release, [job_id] = _hold_jobs(pgq, 1)
    worker = Worker(pgq, queues=["default", "mail"], concurrency=3)
    with in_thread(worker, before_stop=release.set):
        # Whoever sees the job RUNNING sees its holder registered.
        wait_until(lambda: pgq.get_job(job_id).state == "running", 20, "the job to run")
        [info] = pgq.admin.list_workers()
        assert info.id == worker.worker_id == pgq.get_job(job_id).lease_owner
        assert (info.host, info.pid) == (socket.gethostname(), os.getpid())
        assert (info.queues, info.concurrency) == (("default", "mail"), 3)
        assert info.version == pgqueue_version() != "unknown"
        assert info.live and info.running == 1 and 0 <= info.seconds_since_seen < 5
        assert info.started_at <= info.last_seen_at
        release.set()
    assert pgq.admin.list_workers(include_stale=True) == []


def test_a_worker_records_its_pool(pgq: PgQueue) -> None:
    threads = Worker(pgq, queues=["t"], concurrency=1, maintenance=False)
    processes = Worker(pgq, queues=["p"], concurrency=1, maintenance=False, pool="process")
    with in_thread(threads), in_thread(processes):
        wait_until(lambda: len(pgq.admin.list_workers()) == 2, 20, "both workers registered")
        pools = {w.id: w.pool for w in pgq.admin.list_workers()}
    assert pools == {threads.worker_id: "thread", processes.worker_id: "process"}


def test_an_idle_worker_and_a_busy_one_refresh_their_rows(pgq: PgQueue) -> None:
    # Stale after 1.5 s: refreshed at least every 0.5 s whether or not leases are extended.
    pgq.settings = pgq.settings.replace(worker_stale_seconds=1.5)
    idle = Worker(pgq, queues=["nothing-here"], concurrency=1, maintenance=False)
    release, _ = _hold_jobs(pgq, 2)
    busy = Worker(pgq, queues=["default"], concurrency=2, maintenance=False, lease_seconds=60)
    with in_thread(idle), in_thread(busy, before_stop=release.set):
        wait_until(
            lambda: (
                {w.id: w.running for w in pgq.admin.list_workers()}
                == {idle.worker_id: 0, busy.worker_id: 2}
            ),
            20,
            "both workers, the busy one holding its two jobs",
        )
        first = {w: _last_seen(pgq, w.worker_id) for w in (idle, busy)}
        time.sleep(2.0)  # past the stale interval: only refreshes keep them listed
        for worker in (idle, busy):
            assert _last_seen(pgq, worker.worker_id) > first[worker]
        assert {w.id for w in pgq.admin.list_workers()} == {idle.worker_id, busy.worker_id}
        release.set()


def test_stale_rows_are_hidden_and_deleted_by_maintenance(pgq: PgQueue) -> None:
    with pgq.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version, "
                "started_at, last_seen_at) VALUES ('gone', 'elsewhere', 4242, '{}', 5, '0.0.1', "
                "now() - interval '2 hours', now() - interval '1 hour')"
            )
        )
    assert pgq.admin.list_workers() == []
    with pytest.raises(ValidationError, match="include_stale must be a bool, got 'yes'"):
        pgq.admin.list_workers(include_stale="yes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="job id must be a positive int"):
        pgq.admin.job_holder(0)
    [stale] = pgq.admin.list_workers(include_stale=True)
    assert (stale.id, stale.live, stale.running) == ("gone", False, 0)
    assert stale.seconds_since_seen > 3500
    worker = Worker(pgq, concurrency=1)  # maintenance every rescue_interval (0.5 s)
    with in_thread(worker):
        wait_until(
            lambda: (
                [w.id for w in pgq.admin.list_workers(include_stale=True)] == [worker.worker_id]
            ),
            20,
            "the stale row to be deleted",
        )


def test_job_holder_names_the_registered_worker_or_says_it_is_gone(pgq: PgQueue) -> None:
    release, [job_id] = _hold_jobs(pgq, 1)
    assert pgq.admin.job_holder(job_id) is None  # queued: nobody holds it
    worker = Worker(pgq, concurrency=1, maintenance=False, lease_seconds=60)
    with in_thread(worker, before_stop=release.set):
        wait_until(lambda: pgq.get_job(job_id).state == "running", 20, "the job to run")
        holder = pgq.admin.job_holder(job_id)
        assert holder is not None
        assert (holder.worker_id, holder.host, holder.pid) == (
            worker.worker_id,
            socket.gethostname(),
            os.getpid(),
        )
        assert holder.registered and holder.live and holder.seconds_since_seen is not None
        with pgq.engine.begin() as connection:
            connection.execute(text("DELETE FROM pgqueue_workers"))
        gone = pgq.admin.job_holder(job_id)
        assert gone is not None
        assert (gone.worker_id, gone.registered, gone.live, gone.host) == (
            worker.worker_id,
            False,
            False,
            None,
        )
        release.set()
        wait_until(lambda: pgq.get_job(job_id).state == "succeeded", 20, "the job to end")
    assert pgq.admin.job_holder(job_id) is None


def test_a_heartbeat_committed_after_the_reader_began_never_reads_as_a_negative_age(
    pgq: PgQueue,
) -> None:
    entry = WorkerEntry(
        id="w-clock", host="h", pid=1, queues=("default",), concurrency=1, version="test"
    )
    with pgq.engine.connect() as reader:
        reader.execute(text("SELECT 1"))  # the reader's transaction, and its now(), begin here
        time.sleep(0.2)
        with pgq.engine.begin() as writer:
            workers_data.worker_seen(ConnectionExecutor(writer), entry)
        rows = workers_data.list_workers(ConnectionExecutor(reader), 60)
        [seen_seconds] = [row[8] for row in rows if row[0] == "w-clock"]
        assert 0 <= float(seen_seconds) < 1
