"""The one way into a unit of work of pgqueue's own, and the one retry policy for transient
conflicts, for the synchronous and the asyncio paths alike.

``run`` gives work an executor of a ``db.Database`` in one transaction, or in autocommit mode
(each statement its own transaction: no ``BEGIN``/``COMMIT`` round trip). ``run_in_transaction``
does the same with a ``Session`` of a session factory, for work that wants the ORM, and
``read`` without a commit. ``apart_from`` runs work in a transaction beside a caller's session,
on the same bind.
``pgqueue.aio`` runs its units of work through ``aretrying``, the same policy awaited.

The retry decision is ``RetryPolicy.pause_after``, and nothing else decides: after a deadlock
(40P01) or serialization failure (40001) the whole work runs again in a fresh transaction, a
few times at most, after a short jittered pause; after the server ended the session before the
work committed, once more at once. Work done in a caller's own session is never retried or
committed here (``in_caller_or_own_transaction`` just runs it in the caller's transaction),
because only the caller knows whether its other work may be repeated. The worker wraps these
units in its own "keep trying through an outage" loop (``worker.store``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from pgqueue.db import ConnectionExecutor, Database, Executor, executor_for
from pgqueue.errors import pgqueue_logger
from pgqueue.sqlstates import ended_before_commit, is_transient_conflict

T = TypeVar("T")

log = pgqueue_logger("pgqueue.uow")

DEFAULT_ATTEMPTS = 5


class RetryPolicy:
    """The retry decision of one unit of work: which errors are worth another try, how long to
    wait before it, and how many tries in all (``attempts``)."""

    __slots__ = ("attempt", "attempts", "reconnected")

    def __init__(self, attempts: int = DEFAULT_ATTEMPTS) -> None:
        self.attempts = attempts
        self.attempt = 1
        self.reconnected = False

    def pause_after(self, exc: DBAPIError) -> float | None:
        """Seconds to wait before running the work again after ``exc``, or None to give up.

        A session the server ended before the work committed (``sqlstates.ended_before_commit``:
        a connection killed while it sat in the pool, a restart, a failover) is tried once more
        at once, so it is not the caller's problem; that try is not counted in ``attempts``."""
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


def retrying(once: Callable[[], T], attempts: int = DEFAULT_ATTEMPTS) -> T:
    """``once()``, run again as ``RetryPolicy`` decides, sleeping its pauses."""
    policy = RetryPolicy(attempts)
    while True:
        try:
            return once()
        except DBAPIError as exc:
            pause = policy.pause_after(exc)
            if pause is None:
                raise
            time.sleep(pause)


async def aretrying(once: Callable[[], Awaitable[T]], attempts: int = DEFAULT_ATTEMPTS) -> T:
    """``await once()``, run again as ``RetryPolicy`` decides, awaiting its pauses."""
    policy = RetryPolicy(attempts)
    while True:
        try:
            return await once()
        except DBAPIError as exc:
            pause = policy.pause_after(exc)
            if pause is None:
                raise
            await asyncio.sleep(pause)


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


def run_single(database: Database, work: Callable[[Executor], T]) -> T:
    """``work(executor)`` in autocommit mode on ``database``'s connection kept for single
    statements (``Database.run_single``), retrying transient conflicts."""
    return retrying(lambda: database.run_single(work))


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


def read(sessions: sessionmaker[Session], work: Callable[[Executor], T]) -> T:
    """``work(executor)`` in a session of its own, ended without a commit (reads)."""
    with sessions() as session:
        return work(executor_for(session))


def apart_from(session: Session, work: Callable[[Executor], T]) -> T:
    """``work(executor)`` in a transaction apart from ``session``'s, on its bind: on an engine,
    a transaction of its own, committed when ``work`` returns (retrying transient conflicts);
    on the connection a session is bound to (a test's), a savepoint of that connection's
    transaction, or a transaction of it when it has none, never retried."""
    bind = session.get_bind()
    if isinstance(bind, Engine):
        engine = bind

        def once() -> T:
            with engine.begin() as connection:
                return work(ConnectionExecutor(connection))

        return retrying(once)
    if bind.in_transaction():
        with bind.begin_nested():
            return work(ConnectionExecutor(bind))
    with bind.begin():
        return work(ConnectionExecutor(bind))
