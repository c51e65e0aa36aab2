"""Gauges: the metrics a worker samples rather than counts, on their own thread.

Every second it sets ``pgqueue_jobs_running`` from the attempts the slots hold, so claims and
outcomes pay nothing for it. Every ``metrics_interval`` (the first at start) it reads the
queue figures (capped counts per queue and state, the wait of each queue's oldest ready job) in
one transaction that takes an advisory lock first: when several workers read at the same
moment, one reads and the others skip that round, and scrapes never query the database.
"""

from __future__ import annotations

import logging
import threading
import time

from pgqueue.metrics import NoMetrics
from pgqueue.worker.slots import Slots
from pgqueue.worker.store import WorkerStore

log = logging.getLogger("pgqueue.worker")

RUNNING_SAMPLE_INTERVAL = 1.0

# Counting stops here per queue and state, so a huge backlog costs a bounded read.
FIGURES_COUNT_CAP = 100_000


class Gauges:
    """The gauge thread's loop (until ``halt`` is set)."""

    def __init__(
        self,
        *,
        store: WorkerStore,
        slots: Slots,
        metrics: NoMetrics,
        interval: float,
        read_figures: bool,
        halt: threading.Event,
    ) -> None:
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
        try:
            figures = self._store.queue_figures(cap=FIGURES_COUNT_CAP)
        except Exception:
            if not self._halt.is_set():
                log.exception("metrics: reading the queue figures failed")
            return
        if figures is not None:
            self._metrics.queue_figures(*figures)
