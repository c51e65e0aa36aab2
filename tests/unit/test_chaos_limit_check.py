"""The fault harness's limit check on made-up ledgers: a run without its end mark counts until
its attempt's outcome gave its slot back, never on to its job's next run; runs that really
overlap past a limit are still found."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from tests.chaos.app import QUEUE_LIMITED
from tests.chaos.invariants import Facts, limits_respected
from tests.chaos.snapshot import Run, Snapshot
from tests.chaos.workload import LimitChange

T0 = 1_000_000.0


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(T0 + at, dt.UTC).isoformat()


def _job(job_id: int, *, attempts: int, errors: list[dict[str, Any]], finished: float) -> Any:
    return SimpleNamespace(
        id=job_id,
        task_name="chaos.leased",
        queue=QUEUE_LIMITED,
        state="succeeded",
        attempts=attempts,
        errors=errors,
        finished_at=dt.datetime.fromtimestamp(T0 + finished, dt.UTC),
        concurrency_key=None,
        unique_key=None,
    )


def _snapshot(jobs: list[Any], runs: list[tuple[int, int, float, float | None]]) -> Snapshot:
    snapshot = Snapshot(T0 + 100, {job.id: job for job in jobs})
    for n, (job_id, attempt, started, ended) in enumerate(runs):
        run = Run(n, job_id, attempt, "limited", "run", 1, T0 + started, ended and T0 + ended, None)
        snapshot.runs[job_id].append(run)
    return snapshot


FACTS = Facts(limits=[LimitChange(T0 - 10, T0 - 10, 2)])


def test_a_run_without_its_end_mark_ends_with_its_attempts_outcome() -> None:
    # Job 1's first run lost its end mark; its attempt failed at 2 s (the slot given back) and
    # its next run began only at 9 s. Jobs 2 and 3 ran two at a time from 3 s to 6 s.
    failed = {"attempt": 1, "error": "Traceback ...", "at": _iso(2)}
    jobs = [
        _job(1, attempts=2, errors=[failed], finished=10),
        _job(2, attempts=1, errors=[], finished=6.1),
        _job(3, attempts=1, errors=[], finished=6.1),
    ]
    runs = [(1, 1, 0, None), (1, 2, 9, 10), (2, 1, 3, 6), (3, 1, 3.5, 6)]
    assert limits_respected(_snapshot(jobs, runs), FACTS) == []


def test_runs_over_the_limit_are_still_found() -> None:
    # Job 1's first run (no end mark) held its slot until its outcome at 5 s: three runs at
    # once from 3.5 s with a limit of 2.
    failed = {"attempt": 1, "error": "Traceback ...", "at": _iso(5)}
    jobs = [
        _job(1, attempts=2, errors=[failed], finished=10),
        _job(2, attempts=1, errors=[], finished=6.1),
        _job(3, attempts=1, errors=[], finished=6.1),
    ]
    runs = [(1, 1, 0, None), (1, 2, 9, 10), (2, 1, 3, 6), (3, 1, 3.5, 6)]
    found = limits_respected(_snapshot(jobs, runs), FACTS)
    assert [v.message for v in found] == [
        f"3 overlapping runs of queue {QUEUE_LIMITED} (limit 2): jobs [1, 2, 3]"
    ]
