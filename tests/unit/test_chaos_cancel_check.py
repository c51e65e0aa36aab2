"""The fault harness's check that no member of a cancelled workflow starts after the cancel
(invariant 15), on made-up snapshots: a run whose ledger row was written well after the cancel
is late only when pgqueue claimed its attempt after the cancel too; a row written late for an
attempt claimed before it (its first write waited out a pooler's restart) is not."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from tests.chaos.invariants import Facts
from tests.chaos.snapshot import Run, Snapshot
from tests.chaos.workflow_checks import nothing_starts_after_a_cancel

T0 = 1_000_000.0
CANCELLED_AT = T0 + 1.0
WORKFLOW = 19


def _member(claimed: float) -> Any:
    return SimpleNamespace(
        id=694,
        workflow_id=WORKFLOW,
        attempts=1,
        started_at=dt.datetime.fromtimestamp(T0 + claimed, dt.UTC),
    )


def _check(claimed: float) -> list[Any]:
    job = _member(claimed)
    snapshot = Snapshot(T0 + 10, {job.id: job})
    # Its ledger row, 1.5 s after the cancel.
    snapshot.runs[job.id].append(
        Run(1, job.id, 1, "wf_member", "run", 4242, T0 + 2.5, T0 + 2.6, "saw_cancel")
    )
    return nothing_starts_after_a_cancel(snapshot, Facts(workflow_cancels={WORKFLOW: CANCELLED_AT}))


def test_a_row_written_late_for_an_attempt_claimed_before_the_cancel_is_not_late() -> None:
    assert _check(claimed=0.9) == []


def test_an_attempt_claimed_after_the_cancel_is_late() -> None:
    (violation,) = _check(claimed=2.4)
    assert violation.run_ids == [1]
    assert "after its workflow 19 was cancelled" in violation.message
