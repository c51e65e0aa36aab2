"""Workers that die, freeze or crash on purpose: leases expire, rescue re-runs, fencing holds."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import App


def test_sigkill_with_20_running_jobs_second_worker_finishes_all(app: App) -> None:
    first = app.start_worker("--concurrency", "20", "--lease-seconds", "2", rescue_interval=0.5)
    ids = app.module.sleep.enqueue_many([{"seconds": 60, "first_run_only": True}] * 20)
    app.wait_until(lambda: len(app.ledger("start")) == 20, 30, "20 running jobs")
    assert {j.state for j in app.jobs(ids).values()} == {"running"}
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    second = app.start_worker("--concurrency", "20", "--lease-seconds", "2", rescue_interval=0.5)
    jobs = app.wait_final(ids, timeout=60)
    assert {j.state for j in jobs.values()} == {"succeeded"}
    assert [j.attempts for j in jobs.values()] == [2] * 20
    for job in jobs.values():
        assert [e["attempt"] for e in job.errors] == [1]
        assert "lease expired" in job.errors[0]["error"]
        assert job.result["pid"] == second.pid
    assert app.scalars("SELECT count(*) FROM pgqueue_jobs WHERE state = 'running'") == [0]
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    # Each job started twice, once per worker; only the second run ended.
    starts = app.ledger("start")
    assert sorted((r.job_id, r.attempt) for r in starts) == sorted(
        [(i, 1) for i in ids] + [(i, 2) for i in ids]
    )
    assert {r.pid for r in app.ledger("end")} == {second.pid}


def test_an_atomic_run_lost_with_its_worker_is_rescued_with_its_attempt_counted(
    app: App,
) -> None:
    """SIGKILL ends the handler's transaction and rolls its writes back, but the claim had
    committed on its own: the job stays RUNNING until its lease expires, then the rescue
    counts the attempt (attempt 2 runs, not attempt 1 again) or, with attempts used up, fails
    the job without running it."""
    env = {**app.env(rescue_interval=0.5), "E2E_ATOMIC": "1"}
    lease = ("--lease-seconds", "2")
    first = app.start_worker_with_env(env, "--concurrency", "2", *lease)
    again, used_up = app.module.atomic_sleep.enqueue_many([{"seconds": 60}] * 2)
    app.execute("UPDATE pgqueue_jobs SET max_attempts = 1 WHERE id = :id", id=used_up)
    app.wait_until(lambda: len(app.ledger("start")) == 2, 30, "both atomic jobs to start")
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    second = app.start_worker_with_env(env, "--concurrency", "2", *lease)
    jobs = app.wait_final([again, used_up], timeout=60)
    assert (jobs[again].state, jobs[again].attempts) == ("succeeded", 2)
    assert [e["attempt"] for e in jobs[again].errors] == [1]
    assert "lease expired" in jobs[again].errors[0]["error"]
    assert (jobs[used_up].state, jobs[used_up].attempts) == ("failed", 1)
    assert "lease expired" in (jobs[used_up].last_error or "")
    starts = sorted((r.job_id, r.attempt, r.pid) for r in app.ledger("start"))
    assert starts == sorted(
        [(again, 1, first.pid), (again, 2, second.pid), (used_up, 1, first.pid)]
    )
    assert [(r.job_id, r.attempt) for r in app.ledger("done")] == [(again, 2)]


def test_zombie_worker_late_completion_changes_nothing(app: App) -> None:
    zombie = app.start_worker("--concurrency", "2", "--lease-seconds", "2", rescue_interval=0.5)
    [job_id] = app.module.sleep.enqueue_many([{"seconds": 3, "first_run_only": True}])
    app.wait_until(lambda: app.ledger("start"), 30, "the job to start")
    zombie.signal(signal.SIGSTOP)
    try:
        rescuer = app.start_worker(
            "--concurrency", "2", "--lease-seconds", "2", rescue_interval=0.5
        )
        [job] = app.wait_final([job_id], timeout=60).values()
        assert (job.state, job.attempts, job.result["pid"]) == ("succeeded", 2, rescuer.pid)
        # Succeeded: last_error is cleared, and attempt 1's rescue stays in the history.
        assert job.last_error is None
        assert [e["attempt"] for e in job.errors] == [1]
        assert "lease expired" in job.errors[0]["error"]
        # The frozen worker's handler has slept past its 3 s (wall clock) meanwhile.
        time.sleep(max(0.0, 3.5 - 2))
    finally:
        zombie.signal(signal.SIGCONT)

    # Its handler ends, its outcome write matches no row (fencing token), it says so and lives.
    app.wait_until(lambda: "lease lost" in zombie.log(), 30, "the zombie to report its lost lease")
    app.wait_until(
        lambda: [r for r in app.ledger("end") if r.pid == zombie.pid], 30, "the zombie to finish"
    )
    time.sleep(0.5)  # any (wrong) write of the zombie would have landed by now
    [after] = app.jobs([job_id]).values()
    assert after == job
    assert zombie.popen.poll() is None
    assert "Traceback" not in zombie.log()


def test_handler_killing_its_worker_ends_failed_and_neighbours_succeed(app: App) -> None:
    # The supervisor (2 processes) restarts each worker the bad job kills.
    supervisor = app.start_worker(
        "--processes", "2", "--concurrency", "4", "--lease-seconds", "2", rescue_interval=0.5
    )
    [bad] = app.module.die.enqueue_many([{}])
    good = app.module.healthy.enqueue_many([{}] * 100)
    jobs = app.wait_final([bad, *good], timeout=120)
    assert (jobs[bad].state, jobs[bad].attempts) == ("failed", 3)
    assert [e["attempt"] for e in jobs[bad].errors] == [1, 2, 3]
    assert all("lease expired" in e["error"] for e in jobs[bad].errors)
    assert [(r.job_id, r.attempt) for r in app.ledger("start")] == [(bad, 1), (bad, 2), (bad, 3)]
    assert {jobs[i].state for i in good} == {"succeeded"}
    # Every healthy job ran to completion exactly once (crashes may have repeated some runs
    # that were in flight, which the ledger shows as extra rows with a higher attempt).
    done = app.ledger("done")
    assert {r.job_id for r in done} == set(good)
    assert supervisor.popen.poll() is None
    assert supervisor.log().count("starting a new one") >= 3
