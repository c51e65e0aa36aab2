"""The pure parts of the insert choice: a depth counts the jobs not yet started; a queue an
enqueuer believes bounded sends its single jobs to a plan, and a plan's answer corrects that
belief both ways; what COPY may carry."""

from __future__ import annotations

from pgqueue.data.insert_choice import COPY_THRESHOLD, BoundedQueuesSeen, copyable, one_row
from pgqueue.jobs import NewJob
from pgqueue.sql.queue_bounds import WAITING_STATES
from pgqueue.states import FINAL_STATES, JobState


def job(queue: str) -> NewJob:
    return NewJob("t", queue, "[]", "{}", 0, 3, None, None, None, False)


def test_a_depth_counts_the_states_of_jobs_not_yet_started() -> None:
    assert set(WAITING_STATES) == set(JobState) - FINAL_STATES - {JobState.RUNNING}


def test_a_queue_believed_bounded_takes_a_plan() -> None:
    seen = BoundedQueuesSeen()
    assert one_row([job("a")], seen)
    assert not one_row([job("a"), job("a")], seen)
    seen.suspect(["a"])
    assert not one_row([job("a")], seen)
    assert one_row([job("b")], seen)
    assert seen.covers([job("b"), job("a")])
    seen.record(["a", "b"], ["b"])
    assert seen.queues == frozenset({"b"})
    assert one_row([job("a")], seen)
    assert not one_row([job("b")], seen)


def test_copy_carries_large_plans_of_one_due_time_and_shared_root_tickets() -> None:
    big = [job("a") for _ in range(COPY_THRESHOLD)]
    assert copyable(big, None)
    assert not copyable(big[1:], None)
    big[5] = NewJob("other", "b", "[1]", "{}", 3, 9, None, None, None, True)
    assert not copyable(big, None)  # the roots' tickets share their values
    assert copyable(big, [0, 1])
    big[6] = NewJob("t", "a", "[]", "{}", 0, 3, 5.0, None, None, False)
    assert not copyable(big, [0, 1])  # one due time
    big[6] = NewJob("t", "a", "[]", "{}", 0, 3, None, None, "key", False)
    assert not copyable(big, [0, 1])  # no ON CONFLICT in COPY
