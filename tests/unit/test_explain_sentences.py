"""The sentences of ``pgqueue.explain`` for the cases the database tests do not reach easily:
a limit whose running jobs outnumber the listed ids, missing dependencies, a position at the
count's cap, an expired or absent lease, a cancelled job's reason, and the duration wording."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from pgqueue.explain import AHEAD_CAP, BlockerKind, JobFacts, explanation
from pgqueue.states import JobState

NOW = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def job_row(**changes: Any) -> SimpleNamespace:
    row: dict[str, Any] = {
        "id": 7,
        "state": "queued",
        "queue": "q",
        "task_name": "t",
        "attempts": 0,
        "max_attempts": 3,
        "run_at": NOW,
        "started_at": None,
        "finished_at": None,
        "last_error": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "depends_on": None,
        "workflow_role": None,
        "atomic": False,
        "snoozes": 0,
        "has_ticket": True,
        "ticket_run_at": NOW,
        "ticket_priority": 0,
        "ticket_atomic": False,
        "paused": False,
        "concurrency_limit": None,
        "running": 0,
        "concurrency_key": None,
        "rate_limit": None,
        "now": NOW,
    }
    row.update(changes)
    return SimpleNamespace(**row)


def facts(job: SimpleNamespace, **changes: Any) -> JobFacts:
    values: dict[str, Any] = {
        "job": job,
        "running_ids": [],
        "dependencies": {},
        "ahead": 0,
        "holder": None,
        "serving_workers": ["w1"],
        "live_workers": 1,
    }
    values.update(changes)
    return JobFacts(**values)


def only(job: SimpleNamespace, **changes: Any) -> tuple[BlockerKind, str]:
    [blocker] = explanation(facts(job, **changes)).blockers
    return blocker.kind, blocker.message


def test_limit_counts_running_jobs_beyond_the_listed_ids() -> None:
    kind, message = only(job_row(concurrency_limit=25, running=25), running_ids=list(range(1, 21)))
    assert kind is BlockerKind.AT_LIMIT
    assert message.endswith(": " + ", ".join(map(str, range(1, 21))) + " and 5 more")


def test_dependencies_missing_and_succeeded() -> None:
    job = job_row(state="waiting", has_ticket=False, depends_on=[3, 4, 5])
    deps = {3: JobState.SUCCEEDED, 4: None, 5: JobState.RETRYING}
    kind, message = only(job, dependencies=deps, ahead=None)
    assert kind is BlockerKind.DEPENDENCIES
    assert message == "waiting for 2 of 3 dependencies: 4 (missing), 5 (retrying)"


def test_position_at_the_cap_says_at_least() -> None:
    kind, message = only(job_row(), ahead=AHEAD_CAP)
    assert kind is BlockerKind.READY
    assert f"at least {AHEAD_CAP} jobs of queue q ahead of it" in message


def test_expired_lease_of_an_unregistered_worker() -> None:
    job = job_row(
        state="running",
        has_ticket=False,
        attempts=2,
        lease_owner="host:1:ab",
        started_at=NOW - dt.timedelta(minutes=3),
        lease_expires_at=NOW - dt.timedelta(seconds=95),
    )
    kind, message = only(job)
    assert kind is BlockerKind.LEASE_HELD
    assert message == (
        "running since 2026-11-22 11:57:00 UTC, attempt 2 of 3; lease held by worker host:1:ab, "
        "which is not in the worker registry; lease expired 1 min 35 s ago: a worker's rescue "
        "pass re-queues it"
    )


def test_atomic_running_job_has_no_lease_expiry() -> None:
    job = job_row(state="running", has_ticket=False, lease_owner="w", atomic=True)
    holder = ("w", "h", 9, NOW - dt.timedelta(seconds=4000), 4000.0, False)
    _, message = only(job, holder=holder)
    assert "(host h, pid 9), last seen 1 h 6 min ago (not live)" in message
    assert message.endswith("an atomic job: its claiming transaction holds it")


def test_cancelled_job_gives_its_reason() -> None:
    job = job_row(
        state="cancelled",
        has_ticket=False,
        finished_at=NOW,
        last_error="dependency 3 ended failed; not run",
    )
    kind, message = only(job)
    assert kind is BlockerKind.FINISHED
    assert message == (
        "cancelled at 2026-11-22 12:00:00 UTC: dependency 3 ended failed; not run "
        "(`pgqueue retry 7` runs it again)"
    )


def test_scheduled_in_days() -> None:
    later = NOW + dt.timedelta(days=2, hours=5, minutes=1)
    _, message = only(job_row(ticket_run_at=later))
    assert message == "run_at is in the future: 2026-11-24 17:01:00 UTC (in 2 d 5 h)"


def test_key_at_limit_names_the_running_jobs_and_counts_the_rest() -> None:
    job = job_row(concurrency_key="account:42")
    key = (3, 3, None, None, 0, None)  # running, limit, rate, per, started, wait
    kind, message = only(job, key=key, key_running_ids=[17, 18])
    assert kind is BlockerKind.KEY_AT_LIMIT
    assert message == "key account:42 at its limit: 3 of 3 running, jobs 17, 18 and 1 more"


def test_rate_limited_says_when_the_window_has_room() -> None:
    job = job_row(rate_limit=50)
    kind, message = only(job, queue_rate=(50, 1.0, 50, 0.34))
    assert kind is BlockerKind.RATE_LIMITED
    assert message == (
        "queue q is at its rate limit: 50 of 50 started in the last 1.0 s; "
        "the window has room again in 0.3 s"
    )


def test_a_key_with_room_and_a_window_with_room_block_nothing() -> None:
    keyed = job_row(concurrency_key="k")
    assert only(keyed, key=(1, 2, 5, 1.0, 4, None))[0] is BlockerKind.READY
    rated = job_row(rate_limit=5)
    assert only(rated, queue_rate=(5, 1.0, 4, None))[0] is BlockerKind.READY


def test_a_keyed_job_in_a_limited_queue_is_said_to_wait() -> None:
    kind, message = only(job_row(concurrency_key="k", concurrency_limit=4, running=1))
    assert kind is BlockerKind.KEY_IN_CONTROLLED_QUEUE
    assert "workers do not claim keyed jobs of such queues" in message
