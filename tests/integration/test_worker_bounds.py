"""What a long-lived worker keeps stays bounded, however its jobs misbehave.

- A sync handler that hangs past its task's timeout cannot be stopped; its slot goes to a new
  thread while it runs on, but only while fewer than ``max(concurrency, MIN_HUNG_THREADS)``
  threads are in that state. Past the bound a timed-out handler keeps its slot until it
  returns, and the worker runs fewer jobs at once instead of growing threads without end.
  Threads come back to the pool's size once the handlers return.
- A job's ``errors`` history keeps the last ``ERROR_HISTORY`` attempts, however many it had.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import Engine, text
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, PgQueue, backoff
from pgqueue.sql.common import ERROR_HISTORY
from pgqueue.testing import run_until_final, states_of, wait_for_states
from pgqueue.worker import Worker
from pgqueue.worker.slots import MIN_HUNG_THREADS


def _pool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("pgqueue-slot"))


@pytest.mark.slow
def test_threads_of_hung_handlers_are_bounded(
    pgq: PgQueue, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    bound = MIN_HUNG_THREADS  # max(concurrency=1, MIN_HUNG_THREADS)

    @pgq.task(name="bounds.hangs", max_attempts=1, timeout=0.1)
    def hangs() -> None:
        release.wait(60)

    jobs = bound + 4
    ids = hangs.enqueue_many([{}] * jobs)
    # No prefetch: the jobs the hung handlers keep from starting stay queued.
    worker = Worker(pgq, concurrency=1, prefetch=0)
    before = _pool_threads()
    with in_thread(worker, before_stop=release.set, join_timeout=60):
        # ``bound`` handlers time out and hand their slot on; the next one keeps it. Each job
        # stays held (running) until its thread returns.
        wait_until(lambda: "keeps its slot until it returns" in caplog.text, 30, "the bound")
        time.sleep(1.0)  # many timeouts' worth: nothing more starts, no thread is added
        states = states_of(pgq, ids)
        assert [states[i] for i in ids] == [JobState.RUNNING] * (bound + 1) + [JobState.QUEUED] * 3
        # The pool (concurrency + 2 threads) plus one thread per hung handler replaced.
        assert _pool_threads() - before == 1 + 2 + bound

        release.set()
        final = wait_for_states(pgq, ids, timeout=30)
        assert [final[i] for i in ids] == [JobState.FAILED] * (bound + 1) + [JobState.SUCCEEDED] * 3
        wait_until(lambda: _pool_threads() - before == 1 + 2, 10, "the replaced threads' end")
        # Replacement threads are not remembered once started: the worker's list stays short.
        assert not [t for t in worker._threads if t.name.startswith("pgqueue-slot-replacement")]
    for job_id in ids[: bound + 1]:
        assert "JobTimeout" in (pgq.get_job(job_id).last_error or "")


def test_errors_history_keeps_the_last_attempts(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="bounds.always_fails", max_attempts=ERROR_HISTORY + 4, retry=backoff.constant(0))
    def always_fails() -> None:
        raise RuntimeError("x" * 10_000)

    job_id = always_fails.enqueue()
    assert run_until_final(pgq, [job_id], timeout=60) == {job_id: JobState.FAILED}
    job = pgq.get_job(job_id)
    assert job.attempts == ERROR_HISTORY + 4
    assert [e["attempt"] for e in job.errors] == list(range(5, ERROR_HISTORY + 5))
    assert job.last_error == job.errors[-1]["error"]


def test_a_longer_history_written_before_is_cut_at_the_next_error(
    pgq: PgQueue, engine: Engine
) -> None:
    @pgq.task(name="bounds.fails_once", max_attempts=1)
    def fails_once() -> None:
        raise RuntimeError("the last one")

    job_id = fails_once.enqueue()
    old = [{"attempt": -n, "at": None, "error": "old"} for n in range(30, 0, -1)]
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE pgqueue_jobs SET errors = CAST(:v AS jsonb) WHERE id = :id"),
            {"v": json.dumps(old), "id": job_id},
        )
    assert run_until_final(pgq, [job_id]) == {job_id: JobState.FAILED}
    errors = pgq.get_job(job_id).errors
    assert [e["attempt"] for e in errors] == [*range(-(ERROR_HISTORY - 1), 0), 1]
    assert "RuntimeError: the last one" in errors[-1]["error"]
