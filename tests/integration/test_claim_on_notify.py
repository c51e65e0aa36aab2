"""An idle listening worker claims on the listener thread (one thread hand-off less on pick-up).

Two claimers then exist in one worker: the claim loop and the listener. They take turns under
one lock, so the free slots are never over-filled, and every job still runs exactly once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from support.polling import wait_until
from support.workers import in_thread

from pgqueue import JobState, PgQueue
from pgqueue.testing import ConcurrencyProbe, states_of, wait_for_states
from pgqueue.worker import Worker


def test_notifications_are_claimed_on_the_listener_within_the_free_slots(pgq: PgQueue) -> None:
    probe = ConcurrencyProbe()

    @pgq.task(name="slow")
    def slow() -> None:
        probe.run(0.05)

    # Polls never come in time: jobs are found through notifications and freed slots only.
    worker = Worker(pgq, concurrency=2, poll_interval=60, maintenance=False)
    claimers: list[str] = []
    claim = worker.store.claim

    def recording_claim(request: Any) -> Any:
        jobs = claim(request)
        if jobs:
            claimers.append(threading.current_thread().name)
        return jobs

    worker.store.claim = recording_claim  # type: ignore[method-assign]
    with in_thread(worker):
        notifier = wait_until(lambda: worker.notifier, 10, "the worker's listener")
        assert notifier.connected.wait(10)
        # Warm up (first connections, statements prepared), then let the worker go idle.
        warm = slow.enqueue()
        wait_for_states(pgq, [warm], timeout=30)
        time.sleep(0.3)
        ids = []
        for _ in range(12):
            ids.append(slow.enqueue())
            time.sleep(0.01)
        wait_for_states(pgq, ids, timeout=30)
    assert set(states_of(pgq, ids).values()) == {JobState.SUCCEEDED}
    assert worker.stats.claimed == 13
    assert worker.stats.succeeded == 13
    # The listener claimed for notifications that found the worker idle; the claim loop took
    # what waited for a freed slot. Never more than the two slots ran at once.
    assert "pgqueue-listener" in claimers
    assert probe.peak == 2
