"""A worker that claims ahead of its free slots runs each job once, and a stop gives the jobs it
claimed but did not start back to the queue with their attempt not counted."""

from __future__ import annotations

import threading
import time

from sqlalchemy import text
from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, PgQueue
from pgqueue.worker import Worker


def _attempts(pgq: PgQueue) -> dict[str, list[int]]:
    """``{state: [attempts of each job]}``."""
    with pgq.engine.connect() as connection:
        rows = connection.execute(text("SELECT state, attempts FROM pgqueue_jobs")).all()
    by_state: dict[str, list[int]] = {}
    for state, attempts in rows:
        by_state.setdefault(state, []).append(attempts)
    return by_state


def test_a_prefetching_worker_runs_each_job_exactly_once(pgq: PgQueue) -> None:
    jobs = 3_000
    ran: list[int] = []
    held: list[int] = []
    worker: Worker | None = None

    @pgq.task(name="prefetch.once", max_attempts=3)
    def once(n: int) -> None:
        ran.append(n)  # list.append is atomic under the GIL
        assert worker is not None
        held.append(len(worker.running_job_ids))

    once.enqueue_many([{"n": i} for i in range(jobs)])
    worker = Worker(pgq, concurrency=2, prefetch=100, listen=False)
    stats = worker.run(drain=True)
    assert sorted(ran) == list(range(jobs))
    assert stats.succeeded == stats.claimed == jobs
    assert _attempts(pgq) == {str(JobState.SUCCEEDED): [1] * jobs}
    # Without a prefetch at most 2 * concurrency attempts are held: it claimed ahead, and held
    # no more than twice the slots and the prefetch.
    assert 4 < max(held) <= 2 * (2 + 100)


def test_a_stop_gives_back_the_claimed_jobs_it_did_not_start(pgq: PgQueue) -> None:
    quick, jobs = 200, 400
    gate = threading.Event()
    blocked = threading.Semaphore(0)

    @pgq.task(name="prefetch.gated", max_attempts=3)
    def gated(n: int) -> None:
        if n >= quick:  # the quick ones build up the worker's pace, then both slots block
            blocked.release()
            gate.wait(30)

    gated.enqueue_many([{"n": i} for i in range(jobs)])
    worker = Worker(pgq, concurrency=2, prefetch=100, listen=False, shutdown_timeout=30)
    with in_thread(worker, before_stop=gate.set):
        for _ in range(2):
            assert blocked.acquire(timeout=30)
        time.sleep(0.2)  # a claim under way registers its jobs
        waiting = len(worker.running_job_ids) - 2
        worker.stop()
        # The unstarted ones are given back at once, not after the shutdown timeout.
        wait_until(
            lambda: _attempts(pgq).get(str(JobState.RUNNING)) == [1, 1],
            0.5,
            "only the two blocked jobs left running",
        )
        gate.set()
    stats = worker.stats
    assert waiting > 0 and stats.released == waiting
    assert stats.claimed == quick + 2 + stats.released
    assert stats.succeeded == quick + 2
    by_state = _attempts(pgq)
    assert by_state[str(JobState.SUCCEEDED)] == [1] * (quick + 2)
    # Given back and never claimed alike: queued, no attempt counted.
    assert by_state[str(JobState.QUEUED)] == [0] * (jobs - quick - 2)
    # And claimable again: a second worker runs each of them once.
    gate.set()
    again = Worker(pgq, concurrency=2, listen=False).run(drain=True)
    assert again.succeeded == jobs - quick - 2
    assert _attempts(pgq) == {str(JobState.SUCCEEDED): [1] * jobs}


def test_a_job_claimed_ahead_and_cancelled_before_its_start_never_runs(pgq: PgQueue) -> None:
    quick, jobs = 200, 260
    gate = threading.Event()
    blocked = threading.Semaphore(0)
    ran: list[int] = []

    @pgq.task(name="prefetch.cancelled_ahead", max_attempts=3)
    def gated(n: int) -> None:
        ran.append(n)
        if n in (quick, quick + 1):  # the quick ones build up the worker's pace
            blocked.release()
            gate.wait(30)

    ids = gated.enqueue_many([{"n": i} for i in range(jobs)])
    worker = Worker(pgq, concurrency=2, prefetch=100, listen=False, lease_seconds=0.9)
    with in_thread(worker, drain=True, before_stop=gate.set):
        for _ in range(2):
            assert blocked.acquire(timeout=30)
        time.sleep(0.2)  # a claim under way registers its jobs
        started = set(ids[: quick + 2])
        ahead = [job_id for job_id in worker.running_job_ids if job_id not in started]
        assert ahead, "the worker claimed nothing ahead"
        assert {pgq.cancel_job(job_id) for job_id in ahead} == {JobState.RUNNING}
        time.sleep(1.0)  # three heartbeats (every 0.3 s) bring the cancel requests
        gate.set()
        wait_until(lambda: worker.stats.finished is not None, 30, "the drain to end")
    index = {job_id: n for n, job_id in enumerate(ids)}
    assert not {index[job_id] for job_id in ahead} & set(ran)
    for job_id in ahead:
        job = pgq.get_job(job_id)
        assert job is not None
        assert (job.state, job.attempts) == (JobState.CANCELLED, 1)
        assert job.last_error == "cancelled before its handler started"
    assert worker.stats.cancelled == len(ahead)
