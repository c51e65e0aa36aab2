"""Sessions waiting for a lock, as ``pg_stat_activity`` shows them: for the tests that hold a
row, a key or a table in one session and must see another session blocked on it before they go
on (rather than sleeping a while and hoping it got there)."""

from __future__ import annotations

from sqlalchemy import Engine, text

from support.polling import wait_until

_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
    " AND ltrim(query) LIKE :statement"
)


def lock_waiters(engine: Engine, statement: str = "") -> int:
    """How many other sessions of ``engine``'s database wait for a lock, in a statement that
    starts with ``statement``."""
    with engine.connect() as connection:
        return int(connection.execute(_WAITERS, {"statement": f"{statement}%"}).scalar_one())


def wait_for_lock_waiters(
    engine: Engine, count: int = 1, statement: str = "", timeout: float = 10.0
) -> None:
    """Wait until ``count`` other sessions of ``engine``'s database wait for a lock, in a
    statement that starts with ``statement``."""
    what = f"{count} session(s) waiting for a lock" + (f" in {statement}..." if statement else "")
    wait_until(lambda: lock_waiters(engine, statement) >= count, timeout, what, interval=0.02)
