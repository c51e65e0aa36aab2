"""What the test helpers report about jobs: ``JobRun`` (one attempt that ran, with its outcome)
and ``EnqueuedJob`` (a job waiting in the database), and how each reads in a failure message.

Plain values built from pgqueue's own (a ``jobs.Outcome``, a ``Job`` row), so a test compares
them with ``==`` and prints them readably.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgqueue.jobs import Outcome
from pgqueue.models import Job
from pgqueue.states import JobState


@dataclass(frozen=True, slots=True)
class JobCall:
    """A job's id and the call that enqueued it: its task and arguments (as stored)."""

    job_id: int
    task: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    def call(self) -> str:
        """``#12 task(1, key=2)``."""
        return f"#{self.job_id} {call_text(self.task, self.args, self.kwargs)}"


@dataclass(frozen=True, slots=True)
class JobRun(JobCall):
    """One attempt of a job that ran, and what it ended in.

    ``state`` is the job's state after this attempt (SUCCEEDED, RETRYING, FAILED or
    CANCELLED, or QUEUED after a snooze); ``result`` is the handler's return value (decoded from JSON) and ``error`` the
    recorded error text (a traceback for an exception), None when there is none.
    """

    attempt: int
    state: JobState
    result: Any = None
    error: str | None = None

    @classmethod
    def ended(
        cls,
        job_id: int,
        task: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        attempt: int,
        outcome: Outcome,
        state: JobState | None = None,
    ) -> JobRun:
        """Attempt ``attempt`` of job ``job_id``, which ended in ``outcome`` (as the worker
        wrote it); ``state`` when the outcome's statement decides it (a snooze past the
        ``max_snoozes`` setting), else the outcome's transition's target."""
        return cls(
            job_id=job_id,
            task=task,
            args=tuple(args),
            kwargs=dict(kwargs),
            attempt=attempt,
            state=state or JobState(outcome.kind.transition.target),
            result=json.loads(outcome.result_json) if outcome.result_json else None,
            error=outcome.error or None,
        )

    def __str__(self) -> str:
        line = f"{self.call()} attempt {self.attempt}: {self.state}"
        if self.error:
            return f"{line} ({last_line(self.error)})"
        return line if self.result is None else f"{line} -> {self.result!r}"


@dataclass(frozen=True, slots=True)
class EnqueuedJob(JobCall):
    """A job as the database holds it (what ``enqueued_jobs`` returns)."""

    queue: str
    state: JobState
    priority: int
    run_at: Any

    @classmethod
    def of(cls, job: Job) -> EnqueuedJob:
        return cls(
            job_id=job.id,
            task=job.task_name,
            queue=job.queue,
            args=tuple(job.args or ()),
            kwargs=dict(job.kwargs or {}),
            state=JobState(job.state),
            priority=job.priority,
            run_at=job.run_at,
        )

    def __str__(self) -> str:
        return f"{self.call()} {self.state}"


def call_text(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """``task(1, 'a', key=2)``: a job's arguments written as the call that enqueued it."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{task}({', '.join(parts)})"


def last_line(error: str) -> str:
    """The last non-empty line of an error text (a traceback's exception line)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
