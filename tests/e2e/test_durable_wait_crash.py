"""Durable sleep and signals across real worker processes: a worker SIGKILLed while its jobs
are suspended loses nothing (they hold no lease, so nothing is rescued and no attempt is used),
and another worker resumes them, one woken by a signal sent while no worker ran.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import App, WorkerProcess

# Appended to the e2e application module (``e2eapp.py``): its ``pgq`` is what the workers serve,
# and its ``mark`` commits a ledger row at once on a connection of its own.
SUSPEND_APP = """

# --- durable wait crash tests ---


@pgq.task(name="waits_for_go", pass_context=True, max_attempts=1)
def waits_for_go(ctx):
    ctx.step("before", mark, ctx, "before-wait")
    payload = ctx.wait_for_signal("go", timeout=3600)
    mark(ctx, "after-wait")
    return payload


@pgq.task(name="sleeps", pass_context=True, max_attempts=1)
def sleeps(ctx):
    ctx.step("before", mark, ctx, "before-sleep")
    ctx.sleep(3)
    mark(ctx, "after-sleep")
    return "rested"
"""


def start(app: App) -> WorkerProcess:
    """A worker process with a 2 s lease and a fast rescue."""
    return app.start_worker(
        "--concurrency", "2", "--lease-seconds", "2", rescue_interval=0.5, poll_interval=0.2
    )


def enqueue(app: App, task: str) -> int:
    """``task`` of the tasks above, enqueued for the worker processes."""
    return app.enqueue_stand_in(task, SUSPEND_APP)


def test_a_worker_killed_while_its_jobs_are_suspended_loses_nothing(app: App) -> None:
    waiting, sleeping = enqueue(app, "waits_for_go"), enqueue(app, "sleeps")
    first = start(app)
    app.wait_until(
        lambda: (
            len(
                app.scalars(
                    "SELECT job_id FROM pgqueue_job_suspensions s JOIN pgqueue_jobs j "
                    "ON j.id = s.job_id AND j.updated_at = s.suspended_at AND j.state = 'queued'"
                )
            )
            == 2
        ),
        30,
        "both jobs to be suspended",
    )
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert app.module.pgq.signal(waiting, "go", {"by": "ana"}) is True

    second = start(app)
    jobs = app.wait_final([waiting, sleeping], timeout=60)
    assert (jobs[waiting].state, jobs[waiting].attempts) == ("succeeded", 1)
    assert jobs[waiting].result == {"by": "ana"}
    assert (jobs[sleeping].state, jobs[sleeping].attempts) == ("succeeded", 1)
    assert jobs[sleeping].result == "rested"
    # Nothing was rescued: no error recorded. The steps before the suspension ran once, in
    # the killed worker; the code after it ran in the second.
    assert jobs[waiting].errors == [] and jobs[sleeping].errors == []
    ledger = [(row.tag, row.pid) for row in app.ledger()]
    assert sorted(ledger) == sorted(
        [
            ("before-wait", first.pid),
            ("before-sleep", first.pid),
            ("after-wait", second.pid),
            ("after-sleep", second.pid),
        ]
    )
