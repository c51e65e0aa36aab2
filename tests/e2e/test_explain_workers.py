"""``pgqueue explain ID`` on the blockers that involve workers, with real ``pgqueue worker``
processes registered in the worker registry: the lease of a running job held by a named
worker (host, pid, last seen N s ago, and "not live" once it was SIGKILLed and went stale), a
queue no live worker serves, and a ready job's position in line behind a busy worker."""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import TYPE_CHECKING, Any

from support.processes import run_pgqueue

if TYPE_CHECKING:
    from conftest import App

# Short enough for the test to see a killed worker go stale; the heartbeat (a third of the
# lease) refreshes a live worker's row several times within it.
FAST = {"lease_seconds": 1.5, "worker_stale_seconds": 3, "poll_interval": 0.1}


def explain(app: App, job_id: int) -> tuple[dict[str, Any], list[str]]:
    """``pgqueue explain JOB_ID`` as JSON and as text (run in this process, as it is asked
    again and again)."""
    env = app.env(database_url=app.url_string, **FAST)
    answers = []
    for extra in (["--json"], []):
        result = run_pgqueue("explain", str(job_id), *extra, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        answers.append(result.stdout)
    return json.loads(answers[0]), answers[1].splitlines()


def state_of(app: App, job_id: int) -> str:
    return str(app.scalars("SELECT state FROM pgqueue_jobs WHERE id = :id", id=job_id)[0])


def lease_owner(app: App, job_id: int) -> str:
    return str(app.scalars("SELECT lease_owner FROM pgqueue_jobs WHERE id = :id", id=job_id)[0])


def test_lease_holder_is_named_with_its_last_seen_age_and_goes_stale_when_killed(
    app: App,
) -> None:
    worker = app.start_worker("--queues", "held", "--concurrency", "1", **FAST)
    job = app.module.sleep.configure(queue="held").enqueue(120)
    app.wait_until(lambda: state_of(app, job) == "running", 60, "the job to run")
    owner = lease_owner(app, job)

    def held_by_live_worker() -> tuple[dict[str, Any], list[str]] | None:
        data, lines = explain(app, job)
        blocker = data["blockers"][0]
        return (data, lines) if blocker["data"]["live"] else None

    data, lines = app.wait_until(held_by_live_worker, 60, "the worker to be registered")
    assert data["state"] == "running"
    [blocker] = data["blockers"]
    assert blocker["kind"] == "lease_held"
    assert blocker["data"]["worker_id"] == owner
    assert blocker["data"]["pid"] == worker.pid
    assert blocker["data"]["host"] == socket.gethostname()
    assert 0 <= blocker["data"]["last_seen_seconds"] < 3
    assert (
        f"lease held by worker {owner} (host {socket.gethostname()}, pid {worker.pid}), "
        "last seen " in lines[1]
    ), lines

    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)

    def stale() -> tuple[dict[str, Any], list[str]] | None:
        data, lines = explain(app, job)
        return None if data["blockers"][0]["data"]["live"] else (data, lines)

    data, lines = app.wait_until(stale, 60, "the killed worker to go stale", interval=0.5)
    [blocker] = data["blockers"]
    assert blocker["data"]["worker_id"] == owner
    assert blocker["data"]["last_seen_seconds"] >= 3
    assert "(not live)" in lines[1], lines
    # No live worker is left to rescue it: its lease has lapsed, and explain says what follows.
    assert "lease expired" in lines[1] and "rescue pass re-queues it" in lines[1], lines


def test_queue_without_a_live_worker_and_position_in_line_behind_a_busy_worker(
    app: App,
) -> None:
    worker = app.start_worker("--queues", "busy", "--concurrency", "1", **FAST)
    sleep = app.module.sleep
    first = sleep.configure(queue="busy").enqueue(120)
    app.wait_until(lambda: state_of(app, first) == "running", 60, "the first job to run")
    owner = lease_owner(app, first)
    behind = [sleep.configure(queue="busy").enqueue(120) for _ in range(3)]
    elsewhere = sleep.configure(queue="elsewhere").enqueue(120)

    data, lines = explain(app, behind[2])
    assert [b["kind"] for b in data["blockers"]] == ["ready"], lines
    assert data["blockers"][0]["data"]["position"] == 2
    assert data["blockers"][0]["data"]["workers"] == [owner]
    assert lines[1] == (
        f"  ready: claimable now, 2 jobs of queue busy ahead of it; live workers serving the "
        f"queue: {owner}"
    )
    data, lines = explain(app, behind[0])
    assert data["blockers"][0]["data"]["position"] == 0
    assert "it is next in line" in lines[1]

    data, lines = explain(app, elsewhere)
    assert [b["kind"] for b in data["blockers"]] == ["no_live_worker"], lines
    assert lines[1] == (
        "  no_live_worker: no live worker serves queue elsewhere (1 live worker claims other "
        "queues): start one with `pgqueue worker APP --queues elsewhere`"
    )
    assert worker.popen.poll() is None  # busy, alive: the position above is behind it
