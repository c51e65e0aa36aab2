"""Transaction scope for pgqueue's own writes, with a bounded retry on transient conflicts.

``run_in_transaction`` opens a session, runs the function in one transaction and commits it. If
PostgreSQL reports a deadlock (40P01) or serialization failure (40001) the whole function runs
again in a fresh transaction, a few times at most. Work done in a caller's own session is never
retried or committed here: ``in_caller_or_own_transaction`` just runs it in the caller's
transaction, because only the caller knows whether its other work may be repeated.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from pgqueue.errors import is_transient_conflict

T = TypeVar("T")

log = logging.getLogger("pgqueue.uow")

DEFAULT_ATTEMPTS = 5


def run_in_transaction(
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
) -> T:
    """Run ``work(session)`` in its own committed transaction, retrying transient conflicts."""
    for attempt in range(1, attempts + 1):
        try:
            with sessions() as session, session.begin():
                return work(session)
        except DBAPIError as exc:
            if attempt >= attempts or not is_transient_conflict(exc):
                raise
            pause = min(0.5, 0.01 * 2**attempt) * random.uniform(0.5, 1.5)
            log.info("transient conflict (%s), retrying in %.3fs", exc.orig, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def in_caller_or_own_transaction(
    session: Session | None,
    sessions: sessionmaker[Session],
    work: Callable[[Session], T],
) -> T:
    """Run in the caller's session (no commit, no retry) or in an own transaction."""
    if session is not None:
        return work(session)
    return run_in_transaction(sessions, work)
