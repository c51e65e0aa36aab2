"""``run_jobs``: run a real worker in the test's thread until nothing is ready, and say what ran.

It is the worker a deployment runs (``pgqueue.worker.Worker``, in ``drain`` mode), so leases,
atomic tasks, ``async def`` handlers, dependencies and retries behave as in production. A retry
whose backoff has not passed yet is not ready: the run ends with that job RETRYING.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from pgqueue.jobs import Outcome
from pgqueue.models import Job
from pgqueue.testing.immediate_mode import queue_of
from pgqueue.testing.records import JobRun
from pgqueue.worker import Worker

__all__ = ["run_jobs"]


def run_jobs(
    queue: Any, *, queues: Sequence[str] | None = None, concurrency: int = 1
) -> list[JobRun]:
    """Run the ready jobs of ``queue`` (a ``PgQueue``, or the Flask extension in an app
    context), and the jobs they make ready, until none is left; returns each attempt that ran,
    in the order the outcomes were written.

    ``queues`` limits it to some queues; ``concurrency`` is the worker's (1 by default, so the
    jobs run one after the other, in claim order). Scheduled tasks are not enqueued (no
    maintenance runs) and no notification is listened for: the worker only looks at what is
    ready, then stops.
    """
    pgq = queue_of(queue)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def written(outcome: Outcome) -> None:
        with lock:
            outcomes.append(outcome)

    worker = Worker(
        pgq,
        queues=queues,
        concurrency=concurrency,
        listen=False,
        maintenance=False,
        on_outcome=written,
    )
    worker.run(drain=True)
    jobs: dict[int, Job] = {}
    for outcome in outcomes:
        if outcome.job_id not in jobs:
            jobs[outcome.job_id] = pgq.get_job(outcome.job_id)
    # Each job's attempts counted back from its attempt count now, over its outcomes here.
    remaining = {job_id: 0 for job_id in jobs}
    for outcome in outcomes:
        remaining[outcome.job_id] += 1
    runs = []
    for outcome in outcomes:
        job = jobs[outcome.job_id]
        attempt = job.attempts - remaining[outcome.job_id] + 1
        remaining[outcome.job_id] -= 1
        runs.append(
            JobRun.ended(job.id, job.task_name, job.args or (), job.kwargs or {}, attempt, outcome)
        )
    return runs
