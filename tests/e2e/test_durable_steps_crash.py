"""Durable steps across real worker processes: a worker SIGKILLed after step 2 was saved, and a
worker frozen past its lease in the middle of a step, each rescued by another worker.

Every step writes a ledger row on its own connection (committed at once, like an outside call),
so the ledger counts how often each step ran, whatever became of the attempt that ran it.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import App, WorkerProcess

# Appended to the e2e application module (``e2eapp.py``): its ``pgq`` is what the workers serve,
# and its ``mark`` commits a ledger row at once on a connection of its own.
STEPS_APP = """

# --- durable steps crash tests ---


def note(ctx, tag, info=""):
    mark(ctx, tag, info)
    return {"tag": tag, "pid": os.getpid(), "attempt": ctx.attempt}


@pgq.task(name="three_steps", pass_context=True, max_attempts=3, retry=backoff.constant(0.1))
def three_steps(ctx):
    one = ctx.step("one", note, ctx, "step1")
    two = ctx.step("two", note, ctx, "step2")
    note(ctx, "after-two")
    if ctx.attempt == 1:
        time.sleep(60)  # killed here, after step 2 was saved
    three = ctx.step("three", note, ctx, "step3")
    return [one, two, three]


@pgq.task(name="slow_step", pass_context=True, max_attempts=3, retry=backoff.constant(0.1))
def slow_step(ctx):
    def call(seconds):
        note(ctx, "call", ctx.step_key("call"))
        time.sleep(seconds)
        return {"pid": os.getpid(), "attempt": ctx.attempt}

    try:
        result = ctx.step("call", call, 4.0 if ctx.attempt == 1 else 0.0)
    except Exception as exc:
        note(ctx, "step-error", f"{type(exc).__name__}: {exc}")
        raise
    return result
"""


def start(app: App) -> WorkerProcess:
    """A worker process with a 2 s lease and a fast rescue."""
    return app.start_worker(
        "--concurrency", "2", "--lease-seconds", "2", rescue_interval=0.5, poll_interval=0.2
    )


def enqueue(app: App, task: str) -> int:
    """``task`` of the tasks above, enqueued for the worker processes."""
    return app.enqueue_stand_in(task, STEPS_APP)


def tags(app: App, job_id: int) -> list[tuple[str, int, int]]:
    return [(row.tag, row.attempt, row.pid) for row in app.ledger() if row.job_id == job_id]


def test_killed_after_step_two_the_rescue_runs_only_step_three(app: App) -> None:
    job_id = enqueue(app, "three_steps")
    first = start(app)
    app.wait_until(lambda: app.ledger("after-two"), 30, "step 2 to be saved")
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert app.scalars(
        "SELECT name FROM pgqueue_job_steps WHERE job_id = :id ORDER BY name", id=job_id
    ) == ["one", "two"]

    second = start(app)
    [job] = app.wait_final([job_id], timeout=60).values()
    assert (job.state, job.attempts) == ("succeeded", 2)
    assert "lease expired" in job.errors[0]["error"]
    assert tags(app, job_id) == [
        ("step1", 1, first.pid),
        ("step2", 1, first.pid),
        ("after-two", 1, first.pid),
        ("after-two", 2, second.pid),
        ("step3", 2, second.pid),
    ]
    # Steps 1 and 2 came back from the first worker's saved results.
    assert [step["pid"] for step in job.result] == [first.pid, first.pid, second.pid]
    assert app.scalars(
        "SELECT name FROM pgqueue_job_steps WHERE job_id = :id ORDER BY completed_at", id=job_id
    ) == ["one", "two", "three"]


def test_a_worker_frozen_mid_step_cannot_save_it_and_both_calls_carry_one_key(app: App) -> None:
    job_id = enqueue(app, "slow_step")
    zombie = start(app)
    app.wait_until(lambda: app.ledger("call"), 30, "the step to start")
    zombie.signal(signal.SIGSTOP)
    try:
        rescuer = start(app)
        [job] = app.wait_final([job_id], timeout=60).values()
        assert (job.state, job.attempts) == ("succeeded", 2)
        assert job.result == {"pid": rescuer.pid, "attempt": 2}
    finally:
        zombie.signal(signal.SIGCONT)
    # The frozen worker's step returns, its save is refused: it did not hold the lease.
    app.wait_until(lambda: app.ledger("step-error"), 30, "the stale attempt's refused save")
    [refused] = app.ledger("step-error")
    assert (refused.attempt, refused.pid) == (1, zombie.pid)
    assert refused.info.startswith("LeaseLost: step 'call' of job")
    time.sleep(0.5)
    # The step ran twice (the documented lease-lost case), with the same idempotency key; the
    # saved result is the rescuer's, and the job is as the rescuer left it.
    calls = app.ledger("call")
    assert [(c.attempt, c.pid) for c in calls] == [(1, zombie.pid), (2, rescuer.pid)]
    assert len({c.info for c in calls}) == 1
    assert app.rows(
        "SELECT name, result::text FROM pgqueue_job_steps WHERE job_id = :id", id=job_id
    ) == [("call", f'{{"pid":{rescuer.pid},"attempt":2}}')]
    assert app.jobs([job_id])[job_id] == job
    assert zombie.popen.poll() is None
