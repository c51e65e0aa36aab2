"""Maintenance: the duties a worker does for the whole database, on their own thread.

Every ``rescue_interval``: a scheduler pass (enqueue due periodic ticks), a rescue of expired
leases (``WorkerStore.rescue_expired``: retried or failed for good in SQL, the counterpart of
``backoff.after_failure``), and, at the first pass and then every half of
``worker_stale_seconds``, the deletion of stale rows from the worker registry. Every
``prune_interval`` (the first a tenth of it after start):
prune finished jobs past their retention, repair the running counts of limited queues, and
delete the rows of concurrency keys no job has any more (a bounded stretch per pass, resumed
where the last pass stopped).
Under ``history="partitioned"`` every pass also moves jobs finished more than
``history_move_after`` ago into the partitioned history, in bounded batches.
Rescue and prune elect one leader per database with an advisory lock, and a scheduler pass
enqueues each tick once, so any number of workers may run this at once. Each duty is guarded on its own: one failing (say, a periodic task whose arguments
no longer validate) must not stop the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from pgqueue.config import Settings
from pgqueue.errors import error_line, pgqueue_logger
from pgqueue.metrics import NO_METRICS, NoMetrics
from pgqueue.sqlstates import is_connection_error
from pgqueue.worker.registry import WorkerRegistry
from pgqueue.worker.stats import WorkerStats

log = pgqueue_logger("pgqueue.worker")

RESCUE_BATCH = 1000
PRUNE_BATCH = 10_000
# Jobs moved to history per statement, and statements per pass at most: a pass that finds a
# backlog drains it over several passes instead of holding the maintenance thread.
HISTORY_BATCH = 5_000
HISTORY_BATCHES_PER_PASS = 20
# Key rows read per statement, and statements per pass at most, for the idle key cleanup.
KEY_BATCH = 5_000
KEY_BATCHES_PER_PASS = 20
LEASE_EXPIRED_ERROR = "lease expired (worker lost)"


class MaintenanceStore(Protocol):
    """What maintenance needs of the database (``WorkerStore`` is one). Each call takes its
    own advisory lock, so one worker of the cluster does each pass at a time."""

    def rescue_expired(self, *, limit: int, error: str) -> list[tuple[int, str]]:
        """Re-queue or fail up to ``limit`` jobs whose lease expired; ``(job id, new state)``."""
        ...

    def prune(self, *, succeeded_before: float, failed_before: float, limit: int) -> int:
        """Delete up to ``limit`` finished jobs older than the given ages; how many."""
        ...

    def move_to_history(self, *, age: float, limit: int) -> int:
        """Move up to ``limit`` finished jobs older than ``age`` to history; how many."""
        ...

    def delete_idle_keys(self, *, after: str, limit: int) -> tuple[str | None, int]:
        """Delete idle concurrency keys' rows among up to ``limit`` after key ``after``."""
        ...

    def recount_running(self) -> dict[str, int]:
        """Correct drifted running counters; ``{queue or key: corrected count}``."""
        ...


class Maintenance:
    """The maintenance thread's loop (until ``halt`` is set)."""

    def __init__(
        self,
        *,
        store: MaintenanceStore,
        settings: Settings,
        run_schedules: Callable[[], object],
        stats: WorkerStats,
        halt: threading.Event,
        metrics: NoMetrics = NO_METRICS,
        registry: WorkerRegistry | None = None,
    ) -> None:
        self._metrics = metrics
        self._registry = registry
        self._store = store
        self._settings = settings
        self._run_schedules = run_schedules
        self._stats = stats
        self._halt = halt
        # Where the idle key cleanup goes on (keys in order; "" from the first).
        self._keys_after = ""

    def run(self) -> None:
        settings = self._settings
        next_prune = time.monotonic() + settings.prune_interval / 10
        next_cleanup = 0.0  # the first pass deletes what earlier runs left
        while not self._halt.wait(settings.rescue_interval):
            self._duty("schedule pass", self._run_schedules)
            self._duty("rescue pass", self.rescue)
            if settings.partitioned_history:
                self._duty("history move", self.move_to_history)
            registry = self._registry
            if registry is not None and time.monotonic() >= next_cleanup:
                # A row is stale only after ``stale_seconds`` (and hidden from listings from
                # then on): deleting twice per that interval keeps an idle worker's statements
                # few without letting dead rows pile up.
                next_cleanup = time.monotonic() + registry.stale_seconds / 2
                self._duty("stale worker cleanup", registry.remove_stale)
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + settings.prune_interval
                self._duty("prune pass", self.prune)
                self._duty("queue limit recount", self.recount_running)
                self._duty("idle key cleanup", self.delete_idle_keys)

    def _duty(self, what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:
            if self._halt.is_set():
                return
            if is_connection_error(exc):
                # The store retries a lost connection until the worker stops: then it gives up,
                # and that is no bug worth a traceback.
                log.warning("maintenance: %s failed: %s", what, error_line(exc))
            else:
                log.exception("maintenance: %s failed", what)

    def rescue(self) -> None:
        rescued = self._store.rescue_expired(limit=RESCUE_BATCH, error=LEASE_EXPIRED_ERROR)
        if rescued:
            self._stats.rescued += len(rescued)
            self._metrics.rescued(len(rescued))
            log.warning("rescued %d jobs with expired leases: %s", len(rescued), rescued[:20])

    def prune(self) -> None:
        settings = self._settings
        pruned = self._store.prune(
            succeeded_before=settings.succeeded_retention,
            failed_before=settings.failed_retention,
            limit=PRUNE_BATCH,
        )
        if pruned:
            log.info("pruned %d finished jobs", pruned)

    def move_to_history(self) -> int:
        """Move finished jobs past ``history_move_after`` into the partitioned history; how
        many were moved."""
        total = 0
        for _ in range(HISTORY_BATCHES_PER_PASS):
            moved = self._store.move_to_history(
                age=self._settings.history_move_after, limit=HISTORY_BATCH
            )
            total += moved
            if moved < HISTORY_BATCH or self._halt.is_set():
                break
        if total:
            log.debug("moved %d finished jobs to history", total)
        return total

    def delete_idle_keys(self) -> int:
        """Delete idle concurrency keys' rows over up to ``KEY_BATCHES_PER_PASS`` batches, from
        where the last pass stopped; how many were deleted. Without this, keys made of customer
        or order ids would pile up for good."""
        total = 0
        for _ in range(KEY_BATCHES_PER_PASS):
            last, deleted = self._store.delete_idle_keys(after=self._keys_after, limit=KEY_BATCH)
            total += deleted
            self._keys_after = last or ""
            if last is None or self._halt.is_set():
                break
        if total:
            log.debug("deleted %d idle concurrency keys' rows", total)
        return total

    def recount_running(self) -> None:
        # The running counters of limited queues are kept exact by the statements that move
        # jobs in and out of RUNNING; this only repairs what bypassed them (rows deleted or
        # edited by hand), which would otherwise hold a queue at its limit for good.
        for queue, running in self._store.recount_running().items():
            log.warning("queue %s: running count corrected to %d", queue, running)
