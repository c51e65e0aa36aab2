"""The pure parts of bounded queues: a depth counts the jobs not yet started; what an enqueuer believes bounded sends its jobs to the checked insert, and the
lock's answer corrects that belief both ways."""

from __future__ import annotations

from pgqueue.data.insert_choice import COPY_THRESHOLD, BoundedQueuesSeen, insert_path
from pgqueue.jobs import NewJob
from pgqueue.sql.enqueue import WAITING_STATES
from pgqueue.states import FINAL_STATES, JobState


def job(queue: str) -> NewJob:
    return NewJob("t", queue, "[]", "{}", 0, 3, None, None, None, False)


def test_a_depth_counts_the_states_of_jobs_not_yet_started() -> None:
    assert set(WAITING_STATES) == set(JobState) - FINAL_STATES - {JobState.RUNNING}


def test_a_queue_believed_bounded_takes_the_checked_insert() -> None:
    seen = BoundedQueuesSeen()
    always = lambda: True  # noqa: E731
    assert insert_path(False, [job("a")], always, seen) == "one"
    big = [job("a")] * COPY_THRESHOLD
    assert insert_path(False, big, always, seen) == "copy"
    seen.suspect(["a"])
    assert insert_path(False, [job("a")], always, seen) == "batch"
    assert insert_path(False, big, always, seen) == "batch"
    assert insert_path(False, [job("b")], always, seen) == "one"
    assert seen.covers([job("b"), job("a")])
    seen.record(["a", "b"], ["b"])
    assert seen.queues == frozenset({"b"})
    assert insert_path(False, [job("a")], always, seen) == "one"
    assert insert_path(False, [job("b")], always, seen) == "batch"
