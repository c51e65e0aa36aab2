"""A transaction that holds one queue's control row does not hold up other queues' outcomes:
the worker writes them at once, and the held queue's outcomes, unchanged, once the row is free."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine, text
from support.workers import in_thread

from pgqueue import JobState, PgQueue
from pgqueue.testing import states_of, wait_for_states
from pgqueue.worker import Worker


@pytest.mark.slow
def test_outcomes_of_other_queues_are_written_while_a_control_row_is_held(
    pgq: PgQueue, engine: Engine
) -> None:
    release = threading.Event()

    @pgq.task(queue="held", name="held_job")
    def held_job() -> str:
        release.wait(30)
        return "done"

    @pgq.task(queue="free", name="free_job")
    def free_job() -> str:
        return "done"

    pgq.set_queue_limit("held", 10)
    held_ids = held_job.enqueue_many([[] for _ in range(3)])
    worker = Worker(pgq, concurrency=8)
    with in_thread(worker, before_stop=release.set):
        wait_for_states(pgq, held_ids, {JobState.RUNNING}, timeout=15)
        with engine.connect() as holder:
            holder.execute(
                text("SELECT running FROM pgqueue_queues WHERE name = 'held' FOR UPDATE")
            )
            release.set()  # the held queue's outcomes now wait for the row
            time.sleep(0.2)
            began = time.monotonic()
            free_ids = free_job.enqueue_many([[] for _ in range(3)])
            wait_for_states(pgq, free_ids, {JobState.SUCCEEDED}, timeout=10)
            free_took = time.monotonic() - began
            more_ids = free_job.enqueue_many([[] for _ in range(3)])
            wait_for_states(pgq, more_ids, {JobState.SUCCEEDED}, timeout=10)
            more_took = time.monotonic() - began - free_took
            time.sleep(max(0.0, 10.0 - (time.monotonic() - began)))
            held_meanwhile = set(states_of(pgq, held_ids).values())
            holder.commit()
        wait_for_states(pgq, held_ids, {JobState.SUCCEEDED}, timeout=15)
    # The held queue's outcomes wait for the row once; later ones are tried with a short wait.
    assert free_took < 1.2, free_took
    assert more_took < 1.0, more_took
    assert held_meanwhile == {JobState.RUNNING}
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT state, attempts, errors FROM pgqueue_jobs WHERE queue = 'held'")
        ).all()
        running = connection.execute(
            text("SELECT running FROM pgqueue_queues WHERE name = 'held'")
        ).scalar_one()
    assert [(row.state, row.attempts, row.errors) for row in rows] == [("succeeded", 1, [])] * 3
    assert running == 0


def test_a_held_key_row_holds_up_only_its_own_keys_outcomes(pgq: PgQueue, engine: Engine) -> None:
    release = {key: threading.Event() for key in ("k0", "k1")}

    @pgq.task(queue="keyed", name="keyed_job", concurrency_key=lambda key: key, key_limit=5)
    def keyed_job(key: str) -> str:
        release[key].wait(30)
        return key

    held_id, free_id = keyed_job.enqueue("k1"), keyed_job.enqueue("k0")
    worker = Worker(pgq, concurrency=4)
    with in_thread(worker, before_stop=lambda: [event.set() for event in release.values()]):
        wait_for_states(pgq, [held_id, free_id], {JobState.RUNNING}, timeout=15)
        with engine.connect() as holder:
            holder.execute(
                text("SELECT running FROM pgqueue_concurrency_keys WHERE key = 'k1' FOR UPDATE")
            )
            release["k1"].set()  # k1's outcome now waits for its key's row
            time.sleep(1.0)
            began = time.monotonic()
            release["k0"].set()
            wait_for_states(pgq, [free_id], {JobState.SUCCEEDED}, timeout=10)
            free_took = time.monotonic() - began
            held_meanwhile = states_of(pgq, [held_id])[held_id]
            holder.commit()
        wait_for_states(pgq, [held_id], {JobState.SUCCEEDED}, timeout=15)
    assert held_meanwhile is JobState.RUNNING
    # A fresh outcome is written at once: no lock wait, no backoff of the held key's outcome.
    assert free_took < 0.5, free_took
