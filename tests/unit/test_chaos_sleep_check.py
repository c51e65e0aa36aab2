"""The fault harness's check that a durable sleep is kept (invariant 13), on made-up snapshots:
a run that returned got past its sleep no earlier than the sleep's end. A run that began before
the end counts by the row it wrote after the sleep: one stopped at its start and resumed after
its lease was lost, while the next attempt slept and returned, got past the sleep once its
time had come; one that wrote that row before the end, or none at all, did not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.chaos.invariants import Facts, durable_waits_kept
from tests.chaos.snapshot import Run, Snapshot

T0 = 1_000_000.0
STOPPED_PID = 4242
OTHER_PID = 4343
SLEEP_ENDS = T0 + 4.7


def _job() -> Any:
    return SimpleNamespace(
        id=1,
        task_name="chaos.waiter",
        state="succeeded",
        result={"payload": None},
        errors=[{"attempt": 1, "error": "lease expired (worker lost)"}],
        attempts=2,
    )


def _snapshot(first_run_wrote_at: float | None) -> Snapshot:
    job = _job()
    snapshot = Snapshot(T0 + 10, {job.id: job}, sleeps_until={job.id: SLEEP_ENDS})
    snapshot.steps[job.id].append(
        Run(1, job.id, 1, "durable_wait", "step", STOPPED_PID, T0, None, None)
    )
    runs = snapshot.runs[job.id]
    # Attempt 1 began at 0 and was stopped; attempt 2 slept (suspended) and then returned.
    runs.append(Run(2, job.id, 1, "durable_wait", "run", STOPPED_PID, T0, T0 + 6.0, "ok"))
    runs.append(
        Run(3, job.id, 2, "durable_wait", "run", OTHER_PID, T0 + 3.4, T0 + 3.6, "suspended")
    )
    runs.append(Run(4, job.id, 2, "durable_wait", "run", OTHER_PID, T0 + 4.8, T0 + 4.9, "ok"))
    snapshot.txs[job.id].append(
        Run(5, job.id, 2, "durable_wait", "tx", OTHER_PID, T0 + 4.85, None, None)
    )
    if first_run_wrote_at is not None:
        snapshot.txs[job.id].append(
            Run(
                6, job.id, 1, "durable_wait", "tx", STOPPED_PID, T0 + first_run_wrote_at, None, None
            )
        )
    return snapshot


def test_a_run_resumed_after_the_sleep_ended_kept_it() -> None:
    assert durable_waits_kept(_snapshot(first_run_wrote_at=5.9), Facts()) == []


def test_a_run_that_wrote_its_row_before_the_sleep_ended_broke_it() -> None:
    (violation,) = durable_waits_kept(_snapshot(first_run_wrote_at=0.2), Facts())
    assert violation.run_ids == [2]
    assert "got past its sleep" in violation.message


def test_a_run_begun_before_the_end_without_a_row_after_the_sleep_counts_by_its_start() -> None:
    (violation,) = durable_waits_kept(_snapshot(first_run_wrote_at=None), Facts())
    assert violation.run_ids == [2]
