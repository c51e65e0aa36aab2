"""Names the sessions that hold up a migration, for the one line ``pgqueue migrate`` prints
when its ``lock_timeout`` fires.

Once the lock wait is cancelled the migration no longer waits, so nothing blocks it any more and
``pg_blocking_pids`` has nothing to say: the sessions are looked up while it waits. A watch
polls ``pg_blocking_pids`` of the migration's session from a connection of its own and keeps
the latest non-empty answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from sqlalchemy import Connection, Engine

from pgqueue.data import schema as schema_data
from pgqueue.db import ConnectionExecutor

# How often a watch asks who blocks the migration: a lock wait of at least this long is named.
POLL_INTERVAL: Final = 0.1


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


def session_pid(connection: Connection) -> int:
    """The server process id of ``connection``'s session."""
    return schema_data.backend_pid(ConnectionExecutor(connection))


class BlockerWatch:
    """While open, polls which sessions block session ``pid`` (on a connection of ``engine``)
    and keeps the latest ones seen in ``blockers``."""

    def __init__(self, engine: Engine, pid: int, interval: float = POLL_INTERVAL) -> None:
        self.engine = engine
        self.pid = pid
        self.interval = interval
        self.blockers: list[Blocker] = []
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
        try:
            with self.engine.connect() as connection:
                while not self._stop.wait(self.interval):
                    rows = schema_data.blocking_sessions(ConnectionExecutor(connection), self.pid)
                    connection.rollback()
                    if rows:
                        self.blockers = [_blocker(row) for row in rows]
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
