"""Names the sessions that hold up a migration, for the one line ``pgqueue migrate`` prints
when its ``lock_timeout`` fires, and, while a wait goes on past ``WAIT_NOTICE_AFTER`` seconds,
for the line it prints meanwhile.

Once the lock wait is cancelled the migration no longer waits, so nothing blocks it any more and
``pg_blocking_pids`` has nothing to say: the sessions are looked up while it waits. A watch
polls ``pg_blocking_pids`` of the migration's session from a connection of its own and keeps
the latest non-empty answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from sqlalchemy import Connection, Engine

from pgqueue.data import schema as schema_data
from pgqueue.db import ConnectionExecutor

# How often a watch asks who blocks the migration: a lock wait of at least this long is named.
POLL_INTERVAL: Final = 0.1
# A wait this long is reported while it goes on: longer than the default lock_timeout, so only
# a wait no lock_timeout ends gets there, as an index build ``CONCURRENTLY`` waiting for the
# transactions older than it does (without the line the migration would seem to hang).
WAIT_NOTICE_AFTER: Final = 10.0


@dataclass(frozen=True, slots=True)
class Blocker:
    """A session that held a lock the migration waited for, as ``pg_stat_activity`` showed it."""

    pid: int
    application_name: str
    state: str
    transaction_seconds: float | None
    state_seconds: float | None

    def describe(self) -> str:
        name = self.application_name or "no application_name"
        parts = [f"pid {self.pid}", repr(name) if self.application_name else name]
        state = self.state or "state unknown"
        if self.state_seconds is not None:
            state += f" for {self.state_seconds:.0f} s"
        parts.append(state)
        if self.transaction_seconds is not None:
            parts.append(f"transaction open {self.transaction_seconds:.0f} s")
        return ", ".join(parts)


def described(blockers: list[Blocker]) -> str:
    """``blockers`` as one line, each as :meth:`Blocker.describe` gives it."""
    return "; ".join(blocker.describe() for blocker in blockers)


def session_pid(connection: Connection) -> int:
    """The server process id of ``connection``'s session."""
    return schema_data.backend_pid(ConnectionExecutor(connection))


class BlockerWatch:
    """While open, polls which sessions block session ``pid`` (on a connection of ``engine``)
    and keeps the latest ones seen in ``blockers``. ``on_long_wait``, if given, is called (from
    the watch's thread) once per uninterrupted wait, with the blockers and the seconds waited,
    when that wait reaches ``notice_after`` seconds (``WAIT_NOTICE_AFTER`` unless given)."""

    def __init__(
        self,
        engine: Engine,
        pid: int,
        interval: float = POLL_INTERVAL,
        *,
        on_long_wait: Callable[[list[Blocker], float], None] | None = None,
        notice_after: float | None = None,
    ) -> None:
        self.engine = engine
        self.pid = pid
        self.interval = interval
        self.blockers: list[Blocker] = []
        self.on_long_wait = on_long_wait
        self.notice_after = WAIT_NOTICE_AFTER if notice_after is None else notice_after
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pgqueue-migrate-locks")
        self._thread.daemon = True

    def __enter__(self) -> BlockerWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        waiting_since: float | None = None
        noticed = False
        try:
            with self.engine.connect() as connection:
                while not self._stop.wait(self.interval):
                    rows = schema_data.blocking_sessions(ConnectionExecutor(connection), self.pid)
                    connection.rollback()
                    if not rows:
                        waiting_since, noticed = None, False
                        continue
                    self.blockers = [_blocker(row) for row in rows]
                    now = time.monotonic()
                    if waiting_since is None:
                        waiting_since = now
                    waited = now - waiting_since
                    if self.on_long_wait and not noticed and waited >= self.notice_after:
                        noticed = True
                        self.on_long_wait(self.blockers, waited)
        except Exception:  # naming the blockers is a courtesy: it must never fail a migration
            return


def _blocker(row: Any) -> Blocker:
    pid, application_name, state, in_transaction, in_state, _query = row
    return Blocker(
        int(pid),
        application_name or "",
        state or "",
        None if in_transaction is None else float(in_transaction),
        None if in_state is None else float(in_state),
    )
