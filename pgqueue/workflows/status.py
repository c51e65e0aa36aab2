"""What ``pgq.get_workflow`` returns: a workflow's state, its jobs and its result."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pgqueue.data.workflows import WorkflowRow
from pgqueue.states import JobState, WorkflowRole


@dataclass(frozen=True, slots=True)
class WorkflowJob:
    """One job of a workflow: its id, task, state and the jobs it waited for."""

    id: int
    task_name: str
    state: JobState
    depends_on: tuple[int, ...]
    role: str  # "member", "closing" (the marker that never runs) or "on_failure"


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """A workflow as read in one snapshot.

    ``state``: running, succeeded, failed or cancelled. ``jobs``: its member jobs by id (the
    closing marker and the ``on_failure`` job apart). ``result``: the result of its last step
    (a chain's last job, a chord's callback), or the list of its last group's results in
    order; None until it succeeded."""

    id: int
    state: str
    jobs: tuple[WorkflowJob, ...]
    result: Any
    created_at: dt.datetime
    finished_at: dt.datetime | None
    closing_job_id: int
    on_failure_job_id: int | None

    @property
    def finished(self) -> bool:
        """Whether the workflow ended (succeeded, failed or cancelled)."""
        return self.state != "running"


_ROLE_NAMES = {WorkflowRole.CLOSING.value: "closing", WorkflowRole.ON_FAILURE.value: "on_failure"}


def status_of(row: WorkflowRow) -> WorkflowStatus:
    """The ``WorkflowStatus`` of a workflow read by ``data.workflows.read_workflow``."""
    jobs = tuple(
        WorkflowJob(
            job_id,
            task,
            state,
            tuple(depends_on or ()),
            _ROLE_NAMES.get(-1 if role is None else role, "member"),
        )
        for job_id, task, state, role, depends_on in row.jobs
    )
    result: Any = None
    if row.state == "succeeded":
        results = [value for _, _, value in row.final_results]
        result = results[0] if len(results) == 1 else results
    return WorkflowStatus(
        row.id,
        row.state,
        tuple(j for j in jobs if j.role == "member"),
        result,
        row.created_at,
        row.finished_at,
        row.closing_job_id,
        row.on_failure_job_id,
    )
