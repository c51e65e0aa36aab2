"""The pure parts of bounded queues: the states a depth counts, written out in SQL, match
``JobState``; what an enqueuer believes bounded sends its jobs to the checked insert, and the
lock's answer corrects that belief both ways."""

from __future__ import annotations

from pgqueue.insert_choice import COPY_THRESHOLD, BoundedQueuesSeen, insert_path
from pgqueue.jobs import NewJob
from pgqueue.sql.enqueue import WAITING_STATES, WAITING_STATES_ARRAY
from pgqueue.states import FINAL_STATES, JobState


def job(queue: str) -> NewJob:
    return NewJob("t", queue, "[]", "{}", 0, 3, None, None, None, False)


def test_the_written_out_states_are_the_waiting_ones() -> None:
    listed = WAITING_STATES_ARRAY.removeprefix("'{").removesuffix("}'::text[]").split(",")
    assert listed == [state.value for state in WAITING_STATES]
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
