"""Notifications are hints: a forged one costs at most a claim, never a wake-up.

Any role that may connect can ``NOTIFY pgqueue, '...'`` with any payload. A payload whose
epoch is not a finite number (``nan``, ``inf``, ``1e999``, garbage) is read as "look now",
so delayed jobs enqueued afterwards still start at their ``run_at``, not at the next poll. A
forged earlier epoch wakes the worker once more, and it still wakes at the real ones.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import Engine
from support.polling import wait_until
from support.workers import in_thread

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
    with in_thread(Worker(pgq, concurrency=1, poll_interval=60, maintenance=False)) as worker:
        notifier = wait_until(lambda: worker.notifier, 10, "the worker's listener")
        assert notifier.connected.wait(10)
        warm = later.enqueue()
        wait_for_states(pgq, [warm], timeout=30)
        conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as other:
            for payload in FORGED:
                other.execute("SELECT pg_notify('pgqueue', %s)", (payload,))
        # Notifications arrive in the order their transactions committed: the listener reads
        # all of these before the delayed jobs' own.
        enqueued = time.monotonic()
        delayed = [later.configure(delay=1.0).enqueue(), later.configure(delay=2.0).enqueue()]
        wait_for_states(pgq, delayed, timeout=15)
        waited = time.monotonic() - enqueued
    assert set(states_of(pgq, delayed).values()) == {JobState.SUCCEEDED}
    assert waited < 10, waited
    assert worker.stats.succeeded == 3


def test_a_forged_earlier_epoch_does_not_replace_a_real_one(pgq: PgQueue, engine: Engine) -> None:
    @pgq.task(name="forged.later")
    def later() -> None:
        return None

    with in_thread(Worker(pgq, concurrency=1, poll_interval=60, maintenance=False)) as worker:
        notifier = wait_until(lambda: worker.notifier, 10, "the worker's listener")
        assert notifier.connected.wait(10)
        enqueued = time.monotonic()
        delayed = later.configure(delay=2.0).enqueue()
        conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as other:
            other.execute("SELECT pg_notify('pgqueue', %s)", (f"default {time.time() + 0.3}",))
        wait_for_states(pgq, [delayed], timeout=15)
        waited = time.monotonic() - enqueued
    assert states_of(pgq, [delayed]) == {delayed: JobState.SUCCEEDED}
    assert 1.5 < waited < 10, waited
