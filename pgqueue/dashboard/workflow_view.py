"""The dashboard's workflow page: a workflow's members drawn in stages (a member stands one
stage right of the last job it waits for), each with its state and the jobs it still waits on.

A stage shows at most ``STAGE_SHOWN`` members and counts the rest, so a group of 10,000 draws
as quickly as a chain of three. The page refreshes itself until the workflow ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from werkzeug.exceptions import NotFound
from werkzeug.routing import Rule
from werkzeug.wrappers import Response

from pgqueue.admin import MAX_JOB_ID
from pgqueue.dashboard.page import Page
from pgqueue.errors import PgQueueError
from pgqueue.states import FINAL_STATES, JobState
from pgqueue.workflows.status import WorkflowJob

STAGE_SHOWN: Final = 200


@dataclass(frozen=True, slots=True)
class Stage:
    """One column of the drawing: the members shown, and how many more it holds."""

    members: list[tuple[WorkflowJob, list[int]]]  # (member, the members it still waits on)
    hidden: int


def stages(jobs: tuple[WorkflowJob, ...]) -> list[Stage]:
    """The members in stages: those that wait for no member first, then each member one stage
    after the latest of those it waits for (members come in id order, parents first)."""
    by_id = {job.id: job for job in jobs}
    depth: dict[int, int] = {}
    for job in sorted(jobs, key=lambda j: j.id):
        parents = [depth[p] for p in job.depends_on if p in depth]
        depth[job.id] = 1 + max(parents) if parents else 0
    columns: list[list[WorkflowJob]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for job in sorted(jobs, key=lambda j: j.id):
        columns[depth[job.id]].append(job)
    drawn = []
    for column in columns:
        shown = [
            (
                job,
                [p for p in job.depends_on if p in by_id and by_id[p].state not in FINAL_STATES],
            )
            for job in column[:STAGE_SHOWN]
        ]
        drawn.append(Stage(shown, len(column) - len(shown)))
    return drawn


def workflow_detail(page: Page, workflow_id: int) -> Response:
    if workflow_id > MAX_JOB_ID:
        raise NotFound(description=f"no workflow with id {workflow_id}")
    admin = page.admin
    try:
        workflow = admin.get_workflow(workflow_id)
    except PgQueueError:
        raise NotFound(description=f"no workflow with id {workflow_id}") from None
    on_failure = None
    if workflow.on_failure_job_id is not None:
        try:
            on_failure = admin.get_job(workflow.on_failure_job_id)
        except PgQueueError:  # pruned
            on_failure = None
    counts: dict[str, int] = {}
    for job in workflow.jobs:
        counts[job.state.value] = counts.get(job.state.value, 0) + 1
    return page.render(
        "pgqueue/workflow.html",
        workflow=workflow,
        stages=stages(workflow.jobs),
        counts=[(state.value, counts[state.value]) for state in JobState if state.value in counts],
        on_failure=on_failure,
    )


RULES: Final = [Rule("/workflows/<int:workflow_id>", endpoint="workflow_detail", methods=["GET"])]
VIEWS: Final[dict[str, Callable[..., Response]]] = {"workflow_detail": workflow_detail}
