"""The LISTEN connection: turns NOTIFYs sent with new tickets into wake-ups.

One dedicated psycopg connection per worker process listens on pgqueue's channel (opened by
``PgQueue.listen_connection``, with the engine's connection parameters). A payload is
a queue name, or ``"<queue> <epoch>"`` when the earliest new ticket is in the future; any role
that may connect can send one too, so a payload is a hint (``payload_epoch``). If the
connection drops, it reconnects with backoff and wakes the worker once (notifications may have
been missed meanwhile); polling covers the gap. A connection that cannot be opened is logged as
the listener's (``pgqueue listener connection to host:port/db failed: ...``), even when the
engine opened it: a worker's engine can be fine while its listen URL is not.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import psycopg
from sqlalchemy.exc import DBAPIError

from pgqueue import connections
from pgqueue.errors import name_connection_failure, pgqueue_logger
from pgqueue.sql.server import listen
from pgqueue.worker.patience import Pauses

log = pgqueue_logger("pgqueue.worker")


class Notifier(threading.Thread):
    """Background thread calling ``on_ready(run_at_epoch | None)`` for relevant notifications."""

    def __init__(
        self,
        connect: Callable[[], contextlib.AbstractContextManager[psycopg.Connection[Any]]],
        queues: Collection[str] | None,
        on_ready: Callable[[float | None], None],
        stopping: threading.Event,
    ) -> None:
        super().__init__(name="pgqueue-listener", daemon=True)
        self._connect = connect
        self._queues = None if queues is None else frozenset(queues)
        self._on_ready = on_ready
        self._stopping = stopping
        self.connected = threading.Event()
        self.connection_pid: int | None = None

    def run(self) -> None:
        pauses = Pauses(first=0.05, longest=2.0)
        while not self._stopping.is_set():
            opened = False
            try:
                with self._connect() as connection:
                    opened = True
                    connection.execute(listen())
                    self.connection_pid = connection.info.backend_pid
                    self.connected.set()
                    pauses.reset()
                    self._on_ready(None)  # anything sent while we were away: look once
                    self._listen(connection)
            except (psycopg.Error, DBAPIError) as exc:
                self.connected.clear()
                if self._stopping.is_set():
                    return
                delay = pauses.next()
                if opened:
                    log.warning("listener connection lost (%s); reconnecting in %.2fs", exc, delay)
                else:
                    log.warning("%s; retrying in %.2fs", _named_failure(exc), delay)
                self._stopping.wait(delay)

    def _listen(self, connection: psycopg.Connection[Any]) -> None:
        while not self._stopping.is_set():
            for notify in connection.notifies(timeout=0.5):
                self._dispatch(notify.payload)

    def _dispatch(self, payload: str) -> None:
        queue, _, epoch = payload.partition(" ")
        if self._queues is not None and queue not in self._queues:
            return
        self._on_ready(payload_epoch(epoch))


def _named_failure(exc: BaseException) -> str:
    """The one-line message of a failure to open the listener connection, naming it."""
    driver = exc.orig if isinstance(exc, DBAPIError) else exc
    if not isinstance(driver, BaseException):
        driver = exc
    pgconn = getattr(driver, "pgconn", None)
    where = None
    if pgconn is not None:
        try:
            where = connections.target(
                pgconn.host.decode(errors="replace"),
                pgconn.port.decode(errors="replace"),
                pgconn.db.decode(errors="replace"),
            )
        except psycopg.Error:  # a connection object that is already closed answers nothing
            where = None
    name_connection_failure(driver, "listener", where)
    return str(driver.args[0])


def payload_epoch(text: str) -> float | None:
    """The epoch a payload carries after its queue name, or None ("look now").

    Any role allowed to connect may send a NOTIFY on the channel, so the text is untrusted:
    anything but a finite number (``nan``, ``inf``, garbage) reads as None. NaN compares false
    with every time, so kept as the earliest known ``run_at`` it would never be replaced.
    """
    try:
        epoch = float(text)
    except ValueError:
        return None
    return epoch if math.isfinite(epoch) else None


def wall_to_monotonic(epoch: float) -> float:
    """Translate a database timestamp to this process's monotonic clock (for wait timeouts)."""
    return time.monotonic() + (epoch - time.time())
