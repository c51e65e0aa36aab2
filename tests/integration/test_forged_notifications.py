"""Notifications are hints: a forged one costs at most a claim, never a wake-up.

Any role that may connect can ``NOTIFY pgqueue, '...'`` with any payload. A payload whose
epoch is not a finite number (``nan``, ``inf``, ``1e999``, garbage) is read as "look now",
so delayed jobs enqueued afterwards still start at their ``run_at``, not at the next poll. A
forged earlier epoch wakes the worker once more, and it still wakes at the real ones.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from pgqueue import JobState, PgQueue
from pgqueue.testing import states_of, wait_for_states
from pgqueue.worker import Worker
from pgqueue.worker.notifier import payload_epoch

FORGED = [
    "default nan",
    "default NaN",
    "default inf",
    "default -inf",
    "default 1e999",
    "default -1e999",
    "default 1e308",
    "default -1e308",
    "default garbage",
    "default 12 34",
    "default ",
    "",
]


@pytest.mark.parametrize("payload", FORGED)
def test_only_finite_epochs_are_read(payload: str) -> None:
    _, _, text = payload.partition(" ")
    epoch = payload_epoch(text)
    if text in {"1e308", "-1e308"}:
        assert epoch == float(text)
    else:
        assert epoch is None


def test_payload_epoch_of_a_ticket() -> None:
    assert payload_epoch("1767225600.123456") == 1767225600.123456
    assert payload_epoch("") is None


def test_forged_notifications_do_not_stop_delayed_wakeups(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="forged.later")
    def later() -> None:
        return None

    # Polls never come in time: the delayed job can only start through its notification.
    worker = Worker(pgq, concurrency=1, poll_interval=60, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert _wait(lambda: worker.notifier is not None)
        assert worker.notifier is not None
        assert worker.notifier.connected.wait(10)
        warm = later.enqueue()
        wait_for_states(pgq, [warm], timeout=30)
        conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as other:
            for payload in FORGED:
                other.execute("SELECT pg_notify('pgqueue', %s)", (payload,))
        time.sleep(0.5)  # the listener has read them all
        enqueued = time.monotonic()
        delayed = [later.configure(delay=1.0).enqueue(), later.configure(delay=2.0).enqueue()]
        wait_for_states(pgq, delayed, timeout=15)
        waited = time.monotonic() - enqueued
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert set(states_of(pgq, delayed).values()) == {JobState.SUCCEEDED}
    assert waited < 10, waited
    assert worker.stats.succeeded == 3


def test_a_forged_earlier_epoch_does_not_replace_a_real_one(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="forged.later")
    def later() -> None:
        return None

    worker = Worker(pgq, concurrency=1, poll_interval=60, maintenance=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert _wait(lambda: worker.notifier is not None)
        assert worker.notifier is not None
        assert worker.notifier.connected.wait(10)
        enqueued = time.monotonic()
        delayed = later.configure(delay=2.0).enqueue()
        conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as other:
            other.execute("SELECT pg_notify('pgqueue', %s)", (f"default {time.time() + 0.3}",))
        wait_for_states(pgq, [delayed], timeout=15)
        waited = time.monotonic() - enqueued
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert states_of(pgq, [delayed]) == {delayed: JobState.SUCCEEDED}
    assert 1.5 < waited < 10, waited


def _wait(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
