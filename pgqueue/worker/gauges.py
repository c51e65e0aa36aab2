"""Gauges: the metrics a worker samples rather than counts, on their own thread.

Every second it sets ``pgqueue_jobs_running`` from the attempts the slots hold, so claims and
outcomes pay nothing for it. Every ``metrics_interval`` (the first at start) one worker of the
cluster reads the queue figures (capped counts per queue and state, the wait of each queue's
oldest ready job, the ready jobs whose task no live worker registers, capped counts of
workflows per state) in one transaction: the live worker with the smallest id in the worker
registry. The others ask that question in one statement and skip the round; behind it an
advisory lock (transaction-level, so safe behind a pooler) keeps workers that each believe
they are first (while the registry names none before them) from reading at the same moment.
Scrapes never query the database. A worker that stops being the reader removes its figures,
so the figures across instances are their maximum.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from pgqueue.errors import pgqueue_logger
from pgqueue.metrics import NoMetrics
from pgqueue.worker.registry import WorkerRegistry
from pgqueue.worker.slots import Slots

log = pgqueue_logger("pgqueue.worker")

RUNNING_SAMPLE_INTERVAL = 1.0

# Counting stops here per queue and state, so a huge backlog costs a bounded read.
FIGURES_COUNT_CAP = 100_000


class FiguresStore(Protocol):
    """What the gauges need of the database (``WorkerStore`` is one)."""

    def queue_figures(
        self, *, cap: int, worker_id: str, stale_seconds: float
    ) -> tuple[dict[str, dict[str, int]], dict[str, float], dict[str, int], dict[str, int]] | None:
        """The cluster's queue and workflow figures, or None when another worker reads them."""
        ...


class Gauges:
    """The gauge thread's loop (until ``halt`` is set)."""

    def __init__(
        self,
        *,
        store: FiguresStore,
        slots: Slots,
        metrics: NoMetrics,
        interval: float,
        read_figures: bool,
        halt: threading.Event,
        registry: WorkerRegistry,
    ) -> None:
        self._registry = registry
        self._holds_figures = False  # this worker's gauges hold a reading of its own
        self._store = store
        self._slots = slots
        self._metrics = metrics
        self._interval = interval
        self._read_figures = read_figures
        self._halt = halt

    def run(self) -> None:
        next_figures = time.monotonic()
        while True:
            self._metrics.running(self._slots.running_per_queue())
            if self._read_figures and time.monotonic() >= next_figures:
                next_figures = time.monotonic() + self._interval
                self.read_figures()
            if self._halt.wait(min(RUNNING_SAMPLE_INTERVAL, self._interval)):
                return

    def read_figures(self) -> None:
        registry = self._registry
        try:
            figures = self._store.queue_figures(
                cap=FIGURES_COUNT_CAP,
                worker_id=registry.entry.id,
                stale_seconds=registry.stale_seconds,
            )
        except Exception:
            if not self._halt.is_set():
                log.exception("metrics: reading the queue figures failed")
            return
        if figures is not None:
            counts, oldest, unregistered, workflows = figures
            self._metrics.queue_figures(counts, oldest, unregistered)
            self._metrics.workflow_figures(workflows)
            self._holds_figures = True
        elif self._holds_figures:
            # Another worker reads them now: a reading of ours left in place would go stale.
            self._metrics.queue_figures({}, {}, {})
            self._metrics.workflow_figures({})
            self._holds_figures = False
