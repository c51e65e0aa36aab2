"""Fault tests (issue 5, items 1-6): real worker processes under load, kills, storms, restarts.

Every test runs ``python -m pgqueue worker`` subprocesses (most under the ``--processes``
supervisor) against a fresh database and checks exact counts in the ``ledger`` table the
``work`` task writes to (see ``conftest.py``): a ``done`` row is committed in the handler's own
session, so it exists once per run that completed its handler; with ``start_mark`` a ``start``
row is committed as the handler begins, so runs cut short are visible too.

Durations are printed (``-s``) so the suite's budget can be checked.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from conftest import App, WorkerProcess

FINAL = ("succeeded", "failed", "cancelled")


def _children(app: App, supervisor_pid: int, count: int) -> list[int]:
    return list(
        app.wait_until(
            lambda: (lambda now: now if len(now) == count else None)(
                app.children_of(supervisor_pid)
            ),
            30,
            f"{count} worker processes",
        )
    )


def _stop(supervisor: WorkerProcess) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0


# -- 1. many workers -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_workers_run_10000_jobs_exactly_once(app: App, seed: int) -> None:
    """10,000 jobs, 4 processes x 8 threads, random job durations (one seed per run)."""
    began = time.monotonic()
    rng = random.Random(seed)
    supervisor = app.start_worker("--processes", "4", "--concurrency", "8")
    children = _children(app, supervisor.pid, 4)
    app.wait_listening(count=4)
    ids: list[int] = []
    for _ in range(10):  # enqueued while the workers run: wake-ups and claims race inserts
        durations = [rng.choice([0.0, 0.0, 0.0, rng.uniform(0.0, 0.01)]) for _ in range(1000)]
        ids += app.module.work.enqueue_many([{"seconds": round(d, 4)} for d in durations])
    assert len(set(ids)) == 10_000
    app.wait_all_final(10_000, timeout=240)

    [(rows, distinct)] = app.rows("SELECT count(*), count(DISTINCT job_id) FROM ledger")
    assert (rows, distinct) == (10_000, 10_000)
    assert set(app.scalars("SELECT job_id FROM ledger")) == set(ids)
    assert app.rows("SELECT state, attempts, count(*) FROM pgqueue_jobs GROUP BY 1, 2") == [
        ("succeeded", 1, 10_000)
    ]
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    assert set(app.scalars("SELECT DISTINCT pid FROM ledger")) == set(children)
    assert app.children_of(supervisor.pid) == children  # no worker process died
    _stop(supervisor)
    assert "starting a new one" not in supervisor.log()
    assert "Traceback" not in supervisor.log()
    print(f"seed {seed}: 10,000 jobs in {time.monotonic() - began:.1f}s")


# -- 6. enqueue under load -------------------------------------------------------------------


@pytest.mark.slow
def test_enqueue_under_load_processed_set_equals_committed_set(app: App) -> None:
    """20 threads enqueue in their own transactions, half roll back, while workers drain."""
    began = time.monotonic()
    supervisor = app.start_worker("--processes", "2", "--concurrency", "4")
    _children(app, supervisor.pid, 2)
    app.wait_listening(count=2)
    producer = create_engine(app.url, pool_size=20, max_overflow=0)
    committed: set[int] = set()
    rolled_back: set[int] = set()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                with Session(producer) as session:
                    ids = app.module.work.enqueue_many(
                        [{} for _ in range(rng.randint(1, 5))], session=session
                    )
                    time.sleep(rng.uniform(0, 0.01))  # open while workers claim around it
                    commit = rng.random() < 0.5
                    if commit:
                        session.commit()
                    else:
                        session.rollback()
                with lock:
                    (committed if commit else rolled_back).update(ids)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    producer.dispose()
    # The workers drained while the producers ran (not only afterwards).
    assert app.scalars("SELECT count(*) FROM ledger")[0] > 0
    assert errors == []
    assert not committed & rolled_back
    print(f"{len(committed)} committed, {len(rolled_back)} rolled back")
    assert len(committed) > 1000 and len(rolled_back) > 1000
    app.wait_all_final(len(committed), timeout=120)

    assert app.done_counts() == dict.fromkeys(committed, 1)
    jobs = app.rows("SELECT id, state, attempts FROM pgqueue_jobs")
    assert {j.id for j in jobs} == committed  # nothing of a rolled-back transaction remains
    assert {(j.state, j.attempts) for j in jobs} == {("succeeded", 1)}
    assert app.scalars("SELECT count(*) FROM pgqueue_message_queue") == [0]
    _stop(supervisor)
    print(f"enqueue under load: {time.monotonic() - began:.1f}s")
