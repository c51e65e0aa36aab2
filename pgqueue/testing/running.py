"""``run_jobs``: run a real worker in the test's thread until nothing is ready, and say what ran.

It is the worker a deployment runs (``pgqueue.worker.Worker``, in ``drain`` mode), so leases,
atomic tasks, ``async def`` handlers, dependencies and retries behave as in production. A retry
whose backoff has not passed yet is not ready: the run ends with that job RETRYING.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pgqueue.jobs import Outcome
from pgqueue.models import Job
from pgqueue.states import JobState, OutcomeKind
from pgqueue.testing.immediate_mode import queue_of
from pgqueue.testing.records import JobRun
from pgqueue.worker import Worker


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
    return _attempts_of(outcomes, jobs, pgq.settings.max_snoozes)


def _attempts_of(
    outcomes: Sequence[Outcome], jobs: Mapping[int, Job], max_snoozes: int
) -> list[JobRun]:
    """``outcomes`` (in the order written) as runs, each with the attempt it ran as, counted
    back from each job's attempt count now over the outcomes that used one: a release, a
    suspension and a snooze within ``max_snoozes`` give their attempt back (the next run has
    the same number); a snooze past it counts as a failed attempt (RETRYING, or FAILED on the last one)."""
    snoozes_here = Counter(o.job_id for o in outcomes if o.kind is OutcomeKind.SNOOZE)
    snoozed = {job_id: job.snoozes - snoozes_here[job_id] for job_id, job in jobs.items()}
    used: list[bool] = []
    for outcome in outcomes:
        if outcome.kind is OutcomeKind.SNOOZE:
            snoozed[outcome.job_id] += 1
            used.append(snoozed[outcome.job_id] > max_snoozes)
        else:
            used.append(outcome.kind not in (OutcomeKind.RELEASE, OutcomeKind.SUSPEND))
    remaining = Counter(o.job_id for o, counts in zip(outcomes, used, strict=True) if counts)
    runs = []
    for outcome, counts in zip(outcomes, used, strict=True):
        job = jobs[outcome.job_id]
        attempt = job.attempts - remaining[outcome.job_id] + 1
        state = None
        if outcome.kind is OutcomeKind.SNOOZE and counts:
            state = JobState.FAILED if attempt >= job.max_attempts else JobState.RETRYING
        if counts:
            remaining[outcome.job_id] -= 1
        args, kwargs = job.args or (), job.kwargs or {}
        runs.append(JobRun.ended(job.id, job.task_name, args, kwargs, attempt, outcome, state))
    return runs
