"""``pgqueue workflow ID``: one workflow, its state and its jobs (each with its state and what
it waits for), or ``--json``; and ``--cancel`` to cancel it."""

from __future__ import annotations

from typing import Any

import click

from pgqueue.cli.shared import database_option, echo, json_option, print_json, queue_for


@click.command()
@click.argument("workflow_id", type=int)
@click.option("--cancel", is_flag=True, help="Cancel the workflow (what has not started).")
@json_option
@database_option
def workflow(workflow_id: int, cancel: bool, as_json: bool, database_url: str | None) -> None:
    """Show workflow WORKFLOW_ID: its state and its jobs, each with what it waits for."""
    pgq = queue_for(database_url)
    if cancel:
        changed = pgq.admin.cancel_workflow(workflow_id)
        echo(f"workflow {workflow_id}: {'cancelled' if changed else 'had already ended'}")
        return
    status = pgq.admin.get_workflow(workflow_id)
    record: dict[str, Any] = {
        "id": status.id,
        "state": status.state,
        "created_at": status.created_at.isoformat(),
        "finished_at": None if status.finished_at is None else status.finished_at.isoformat(),
        "on_failure_job_id": status.on_failure_job_id,
        "jobs": [
            {
                "id": job.id,
                "task": job.task_name,
                "state": job.state.value,
                "waits_for": list(job.depends_on),
            }
            for job in status.jobs
        ],
    }
    if as_json:
        print_json({**record, "result": status.result})
        return
    counts: dict[str, int] = {}
    for job in status.jobs:
        counts[job.state.value] = counts.get(job.state.value, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    echo(f"workflow {status.id}  {status.state}  ({len(status.jobs)} jobs: {summary})")
    for job in status.jobs:
        waits = ""
        if job.depends_on and not job.state.is_final:
            shown = ", ".join(str(d) for d in job.depends_on[:5])
            more = f" and {len(job.depends_on) - 5} more" if len(job.depends_on) > 5 else ""
            waits = f"  after {shown}{more}"
        echo(f"  job {job.id}  {job.task_name}  {job.state.value}{waits}")
    if status.on_failure_job_id is not None:
        echo(f"  on_failure: job {status.on_failure_job_id}")
