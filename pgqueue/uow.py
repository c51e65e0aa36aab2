"""Units of work for pgqueue's own writes, with a bounded retry on transient conflicts.

``run`` gives work an executor of a ``db.Database`` in one transaction, or in autocommit mode
(each statement its own transaction: no ``BEGIN``/``COMMIT`` round trip). ``run_in_transaction``
does the same with a ``Session`` of a session factory, for work that wants the ORM.

If PostgreSQL reports a deadlock (40P01) or serialization failure (40001) the whole work runs
again in a fresh transaction, a few times at most. Work done in a caller's own session is never
retried or committed here: ``in_caller_or_own_transaction`` just runs it in the caller's
transaction, because only the caller knows whether its other work may be repeated.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from pgqueue.db import Database, Executor
from pgqueue.errors import ended_before_commit, is_transient_conflict, pgqueue_logger

T = TypeVar("T")

log = pgqueue_logger("pgqueue.uow")

DEFAULT_ATTEMPTS = 5


def run(
    database: Database,
    work: Callable[[Executor], T],
    *,
    autocommit: bool = False,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """``work(executor)`` in one committed transaction of ``database`` (or in autocommit
    mode), retrying transient conflicts."""
    return retrying(lambda: database.run(work, autocommit=autocommit), attempts)


def run_in_transaction(
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """Run ``work(session)`` in its own committed transaction, retrying transient conflicts."""

    def once() -> T:
        with sessions() as session, session.begin():
            return work(session)

    return retrying(once, attempts)


def in_caller_or_own_transaction(
    session: Session | None,
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
) -> T:
    """Run in the caller's session (no commit, no retry) or in an own transaction."""
    if session is not None:
        return work(session)
    return run_in_transaction(sessions, work)


def retrying(once: Callable[[], T], attempts: int) -> T:
    """``once()``, run again (with jittered backoff) on a deadlock or serialization failure, up
    to ``attempts`` times in all; and once more, at once, when the server ended the session
    before the work committed (``errors.ended_before_commit``), so a connection killed while it
    sat in the pool (restart, failover, ``pg_terminate_backend``) is not the caller's problem."""
    retries = Retries(attempts)
    while True:
        try:
            return once()
        except DBAPIError as exc:
            pause = retries.pause_after(exc)
            if pause is None:
                raise
            time.sleep(pause)


class Retries:
    """The retry decision of one unit of work (``retrying``; ``pgqueue.aio`` awaits its
    pauses instead of sleeping)."""

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts
        self.attempt = 1
        self.reconnected = False

    def pause_after(self, exc: DBAPIError) -> float | None:
        """Seconds to wait before running the work again after ``exc``, or None to give up."""
        if not self.reconnected and ended_before_commit(exc):
            self.reconnected = True
            log.info("connection ended by the server (%s); retrying once", exc.orig)
            return 0.0
        if self.attempt >= self.attempts or not is_transient_conflict(exc):
            return None
        pause: float = min(0.5, 0.01 * 2**self.attempt) * random.uniform(0.5, 1.5)
        log.info("transient conflict (%s), retrying in %.3fs", exc.orig, pause)
        self.attempt += 1
        return pause
