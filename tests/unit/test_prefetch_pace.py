"""Claiming ahead of the free slots: how much (``Pace``), and how waiting attempts start."""

from __future__ import annotations

import uuid

from pgqueue.jobs import ClaimedJob
from pgqueue.worker.execution import Execution
from pgqueue.worker.prefetch import Pace
from pgqueue.worker.slots import Slots


def _execution(job_id: int) -> Execution:
    job = ClaimedJob(job_id, "t", "default", [], {}, 1, 3, 0, str(uuid.uuid4()), False, False)
    return Execution(job, 30.0, None, 0.0)


def test_pace_claims_ahead_what_came_free_in_the_last_window_within_the_cap() -> None:
    pace = Pace(cap=100, window=1.0)
    assert pace.ahead(100.0, 0) == 0  # nothing returned yet: only the free slots
    assert pace.ahead(100.5, 10) == 10  # 10 returns so far, within the window
    assert pace.ahead(101.0, 60) == 60
    assert pace.ahead(102.0, 110) == 50  # 50 returns in the last second
    assert pace.ahead(103.0, 1_000) == 100  # 890: the cap
    # Slow jobs: 2 returns in the last two seconds give 1 ahead, and an idle spell none.
    assert pace.ahead(105.0, 1_002) == 1
    assert pace.ahead(120.0, 1_002) == 0


def test_no_prefetch_without_a_cap() -> None:
    pace = Pace(cap=0)
    assert pace.ahead(1.0, 0) == 0
    assert pace.ahead(1.01, 1_000) == 0


def test_claimed_attempts_beyond_the_free_slots_wait_and_take_slots_in_claim_order() -> None:
    slots = Slots(concurrency=2, prefetch=3)
    assert slots.claimable(ahead=3) == 5
    executions = [_execution(i) for i in range(1, 6)]
    assert slots.add(executions) == executions[:2]  # the free slots start at once
    assert slots.claimable(ahead=3) == 0
    assert slots.running_ids() == [1, 2, 3, 4, 5]  # all leased and heartbeated
    assert [lease[0] for lease in slots.leases()] == [1, 2, 3, 4, 5]
    assert slots.returned == 0  # started is no pace: only slots that came free
    # A returning handler's thread runs the next waiting attempt itself; the claimer has room
    # once at most half of what it keeps ahead still waits.
    assert slots.handler_returned(executions[0]) == (True, False, executions[2])
    assert slots.handler_returned(executions[1]) == (True, True, executions[3])
    assert slots.returned == 2
    # Two slots busy, one attempt waiting: two more keep three ahead.
    assert slots.claimable(ahead=3) == 2


def test_a_stopping_worker_gives_back_the_waiting_attempts_and_starts_no_more() -> None:
    slots = Slots(concurrency=1, prefetch=5)
    executions = [_execution(i) for i in range(1, 5)]
    assert slots.add(executions) == executions[:1]
    given_back = slots.take_waiting()
    assert given_back == executions[1:]
    assert all(e.decided for e in given_back)
    assert slots.handler_returned(executions[0]) == (True, True, None)
    assert slots.give_up_unfinished() == []  # decided once: given back, not released again


def test_claims_ahead_overlap_the_outcome_writes_of_the_last_claim_up_to_twice_the_room() -> None:
    slots = Slots(concurrency=2, prefetch=3)
    first = [_execution(i) for i in range(1, 6)]
    assert slots.add(first) == first[:2]
    following = [slots.handler_returned(e)[2] for e in first]
    assert following == [first[2], first[3], first[4], None, None]
    # Every handler returned and no outcome is written yet: the next claim still fills the
    # slots and the prefetch, while the completer writes the first five.
    assert slots.running_ids() == [1, 2, 3, 4, 5]
    assert slots.claimable(ahead=3) == 5
    second = [_execution(i) for i in range(6, 11)]
    assert slots.add(second) == second[:2]
    rooms = [slots.handler_returned(execution)[1] for execution in second]
    # Ten held, twice the slots and the prefetch: no more until outcomes are written.
    assert rooms == [False] * 5
    assert slots.claimable(ahead=3) == 0
    slots.written(first)
    assert slots.claimable(ahead=3) == 5
