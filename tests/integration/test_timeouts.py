"""A task's ``timeout=`` ends its attempt on time, in each mode, and leaves no write behind.

- Leased: the attempt is failed at its deadline whatever the heartbeat's interval (a worker
  idle since long before the job, with a 20 s heartbeat), and the writes of the handler's
  ``ctx.session`` are rolled back when the handler returns after it, never committed.
- Atomic: at the deadline the attempt's transaction is ended on the server, so its writes roll
  back while the handler still runs, and the failed attempt is written at once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, text
from support.workers import in_thread

from pgqueue import JobContext, JobState, PgQueue
from pgqueue.config import Settings
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

TIMEOUT = 1.0
# Deadline to the attempt's end as the database recorded it: generous for a loaded machine, and
# far below the 20 s heartbeat interval a check riding on the heartbeat would need.
LATE_BY_AT_MOST = 1.5


@pytest.fixture
def settings() -> Settings:
    # Leases of 60 s: the heartbeat beats every 20 s, so only a deadline of its own ends an
    # attempt on time.
    return Settings(poll_interval=0.2, rescue_interval=0.5, lease_seconds=60.0)


@pytest.fixture
def side_table(engine: Engine) -> Iterator[None]:
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE timeout_effect (job_id bigint, attempt int)"))
    yield
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE timeout_effect"))


def _effects(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT count(*) FROM timeout_effect")).scalar_one())


def _write_effect(ctx: JobContext) -> None:
    ctx.session.execute(
        text("INSERT INTO timeout_effect VALUES (:job, :attempt)"),
        {"job": ctx.job_id, "attempt": ctx.attempt},
    )


def _seconds_past_deadline(pgq: PgQueue, job_id: int) -> float:
    job = pgq.get_job(job_id)
    assert job.started_at is not None and job.finished_at is not None
    return (job.finished_at - job.started_at).total_seconds() - TIMEOUT


@pytest.mark.parametrize("atomic", [False, True], ids=["leased", "atomic"])
def test_a_timed_out_attempt_ends_on_time_and_its_writes_never_commit(
    pgq: PgQueue, engine: Engine, side_table: None, atomic: bool
) -> None:
    release = threading.Event()
    session_ended = threading.Event()
    ends: list[str] = []

    def _ended(name: str, session: object) -> None:
        ends.append(name)
        session_ended.set()

    @pgq.task(
        name=f"timeouts.hangs_{'atomic' if atomic else 'leased'}",
        timeout=TIMEOUT,
        max_attempts=1,
        atomic=atomic,
        pass_context=True,
    )
    def hangs(ctx: JobContext) -> str:
        _write_effect(ctx)
        if not atomic:
            # How the worker ends this session after the handler returns: commit or rollback.
            for name in ("after_commit", "after_rollback"):
                event.listen(ctx.session, name, functools.partial(_ended, name))
        release.wait(30)
        return "returned after its deadline"

    with in_thread(Worker(pgq, concurrency=2), before_stop=release.set):
        job_id = hangs.enqueue()
        assert wait_for_states(pgq, [job_id], timeout=30) == {job_id: JobState.FAILED}
        # Failed while its handler still runs, in time.
        assert not release.is_set()
        assert _seconds_past_deadline(pgq, job_id) < LATE_BY_AT_MOST
        job = pgq.get_job(job_id)
        assert "JobTimeout" in (job.last_error or "")
        assert _effects(engine) == 0
        release.set()
        if not atomic:
            assert session_ended.wait(30), "the handler's session never ended"
    # The worker stopped after the handler returned: nothing more was written.
    assert _effects(engine) == 0
    if not atomic:
        assert ends == ["after_rollback"]
    job = pgq.get_job(job_id)
    assert (job.state, job.attempts, len(job.errors)) == (JobState.FAILED, 1, 1)
