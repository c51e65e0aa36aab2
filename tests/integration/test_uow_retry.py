"""``uow.run_in_transaction`` retries deadlocks and serialization failures, nothing else.

The failures are raised by PostgreSQL itself (``RAISE ... USING ERRCODE``), inside the
transaction, so the retry sees exactly what a real conflict gives it.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from pgqueue import PgQueue, uow


def _raise(session: Session, errcode: str) -> None:
    session.execute(
        text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{errcode}'; END $$")
    )


@pytest.mark.parametrize("errcode", ["40001", "40P01"])
def test_transient_conflicts_are_retried_in_a_fresh_transaction(pgq: PgQueue, errcode: str) -> None:
    calls = []

    def work(session: Session) -> int:
        calls.append(session.execute(text("SELECT txid_current()")).scalar_one())
        if len(calls) < 3:
            _raise(session, errcode)
        return len(calls)

    assert uow.run_in_transaction(pgq.sessions, work) == 3
    assert len(set(calls)) == 3  # each attempt in its own transaction


def test_other_errors_are_not_retried(pgq: PgQueue) -> None:
    calls = []

    def work(session: Session) -> None:
        calls.append(1)
        _raise(session, "22012")  # division_by_zero

    with pytest.raises(DBAPIError, match="injected"):
        uow.run_in_transaction(pgq.sessions, work)
    assert len(calls) == 1


def test_retries_are_bounded(pgq: PgQueue) -> None:
    calls = []

    def work(session: Session) -> None:
        calls.append(1)
        _raise(session, "40001")

    with pytest.raises(DBAPIError, match="injected"):
        uow.run_in_transaction(pgq.sessions, work, attempts=4)
    assert len(calls) == 4
