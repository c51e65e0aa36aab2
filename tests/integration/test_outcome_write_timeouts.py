"""An outcome whose write times out behind another transaction's row lock is written later,
never recorded as a failed attempt.

An operator's ``SELECT ... FOR UPDATE``, a large bulk action or a long atomic job can hold the
rows an outcome must update for longer than pgqueue's ``statement_timeout``. The outcome itself
is right: the job succeeded. It must be written once the rows are free, not replaced by a failed
attempt (which would run the handler again).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, PgQueue, Settings
from pgqueue.worker import Worker


def test_an_outcome_write_that_times_out_on_a_held_row_is_retried(
    database_url: URL, engine: Engine
) -> None:
    pgq = PgQueue(
        database_url.render_as_string(hide_password=False),
        settings=Settings(statement_timeout_ms=500, poll_interval=0.2, lease_seconds=30.0),
    )
    release = threading.Event()
    runs: list[int] = []

    @pgq.task(name="held.job", max_attempts=3)
    def held_job() -> str:
        runs.append(1)
        release.wait(20)
        return "done"

    job_id = held_job.enqueue()
    try:
        with in_thread(Worker(pgq, concurrency=1), before_stop=release.set):
            wait_until(lambda: pgq.get_job(job_id).state is JobState.RUNNING, 10, "the job to run")
            with engine.connect() as holder:
                holder.execute(
                    text("SELECT id FROM pgqueue_jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
                )
                release.set()
                # Several statement timeouts of the outcome write while the row is held.
                time.sleep(2.5)
                assert pgq.get_job(job_id).state is JobState.RUNNING
                holder.commit()
            wait_until(lambda: pgq.get_job(job_id).state.is_final, 10, "the outcome to be written")
    finally:
        pgq.dispose()
    with engine.connect() as connection:
        job = connection.execute(
            text("SELECT state, attempts, errors, result FROM pgqueue_jobs WHERE id = :id"),
            {"id": job_id},
        ).one()
    assert job.state == "succeeded", job
    assert job.attempts == 1 and job.errors == [], job
    assert runs == [1]
