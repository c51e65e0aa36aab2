"""The fault harness's check that no running job outlives its lease by more than the allowance
(invariant 6), on made-up snapshots: an atomic job whose process was SIGSTOPped during its run
is allowed the seconds it was stopped, since its open transaction holds the row the rescue
needs; a leased job, or an atomic job whose process another process's stop did not touch, is
not."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from tests.chaos.app import QUEUE_LIMITED
from tests.chaos.invariants import Facts, no_stale_running
from tests.chaos.snapshot import Run, Snapshot
from tests.chaos.workload import Event

T0 = 1_000_000.0
LEASE = 3.0
ALLOWANCE = LEASE + 9  # the harness's ``stale_after``
PID = 4242


def _running(job_id: int, *, atomic: bool, claimed: float) -> Any:
    return SimpleNamespace(
        id=job_id,
        task_name="chaos.atomic" if atomic else "chaos.leased",
        queue=QUEUE_LIMITED,
        concurrency_key=None,
        state="running",
        attempts=2,
        atomic=atomic,
        started_at=dt.datetime.fromtimestamp(T0 + claimed, dt.UTC),
        lease_expires_at=dt.datetime.fromtimestamp(T0 + claimed + LEASE, dt.UTC),
    )


def _snapshot(job: Any, now: float) -> Snapshot:
    snapshot = Snapshot(T0 + now, {job.id: job})
    claimed = job.started_at.timestamp()
    snapshot.runs[job.id].append(
        Run(1, job.id, 2, "limited", "run", PID, claimed + 0.1, None, None)
    )
    return snapshot


def _stopped(pid: int, start: float, seconds: float) -> Facts:
    event = Event(
        T0 + start, "sigstop", f"pid {pid} for {seconds:.1f} s", pid, T0 + start + seconds
    )
    return Facts(stale_after=ALLOWANCE, events=[event])


def test_an_atomic_job_is_allowed_the_seconds_its_process_was_stopped() -> None:
    # Claimed at 0, its lease expired at 3; 15.1 s after the claim it still runs, 12.1 s past
    # the lease, because its process was stopped 5 s into an 11 s run.
    job = _running(1, atomic=True, claimed=0)
    assert no_stale_running(_snapshot(job, now=15.1), _stopped(PID, 5, 5.0)) == []


def test_the_allowance_ends_when_the_stopped_seconds_are_spent() -> None:
    job = _running(1, atomic=True, claimed=0)
    found = no_stale_running(_snapshot(job, now=20.1), _stopped(PID, 5, 5.0))
    assert [v.job_id for v in found] == [1]
    assert "its process stopped 5.0 s meanwhile" in found[0].message


def test_a_leased_job_gets_no_allowance_for_its_process_stopped() -> None:
    # Its rescue needs nothing of its process: the lease's expiry is enough.
    job = _running(1, atomic=False, claimed=0)
    found = no_stale_running(_snapshot(job, now=15.1), _stopped(PID, 5, 5.0))
    assert [v.job_id for v in found] == [1]


def test_another_process_stopped_gives_no_allowance() -> None:
    job = _running(1, atomic=True, claimed=0)
    found = no_stale_running(_snapshot(job, now=15.1), _stopped(PID + 1, 5, 5.0))
    assert [v.job_id for v in found] == [1]


def test_a_stop_before_the_claim_gives_no_allowance() -> None:
    job = _running(1, atomic=True, claimed=10)
    found = no_stale_running(_snapshot(job, now=25.1), _stopped(PID, 2, 6.0))
    assert [v.job_id for v in found] == [1]
