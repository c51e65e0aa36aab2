"""The fault harness's report of a violation seen by several checks: its message is worded as
the latest check saw it, so the trace says which check that was, and a stale running job's
message gives its lease's expiry as a time, which no later check can shift."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from tests.chaos.harness import Checker
from tests.chaos.invariants import Facts, no_stale_running
from tests.chaos.report import traces
from tests.chaos.snapshot import Snapshot, clock

T0 = 1_000_000.0


def _at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(T0 + seconds, dt.UTC)


def _stale_job() -> SimpleNamespace:
    # Enqueued at 0 and claimed at once: its lease (3 s) expired at 3.
    return SimpleNamespace(
        id=7,
        task_name="chaos.leased",
        kind="leased",
        queue="chaos",
        state="running",
        attempts=1,
        max_attempts=3,
        atomic=False,
        snoozes=0,
        concurrency_key=None,
        unique_key=None,
        depends_on=None,
        created_at=_at(0),
        started_at=_at(0),
        finished_at=None,
        lease_expires_at=_at(3),
        errors=[],
    )


def test_a_violation_seen_again_is_worded_for_the_check_that_saw_it_last() -> None:
    job = _stale_job()
    checker = Checker(engine=None, facts=Facts())  # type: ignore[arg-type]
    facts = Facts(stale_after=12.0)
    # Checks 5 s apart see it 12.5, 17.5 and 22.5 s past its lease.
    for now in (15.5, 20.5, 25.5):
        snapshot = Snapshot(T0 + now, {job.id: job})
        checker.record("6 no_stale_running", no_stale_running(snapshot, facts), snapshot.now)

    (violation,) = checker.violations.values()
    assert violation.first_seen == T0 + 15.5
    assert violation.last_seen == T0 + 25.5
    # The age is the last check's; the expiry, a time, is the lease's own, after the job's
    # creation (an age read against the first sighting would put it 7 s before).
    assert "lease expired 22.5 s ago" in violation.message
    assert f"at {clock(T0 + 3)}" in violation.message
    assert f"claimed at {clock(T0)}" in violation.message

    text = traces(11, Snapshot(T0 + 25.5, {job.id: job}), [], [violation])
    assert f"first seen {clock(T0 + 15.5)}; worded as last seen, {clock(T0 + 25.5)}" in text
    assert f"created={clock(T0)}" in text


def test_a_violation_seen_once_says_when() -> None:
    job = _stale_job()
    checker = Checker(engine=None, facts=Facts())  # type: ignore[arg-type]
    snapshot = Snapshot(T0 + 15.5, {job.id: job})
    checker.record("6 no_stale_running", no_stale_running(snapshot, Facts()), snapshot.now)
    (violation,) = checker.violations.values()
    text = traces(11, snapshot, [], [violation])
    assert f"(seen {clock(T0 + 15.5)})" in text
