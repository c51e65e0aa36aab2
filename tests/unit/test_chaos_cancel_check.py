"""The fault harness's check that no member of a cancelled workflow starts after the cancel
(invariant 15), on made-up snapshots: a run whose ledger row was written well after the cancel
is late only when pgqueue claimed its attempt after the cancel too; a row written late for an
attempt claimed before it (its first write waited out a pooler's restart) is not, nor one whose
process was frozen across the cancel and began as it resumed (a later attempt's claim hides the
first one's)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from tests.chaos.invariants import Facts
from tests.chaos.snapshot import Run, Snapshot
from tests.chaos.workflow_checks import nothing_starts_after_a_cancel
from tests.chaos.workload import Event

T0 = 1_000_000.0
CANCELLED_AT = T0 + 1.0
WORKFLOW = 19


def _member(claimed: float, attempts: int = 1) -> Any:
    return SimpleNamespace(
        id=694,
        workflow_id=WORKFLOW,
        attempts=attempts,
        started_at=dt.datetime.fromtimestamp(T0 + claimed, dt.UTC),
    )


def _check(claimed: float, attempts: int = 1, events: list[Event] | None = None) -> list[Any]:
    job = _member(claimed, attempts)
    snapshot = Snapshot(T0 + 10, {job.id: job})
    # Its ledger row, 1.5 s after the cancel, in a process-pool child of worker 4000.
    snapshot.runs[job.id].append(
        Run(1, job.id, 1, "wf_member", "run", 4242, T0 + 2.5, T0 + 2.6, "saw_cancel", 4000)
    )
    facts = Facts(workflow_cancels={WORKFLOW: CANCELLED_AT}, events=events or [])
    return nothing_starts_after_a_cancel(snapshot, facts)


def test_a_row_written_late_for_an_attempt_claimed_before_the_cancel_is_not_late() -> None:
    assert _check(claimed=0.9) == []


def test_an_attempt_claimed_after_the_cancel_is_late() -> None:
    (violation,) = _check(claimed=2.4)
    assert violation.run_ids == [1]
    assert "after its workflow 19 was cancelled" in violation.message


def test_an_attempt_whose_process_was_frozen_across_the_cancel_is_not_late() -> None:
    # Its second attempt's claim (at 4) hides the first one's; its child was stopped from 0.5 to
    # 2.2 and began the run as it resumed.
    frozen = Event(T0 + 0.5, "sigstop", "pid 4242 for 1.7 s", 4242, T0 + 2.2)
    assert _check(claimed=4.0, attempts=2, events=[frozen]) == []
    # Resumed long before: late.
    earlier = Event(T0 + 0.5, "sigstop", "pid 4242 for 0.7 s", 4242, T0 + 1.2)
    assert len(_check(claimed=4.0, attempts=2, events=[earlier])) == 1
