"""The worker's row in the worker registry (``pgqueue_workers``), so operators see who is alive.

The worker registers before it claims anything. Its heartbeat refreshes the row: in the same
statement that extends its leases when it holds any (no extra round trip), on its own when it
holds none. The row carries the error of the worker's claims while they fail
(``claim_health``); the heartbeat beats at once when that changes. At a clean stop the row is
deleted. A worker killed without one leaves its row until it goes stale
(``Settings.worker_stale_seconds``, the rule in ``sql.workers.is_live``); maintenance then
deletes it. A row deleted while its worker was only cut off comes back at its next heartbeat.
The row names the tasks the worker registers (read when it registers), so operators' reads can
tell a job that waits because no live worker registers its task, and its pool (threads or
processes).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Protocol

from pgqueue.distribution import installed_version
from pgqueue.errors import error_line, pgqueue_logger
from pgqueue.jobs import WorkerEntry
from pgqueue.sqlstates import is_connection_error
from pgqueue.worker.claim_health import ClaimHealth

log = pgqueue_logger("pgqueue.worker")

# How many refreshes of its row a worker makes within the stale interval, at least.
REFRESHES_PER_STALE_INTERVAL = 3


def pgqueue_version() -> str:
    """The installed pgqueue distribution's version ("unknown" when run from a bare source
    tree)."""
    return installed_version() or "unknown"


class RegistryStore(Protocol):
    """What the registry needs of the database (``WorkerStore`` is one)."""

    def worker_seen(self, worker: WorkerEntry) -> dt.datetime:
        """Write or refresh ``worker``'s registry row; its ``started_at``."""
        ...

    def unregister_worker(self, worker_id: str) -> None:
        """Delete the row of ``worker_id``."""
        ...

    def delete_stale_workers(self, stale_seconds: float) -> list[str]:
        """Delete the rows of workers not seen within ``stale_seconds``; their ids."""
        ...


class WorkerRegistry:
    """One worker process's registry row: register, refresh, unregister; and the cleanup of
    stale rows that maintenance runs."""

    def __init__(
        self,
        store: RegistryStore,
        *,
        worker_id: str,
        queues: Sequence[str] | None,
        concurrency: int,
        stale_seconds: float,
        claim_health: ClaimHealth | None = None,
        task_names: Callable[[], Sequence[str]] = tuple,
        pool: str | None = None,
    ) -> None:
        self._store = store
        self._task_names = task_names  # read at registration: tasks are added before the start
        self.stale_seconds = stale_seconds
        self._claim_health = claim_health
        self._entry = WorkerEntry(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(queues or ()),
            concurrency=concurrency,
            version=pgqueue_version(),
            pool=pool,
        )

    @property
    def entry(self) -> WorkerEntry:
        """The row to write now: with the error of the failing claims, while they fail."""
        health = self._claim_health
        if health is None or health.error is None:
            return self._entry
        return dataclasses.replace(self._entry, claim_error=health.error)

    @property
    def refresh_interval(self) -> float:
        """The longest wait between two refreshes that keeps the row live."""
        return self.stale_seconds / REFRESHES_PER_STALE_INTERVAL

    def register(self) -> None:
        """Write the row. A failure is logged, not raised: the heartbeat writes it later."""
        self._entry = dataclasses.replace(self._entry, tasks=tuple(self._task_names()))
        try:
            started_at = self._store.worker_seen(self.entry)
        except Exception as exc:
            log.warning("worker registry: could not register (%s)", error_line(exc))
            return
        self._entry = dataclasses.replace(self._entry, started_at=started_at)

    def refresh(self) -> None:
        """Mark the worker seen now (the heartbeat's call when it extends no lease)."""
        self._store.worker_seen(self.entry)

    def unregister(self) -> None:
        """Delete the row (a clean stop). A failure is logged: the row goes stale instead.

        A database that cannot be reached is not reported again here: the stopping worker has
        already said so (the shutdown's line about the outcomes it could not write, or the
        lost-connection lines before it), and the row it leaves goes stale like a killed
        worker's."""
        try:
            self._store.unregister_worker(self._entry.id)
        except Exception as exc:
            log.log(
                logging.DEBUG if is_connection_error(exc) else logging.WARNING,
                "worker registry: could not delete this worker's row (%s); it is listed until "
                "it goes stale in %gs",
                error_line(exc),
                self.stale_seconds,
            )

    def remove_stale(self) -> None:
        """Delete the rows of workers gone stale (a maintenance duty)."""
        gone = self._store.delete_stale_workers(self.stale_seconds)
        if gone:
            log.info("worker registry: removed %d stale workers: %s", len(gone), gone[:20])
