"""Workflows (``sql.workflows``): inserting one whole, reading it, cancelling it; over
``db.Executor``, never committing.

A workflow is a plan of the one writer (``data.enqueue.write``): its jobs go in knowing each
other's ids, with their edges on both sides (``depends_on`` and ``dependents``), their
countdowns and roles, and tickets for those with no parent; then its row. A closing marker (a
job that never runs) depends on every member: it is settled when the last of them ended, and
closes the workflow in that transaction (``dependencies.settle``).

Members with a ``unique_key`` hold it from the enqueue on, while they wait too (the unique
index covers WAITING jobs). The writer refuses such a workflow whole when a key is held
(``UniqueKeyHeld`` names the holder), and a caller's transaction stays usable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgqueue.data import dependencies, enqueue
from pgqueue.db import Executor
from pgqueue.jobs import InsertedWorkflow, NewJob, Plan, WorkflowPlan
from pgqueue.sql import enqueue as enqueue_sql
from pgqueue.sql import workflows
from pgqueue.states import JobState, WorkflowRole

# The closing marker's task name: it never runs, so no task has this name.
CLOSING_TASK = "pgqueue.workflow"


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """A workflow's row and the rows of its jobs, as read in one snapshot."""

    id: int
    state: str
    created_at: Any
    finished_at: Any
    final_job_ids: list[int]
    closing_job_id: int
    on_failure_job_id: int | None
    job_count: int
    jobs: list[tuple[int, str, JobState, int | None, list[int] | None]]
    final_results: list[tuple[int, JobState, Any]]


def insert_workflow(
    ex: Executor,
    plan: WorkflowPlan,
    *,
    may_copy: bool = False,
    trace_context: str | None = None,
) -> InsertedWorkflow:
    """Insert ``plan``'s jobs and its closing marker as one plan of the writer
    (``data.enqueue.write``, refusing held unique keys: ``UniqueKeyHeld``, nothing written),
    then its row. ``may_copy``: COPY may carry a large one. ``trace_context`` (JSON text): the
    enqueuing span's context, stored with every job."""
    members = [i for i in range(len(plan.jobs)) if i != plan.on_failure]
    first = plan.jobs[0]
    jobs: list[NewJob] = [
        *plan.jobs,
        NewJob(CLOSING_TASK, first.queue, "[]", "{}", first.priority, 1, None, None, None, False),
    ]
    closing = len(jobs) - 1
    parents: list[tuple[int, ...]] = [*plan.parents, tuple(members)]
    if plan.on_failure is not None:
        parents[plan.on_failure] = (closing,)
    roles = [*plan.roles, WorkflowRole.CLOSING.value]
    ids, workflow_id = enqueue.write(
        ex,
        Plan(jobs, parents, roles),
        trace_context=trace_context,
        refuse_held=True,
        may_copy=may_copy,
    )
    ex.rows(
        enqueue_sql.insert_workflow(),
        {
            "id": workflow_id,
            "final_job_ids": [ids[i] for i in plan.final],
            "closing_job_id": ids[closing],
            "on_failure_job_id": None if plan.on_failure is None else ids[plan.on_failure],
            "job_count": len(members),
        },
    )
    assert workflow_id is not None  # a workflow's plan draws its id
    return InsertedWorkflow(workflow_id, tuple(ids))


def read_workflow(ex: Executor, workflow_id: int) -> WorkflowRow | None:
    """Workflow ``workflow_id`` with its jobs and the results of its final jobs, or None.
    Its final jobs are read from every table of ``ex.tables``: once the workflow has ended they
    are moved like any other finished job, and its result is still theirs. Its jobs are listed
    from ``pgqueue_jobs`` alone (the history has no index on their workflow)."""
    rows = ex.rows(workflows.workflow_row(), {"workflow": workflow_id})
    if not rows:
        return None
    state, created, finished, final, closing, on_failure, job_count = rows[0]
    jobs = [
        (row[0], row[1], JobState(row[2]), row[3], row[4])
        for row in ex.rows(workflows.workflow_jobs(), {"workflow": workflow_id})
    ]
    by_id: dict[int, Any] = {}
    for moved in ex.tables.reads:  # the live table first: a job moved in between is not missed
        missing = [job_id for job_id in final if job_id not in by_id]
        if missing:
            by_id.update(
                (row[0], row) for row in ex.rows(workflows.results_of(moved), {"ids": missing})
            )
    results = [
        (job_id, JobState(by_id[job_id][1]), by_id[job_id][2])
        for job_id in final
        if job_id in by_id
    ]
    return WorkflowRow(
        workflow_id,
        state,
        created,
        finished,
        list(final),
        closing,
        on_failure,
        job_count,
        jobs,
        results,
    )


def cancel_workflow(ex: Executor, workflow_id: int) -> bool:
    """Cancel workflow ``workflow_id``: its row -> cancelled, its jobs that wait cancelled
    (what depends on them counted down and settled), its running jobs flagged. False when it
    was not running."""
    if not ex.rows(workflows.mark_cancelled(), {"workflow": workflow_id}):
        return False
    dependents = ex.rows(workflows.cancel_waiting_jobs(), {"workflow": workflow_id})[0][0]
    if dependents:
        dependencies.settle(ex, dependents)
    ex.rows(workflows.flag_running_jobs(), {"workflow": workflow_id})
    return True


WORKFLOW_STATES = ("running", "succeeded", "failed", "cancelled")


def state_counts(ex: Executor, cap: int) -> dict[str, int]:
    """How many workflows are in each state, each count stopping at ``cap``."""
    rows = ex.rows(workflows.state_counts(), {"states": list(WORKFLOW_STATES), "cap": cap})
    return {state: int(count) for state, count in rows}
