"""The fault harness's check that a held control row holds up its own queue's outcomes only,
on made-up snapshots: another queue's outcome written late while the row was held is found;
the held queue's own, and a neighbour's written at once, are not."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from tests.chaos.app import QUEUE_ASYNC, QUEUE_KEYED, QUEUE_LIMITED
from tests.chaos.invariants import Facts, outcomes_not_held_up
from tests.chaos.snapshot import Run, Snapshot
from tests.chaos.workload import Event

T0 = 1_000_000.0


def _job(job_id: int, queue: str, finished: float, key: str | None = None) -> Any:
    return SimpleNamespace(
        id=job_id,
        task_name="chaos.leased",
        queue=queue,
        concurrency_key=key,
        state="succeeded",
        attempts=1,
        finished_at=dt.datetime.fromtimestamp(T0 + finished, dt.UTC),
    )


def _snapshot(*jobs_and_ends: tuple[Any, float]) -> Snapshot:
    snapshot = Snapshot(T0 + 100, {job.id: job for job, _ in jobs_and_ends})
    for job, ended in jobs_and_ends:
        run = Run(job.id, job.id, 1, "leased", "run", 1, T0 + ended - 0.5, T0 + ended, "ok")
        snapshot.runs[job.id].append(run)
    return snapshot


def _held(detail: str) -> Facts:
    # The row held from 10 s to 20 s.
    return Facts(events=[Event(T0 + 10, "lock_control", detail, until=T0 + 20)])


def test_another_queues_outcome_held_up_by_the_row_is_found() -> None:
    late = _job(1, QUEUE_ASYNC, finished=19)  # returned at 11, written 8 s later
    found = outcomes_not_held_up(_snapshot((late, 11)), _held(f"queue {QUEUE_LIMITED}'s row"))
    assert [v.job_id for v in found] == [1]
    assert "another queue's" in found[0].message


def test_a_neighbour_written_at_once_and_the_held_queues_own_outcome_are_not() -> None:
    prompt = _job(1, QUEUE_ASYNC, finished=11.8)
    own = _job(2, QUEUE_LIMITED, finished=20.2)  # waited for the row it needs
    facts = _held(f"queue {QUEUE_LIMITED}'s row")
    assert outcomes_not_held_up(_snapshot((prompt, 11), (own, 11)), facts) == []


def test_a_key_row_held_holds_up_only_the_keyed_queue() -> None:
    keyed = _job(1, QUEUE_KEYED, finished=19, key="k1")  # another key, same queue: kept too
    limited = _job(2, QUEUE_LIMITED, finished=19)
    found = outcomes_not_held_up(_snapshot((keyed, 11), (limited, 11)), _held("key k0's row"))
    assert [v.job_id for v in found] == [2]


def test_a_leased_outcome_held_up_while_an_atomic_job_of_its_queue_ran_is_found() -> None:
    leased = _job(1, QUEUE_LIMITED, finished=19)  # returned at 11, written 8 s later
    atomic = _job(2, QUEUE_LIMITED, finished=20.1)
    atomic.task_name = "chaos.atomic"
    snapshot = _snapshot((leased, 11))
    snapshot.jobs[2] = atomic
    snapshot.runs[2].append(Run(9, 2, 1, "atomic_limited_slow", "run", 2, T0 + 9, T0 + 20, "ok"))
    found = outcomes_not_held_up(snapshot, Facts())
    assert [v.job_id for v in found] == [1]
    assert "atomic job 2 of its queue" in found[0].message
