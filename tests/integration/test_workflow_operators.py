"""Operators' actions on a workflow's jobs. A retry or cancel of one member by hand (the API, the
command line, a bulk action, the dashboard) is refused with one line naming the workflow, and
nothing changes; so is a delete while the workflow runs. The workflow is acted on whole
(``cancel_workflow``); a routine bulk delete by state leaves a running workflow's jobs alone, and
its callback still gets one result per member, in order.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.processes import run_pgqueue

from pgqueue import InvalidStateTransition, JobState, PgQueue, chord
from pgqueue.admin import JobFilter
from pgqueue.contrib.flask import PgQueue as DashboardQueue
from pgqueue.testing import run_until_final


def _declare(pgq: PgQueue) -> dict[str, Any]:
    @pgq.task(name="square")
    def square(x: int) -> int:
        return x * x

    @pgq.task(name="boom", max_attempts=1)
    def boom(x: int) -> int:
        raise RuntimeError(f"boom {x}")

    @pgq.task(name="collect")
    def collect(results: list[int]) -> list[int]:
        return results

    @pgq.task(name="report")
    def report(failures: list[dict[str, Any]]) -> list[int]:
        return [failure["id"] for failure in failures]

    return {"square": square, "boom": boom, "collect": collect, "report": report}


def test_a_running_workflows_members_are_not_retried_cancelled_or_deleted_one_by_one(
    pgq: PgQueue, database_url: URL
) -> None:
    tasks = _declare(pgq)
    # The failing member runs alone first (its own queue): the chord then waits for the others.
    wf = chord(
        [
            tasks["square"].s(1),
            tasks["boom"].s(2).set(queue="first"),
            tasks["square"].s(3),
        ],
        tasks["collect"].s(),
        on_failure=tasks["report"].s(),
    ).enqueue()
    one, failed, three, callback = wf.job_ids[:4]
    assert run_until_final(pgq, [failed], queues=["first"]) == {failed: JobState.FAILED}
    assert pgq.get_workflow(wf.id).state == "running"

    refusals = {
        "retry": lambda: pgq.retry_job(failed),
        "cancel": lambda: pgq.cancel_job(one),
        "delete": lambda: pgq.admin.delete_job(three),
        "retry callback": lambda: pgq.retry_job(callback),
    }
    for action, act in refusals.items():
        with pytest.raises(InvalidStateTransition, match=f"workflow {wf.id}, which is running"):
            act()
    command = run_pgqueue("retry", str(failed), url=database_url)
    assert command.returncode == 2
    assert command.stderr.count("\n") == 1 and f"workflow {wf.id}" in command.stderr
    failed_jobs = JobFilter(states=frozenset({JobState.FAILED}))
    assert pgq.admin.bulk_retry(failed_jobs, dry_run=True).count == 0
    assert pgq.admin.bulk_retry(failed_jobs).count == 0
    queued = JobFilter(states=frozenset({JobState.QUEUED, JobState.WAITING}))
    assert pgq.admin.bulk_cancel(queued, dry_run=True).count == 0
    assert pgq.admin.bulk_cancel(queued).count == 0
    assert pgq.admin.bulk_delete(queued).count == 0
    # The dashboard offers no button on the workflow's jobs, and a forged press is refused.
    with dashboard_app(DashboardQueue(), database_url, "workflow_operators") as app:
        client = app.test_client()
        page = client.get(f"/pgqueue/jobs/{failed}").text
        assert "Settled by" in page and f"workflow #{wf.id}" in page
        assert 'class="retry"' not in page and 'class="delete"' not in page
        listing = client.get("/pgqueue/jobs").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', listing)
        assert token is not None
        pressed = client.post(
            f"/pgqueue/jobs/{failed}/retry",
            data={"csrf_token": token.group(1)},
            follow_redirects=True,
        )
        assert f"workflow {wf.id}, which is running" in html.unescape(pressed.text)
    states = {job.id: job.state for job in pgq.get_workflow(wf.id).jobs}
    assert [states[i] for i in (one, failed, three, callback)] == [
        JobState.QUEUED,
        JobState.FAILED,
        JobState.QUEUED,
        JobState.WAITING,
    ]

    status = run_until_final_workflow(pgq, wf.id)
    assert status.state == "failed"
    on_failure = pgq.get_job(status.on_failure_job_id or 0)
    assert on_failure.state is JobState.SUCCEEDED and on_failure.result == [failed]
    assert pgq.get_job(callback).state is JobState.CANCELLED
    # Ended: its jobs are still not run again one by one, and may be deleted.
    for job_id in (failed, callback):
        with pytest.raises(InvalidStateTransition, match=f"workflow {wf.id}, which failed"):
            pgq.retry_job(job_id)
    assert pgq.admin.delete_job(one)


def run_until_final_workflow(pgq: PgQueue, workflow_id: int) -> Any:
    """Run a worker until workflow ``workflow_id`` and its ``on_failure`` job ended."""
    status = pgq.get_workflow(workflow_id)
    ids = [job.id for job in status.jobs]
    if status.on_failure_job_id is not None:
        ids.append(status.on_failure_job_id)
    run_until_final(pgq, ids)
    return pgq.get_workflow(workflow_id)


def test_a_bulk_delete_of_succeeded_jobs_leaves_a_waiting_chord_whole(
    pgq: PgQueue, database_url: URL
) -> None:
    tasks = _declare(pgq)
    plain = tasks["square"].enqueue(5)
    wf = chord(
        [tasks["square"].s(1), tasks["square"].s(2), tasks["square"].s(3).set(queue="later")],
        tasks["collect"].s(),
    ).enqueue()
    run_until_final(pgq, [int(plain), *wf.job_ids[:2]], queues=["default"])
    deleted = run_pgqueue("bulk", "delete", "--state", "succeeded", "--yes", url=database_url)
    assert deleted.returncode == 0, deleted.stderr
    assert [job.state for job in pgq.admin.list_jobs(state=JobState.SUCCEEDED).jobs] == [
        JobState.SUCCEEDED,
        JobState.SUCCEEDED,
    ]
    status = run_until_final_workflow(pgq, wf.id)
    assert status.state == "succeeded"
    assert status.result == [1, 4, 9]
