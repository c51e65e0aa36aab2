"""A workflow's closing marker is its workflow's to end: an operator's cancel, retry or delete of
that one job is refused with the way to stop the workflow, a bulk action's filter never
chooses it, and ``explain`` suggests no retry of it. Otherwise the workflow could never end."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from test_workflows import run_workflow

from pgqueue import JobState, PgQueue, chain
from pgqueue.admin import JobFilter
from pgqueue.errors import InvalidStateTransition
from pgqueue.explain import BlockerKind


def closing_marker(pgq: PgQueue, workflow_id: int) -> int:
    with pgq.engine.connect() as connection:
        return int(
            connection.execute(
                text("SELECT id FROM pgqueue_jobs WHERE workflow_id = :w AND workflow_role = 3"),
                {"w": workflow_id},
            ).scalar_one()
        )


def test_one_job_actions_on_a_closing_marker_are_refused_and_the_workflow_ends(
    pgq: PgQueue,
) -> None:
    @pgq.task(name="noop")
    def noop(*_: Any) -> None:
        return None

    workflow = chain(noop.s(), noop.s()).enqueue()
    marker = closing_marker(pgq, workflow.id)
    hint = (
        f"it is the closing marker of workflow {workflow.id}, which ends when the workflow's "
        f"jobs end; to stop the workflow, cancel it (`pgqueue workflow {workflow.id} --cancel`)"
    )
    with pytest.raises(InvalidStateTransition) as cancelled:
        pgq.admin.cancel_job(marker)
    assert str(cancelled.value) == f"cannot cancel job {marker}: {hint}"
    with pytest.raises(InvalidStateTransition) as retried:
        pgq.admin.retry_job(marker)
    assert str(retried.value) == f"cannot retry job {marker}: {hint}"
    with pytest.raises(InvalidStateTransition) as deleted:
        pgq.admin.delete_job(marker)
    assert str(deleted.value) == f"cannot delete job {marker}: {hint}"
    assert pgq.get_job(marker).state is JobState.WAITING

    assert run_workflow(pgq, workflow.id).state == "succeeded"
    assert pgq.get_job(marker).state is JobState.SUCCEEDED


def test_bulk_actions_never_choose_a_closing_marker(pgq: PgQueue) -> None:
    @pgq.task(name="noop", queue="reports")
    def noop(*_: Any) -> None:
        return None

    workflows = [chain(noop.s(), noop.s()).enqueue() for _ in range(3)]
    markers = {closing_marker(pgq, w.id) for w in workflows}
    waiting = JobFilter(queue="reports", states=frozenset({JobState.QUEUED, JobState.WAITING}))
    # A running workflow's jobs are its own to settle: a filter chooses none of them.
    assert pgq.admin.bulk_cancel(waiting, dry_run=True).count == 0
    assert pgq.admin.bulk_delete(waiting, dry_run=True).count == 0
    assert pgq.admin.bulk_cancel(waiting).count == 0
    for w in workflows:
        assert pgq.cancel_workflow(w.id)
    # Each workflow ended with its steps, its marker settled by them, not by the filter.
    assert {pgq.get_workflow(w.id).state for w in workflows} == {"cancelled"}
    assert {pgq.get_job(m).state for m in markers} == {JobState.FAILED}
    ended = JobFilter(queue="reports", states=frozenset({JobState.CANCELLED, JobState.FAILED}))
    assert pgq.admin.bulk_retry(ended, dry_run=True).count == 0
    assert pgq.admin.bulk_delete(ended, dry_run=True).count == 6  # the steps only
    # Neither explain nor a retry offers to run a marker again.
    marker = min(markers)
    finished = pgq.admin.explain_job(marker).blockers[0]
    assert finished.kind is BlockerKind.FINISHED and "pgqueue retry" not in finished.message
    with pytest.raises(InvalidStateTransition, match="closing marker"):
        pgq.admin.retry_job(marker)
