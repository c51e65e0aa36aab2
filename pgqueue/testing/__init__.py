"""Helpers for test suites of applications that use pgqueue (and for pgqueue's own).

``immediate(pgq)`` runs jobs in the test's thread as their transactions commit
(``immediate_mode``); ``run_jobs`` runs a worker until the queues are idle and returns what ran;
``assert_enqueued`` and its friends check what is waiting (``assertions``); ``TestDatabases``
makes a fresh migrated database per test (``databases``). The pytest fixtures over them live in
``pgqueue.testing.plugin``, the one module here that imports pytest. ``run_until_final`` runs an
in-process worker until the given jobs reach a final state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from pgqueue.core import PgQueue
from pgqueue.data import admin as admin_data
from pgqueue.db import executor_for
from pgqueue.states import FINAL_STATES, JobState
from pgqueue.testing.assertions import assert_enqueued, assert_not_enqueued, enqueued_jobs
from pgqueue.testing.databases import TestDatabases
from pgqueue.testing.immediate_mode import ImmediateMode, immediate
from pgqueue.testing.records import EnqueuedJob, JobCall, JobRun
from pgqueue.testing.running import run_jobs
from pgqueue.worker import Worker

__all__ = [
    "ConcurrencyProbe",
    "EnqueuedJob",
    "ImmediateMode",
    "JobCall",
    "JobRun",
    "TestDatabases",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued_jobs",
    "immediate",
    "run_jobs",
    "run_until_final",
    "states_of",
    "table_counts",
    "wait_for_states",
]


class ConcurrencyProbe:
    """Counts handlers running at once in this process; ``peak`` is the most seen.

    Call ``run(seconds)`` inside a handler, run the jobs, then assert on ``peak``: a queue limit
    or a worker's concurrency held, or was used.
    """

    def __init__(self) -> None:
        self.peak = 0
        self._current = 0
        self._lock = threading.Lock()

    def run(self, seconds: float) -> None:
        """Count this handler as running for ``seconds`` (it sleeps)."""
        with self._lock:
            self._current += 1
            self.peak = max(self.peak, self._current)
        try:
            time.sleep(seconds)
        finally:
            with self._lock:
                self._current -= 1


def table_counts(engine: Engine) -> dict[str, int]:
    """Row counts of pgqueue's two tables."""
    with Session(engine) as session:
        return admin_data.table_counts(executor_for(session))


def states_of(pgq: PgQueue, job_ids: Iterable[int]) -> dict[int, JobState]:
    """The current state of each of the jobs that exist."""
    ids = list(job_ids)
    with pgq.sessions() as session:
        return admin_data.states_of_jobs(executor_for(session), ids)


def wait_for_states(
    pgq: PgQueue,
    job_ids: Iterable[int],
    states: Collection[JobState] = FINAL_STATES,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> dict[int, JobState]:
    """Wait until every job is in one of ``states``; raise TimeoutError with the stragglers."""
    ids = list(job_ids)
    deadline = time.monotonic() + timeout
    while True:
        current = states_of(pgq, ids)
        if all(current.get(i) in states for i in ids):
            return current
        if time.monotonic() > deadline:
            pending = {i: current.get(i) for i in ids if current.get(i) not in states}
            raise TimeoutError(
                f"{len(pending)} jobs not in {sorted(states)}: {dict(list(pending.items())[:10])}"
            )
        time.sleep(interval)


def run_until_final(
    pgq: PgQueue,
    job_ids: Iterable[int],
    *,
    timeout: float = 60.0,
    **worker_options: Any,
) -> dict[int, JobState]:
    """Run a worker in a thread until the jobs are final (retries included), then stop it."""
    ids = list(job_ids)
    worker_options.setdefault("concurrency", 4)
    worker = Worker(pgq, **worker_options)
    thread = threading.Thread(target=worker.run, name="pgqueue-test-worker", daemon=True)
    thread.start()
    try:
        return wait_for_states(pgq, ids, timeout=timeout)
    finally:
        worker.stop()
        thread.join(timeout=60)
