"""Per-job timeouts, ``async def`` handlers, the process pool, and the outcome log lines of a
worker process."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import App


def test_timeouts_are_retryable_failures_and_the_worker_keeps_going(app: App) -> None:
    # One slot: four handlers stuck past their timeout must not use up the worker's threads.
    worker = app.start_worker("--concurrency", "1")
    stuck = app.module.slow_sync.enqueue_many([{}] * 4)
    jobs = app.wait_final(stuck, timeout=60)
    for job in jobs.values():
        assert (job.state, job.attempts) == ("failed", 1)  # max_attempts=1
        assert "JobTimeout" in job.last_error and "0.5" in job.last_error
    # Async: the timeout is retryable (max_attempts=2: retried once, then failed).
    [slow] = app.module.async_slow.enqueue_many([{}])
    [job] = app.wait_final([slow], timeout=60).values()
    assert (job.state, job.attempts) == ("failed", 2)
    assert [e["attempt"] for e in job.errors] == [1, 2]
    assert all("timed out" in e["error"] or "Timeout" in e["error"] for e in job.errors)

    healthy = app.module.record.enqueue_many([{}] * 5)
    done = app.wait_final(healthy, timeout=10)
    assert {j.state for j in done.values()} == {"succeeded"}
    assert worker.popen.poll() is None


def test_a_process_pool_group_stops_timed_out_children_contains_crashes_and_recycles(
    app: App,
) -> None:
    """``pgqueue worker --processes 2 --pool process``: each worker process's slots run sync
    handlers in children; a timed-out one is stopped before it writes again, one that exits
    fails only its own attempts, and children are replaced after ``--max-tasks-per-child``."""
    stuck = app.module.slow_sync.enqueue_many([{}] * 2)
    [dies] = app.module.die.enqueue_many([{}])
    healthy = app.module.record.enqueue_many([{}] * 12)
    started = time.monotonic()
    group = app.start_worker(
        "--processes", "2", "--concurrency", "2", "--pool", "process", "--max-tasks-per-child", "3"
    )
    jobs = app.wait_final([*stuck, dies, *healthy], timeout=60)
    for job_id in stuck:
        assert (jobs[job_id].state, jobs[job_id].attempts) == ("failed", 1)
        assert "SIGTERM" in jobs[job_id].last_error
    assert (jobs[dies].state, jobs[dies].attempts) == ("failed", 3)  # max_attempts=3
    assert "ChildProcessDied" in jobs[dies].last_error
    assert "exited with code 1" in jobs[dies].last_error
    assert {jobs[job_id].state for job_id in healthy} == {"succeeded"}
    workers = set(app.children_of(group.pid))
    pids = {row.pid for row in app.ledger("done")}
    # Run in children of the worker processes, never in a worker process itself; at most three
    # jobs (and a crash's attempts) per child.
    assert not pids & workers and len(pids) >= 4
    # Past when the stuck handlers would have marked their return, had they lived on.
    time.sleep(max(started + 4.5 - time.monotonic(), 0))
    assert app.ledger("after deadline") == []
    group.signal(signal.SIGTERM)
    assert group.wait(30) == 0


def test_async_handlers_share_the_workers_event_loop(app: App) -> None:
    worker = app.start_worker("--concurrency", "4")
    ids = app.module.async_info.enqueue_many([{}] * 6)
    jobs = app.wait_final(ids, timeout=30)
    assert {j.state for j in jobs.values()} == {"succeeded"}
    infos = {row.info for row in app.ledger("async")}
    assert len(infos) == 1  # one loop, one thread, for every async job
    [info] = infos
    assert info.startswith("pgqueue-asyncio ")
    assert {row.pid for row in app.ledger("async")} == {worker.pid}


def test_one_log_line_per_outcome_without_args(app: App) -> None:
    worker = app.start_worker("--concurrency", "4", log_successes="true")
    ids = app.module.record.enqueue_many([{"secret": "hunter2-personal-data"}] * 7)
    app.wait_final(ids, timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    lines = [line for line in worker.log().splitlines() if " outcome=" in line]
    assert len(lines) == 7, lines
    for job_id in ids:
        [line] = [line for line in lines if f"job {job_id} " in line]
        assert "task=record attempt=1 outcome=complete duration_ms=" in line
    assert "hunter2" not in worker.log()


def test_by_default_only_the_problems_and_a_summary_are_logged(app: App) -> None:
    worker = app.start_worker("--concurrency", "4", log_summary_interval="0.01")
    ok = app.module.record.enqueue_many([{}] * 5)
    # fail_ratio 1: both attempts fail, so the job logs one retry and one failure.
    failing = app.module.flaky.enqueue(fail_ratio=1.0)
    jobs = app.wait_final([*ok, failing], timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert {jobs[i].state for i in ok} == {"succeeded"}
    assert jobs[failing].state == "failed"
    lines = [line for line in worker.log().splitlines() if " outcome=" in line]
    assert [line.split(" outcome=")[1].split()[0] for line in lines] == ["retry", "fail"], lines
    assert all(f"job {failing} " in line for line in lines)
    assert "error=RuntimeError: flaky job failed on purpose" in lines[-1]
    # The retry waits 0.05 s, past the summary interval: its outcome brings a summary line.
    summaries = [line for line in worker.log().splitlines() if " jobs/s): succeeded " in line]
    assert summaries, worker.log()
    assert all(" INFO pgqueue.worker: " in line for line in summaries), summaries
