"""What the test helpers report about jobs: ``JobRun`` (one attempt that ran, with its outcome)
and ``EnqueuedJob`` (a job waiting in the database), and how each reads in a failure message.

Plain values built from pgqueue's own (``jobs.ClaimedJob`` and ``jobs.Outcome``, or a ``Job``
row), so a test compares them with ``==`` and prints them readably.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgqueue.jobs import ClaimedJob, Outcome
from pgqueue.models import Job
from pgqueue.states import JobState


@dataclass(frozen=True, slots=True)
class JobRun:
    """One attempt of a job that ran, and what it ended in.

    ``state`` is the job's state after this attempt (SUCCEEDED, RETRYING, FAILED or
    CANCELLED); ``result`` is the handler's return value (decoded from JSON) and ``error`` the
    recorded error text (a traceback for an exception), None when there is none.
    """

    job_id: int
    task: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    attempt: int
    state: JobState
    result: Any = None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.state is JobState.SUCCEEDED

    @classmethod
    def of(cls, job: ClaimedJob, outcome: Outcome) -> JobRun:
        """The run of ``job`` that ended in ``outcome`` (as the worker wrote it)."""
        return cls(
            job_id=job.id,
            task=job.task_name,
            args=tuple(job.args),
            kwargs=dict(job.kwargs),
            attempt=job.attempt,
            state=JobState(outcome.kind.transition.target),
            result=json.loads(outcome.result_json) if outcome.result_json else None,
            error=outcome.error or None,
        )

    @classmethod
    def of_row(cls, job: Job, outcome: Outcome, attempt: int) -> JobRun:
        """Attempt ``attempt`` of the stored ``job``, which ended in ``outcome``."""
        return cls(
            job_id=job.id,
            task=job.task_name,
            args=tuple(job.args or ()),
            kwargs=dict(job.kwargs or {}),
            attempt=attempt,
            state=JobState(outcome.kind.transition.target),
            result=json.loads(outcome.result_json) if outcome.result_json else None,
            error=outcome.error or None,
        )

    def __str__(self) -> str:
        line = f"#{self.job_id} {call_text(self.task, self.args, self.kwargs)} attempt "
        line += f"{self.attempt}: {self.state}"
        if self.error:
            return f"{line} ({last_line(self.error)})"
        return line if self.result is None else f"{line} -> {self.result!r}"


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """A job as the database holds it (what ``enqueued_jobs`` returns)."""

    job_id: int
    task: str
    queue: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
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
        return f"#{self.job_id} {call_text(self.task, self.args, self.kwargs)} {self.state}"


def call_text(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """``task(1, 'a', key=2)``: a job's arguments written as the call that enqueued it."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{task}({', '.join(parts)})"


def last_line(error: str) -> str:
    """The last non-empty line of an error text (a traceback's exception line)."""
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
