"""An enqueue on a database whose pgqueue tables were never made: the server's error, as an
SQLAlchemy error the caller's transaction handling knows, ends with a line saying to migrate."""

from __future__ import annotations

import asyncio
import traceback

import pytest
from sqlalchemy.engine import URL
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from pgqueue import PgQueue, chain

MIGRATE = (
    "pgqueue's tables are missing from this database: migrate it first "
    "(`pgqueue migrate`, `flask pgqueue migrate` or `pgq.migrate()`)"
)


def test_every_enqueue_on_an_unmigrated_database_ends_saying_to_migrate(
    empty_database_url: URL,
) -> None:
    pgq = PgQueue(empty_database_url)

    @pgq.task(name="send")
    def send(n: int) -> int:
        return n

    async def in_an_async_session() -> None:
        engine = create_async_engine(empty_database_url)
        try:
            async with AsyncSession(engine) as session:
                await send.configure(session=session).aenqueue(1)
        finally:
            await engine.dispose()

    def in_a_session() -> None:
        with Session(pgq.engine) as session:
            send.configure(session=session).enqueue(1)

    attempts = {
        "enqueue": lambda: send.enqueue(1),
        "enqueue_many": lambda: send.enqueue_many([[n] for n in range(3)]),
        "in a session": in_a_session,
        "workflow": lambda: chain(send.s(1), send.s()).enqueue(),
        "aenqueue": lambda: asyncio.run(in_an_async_session()),
    }
    try:
        for what, attempt in attempts.items():
            with pytest.raises(ProgrammingError) as raised:
                attempt()
            assert getattr(raised.value, "__notes__", None) == [MIGRATE], what
            shown = "".join(traceback.format_exception(raised.value)).rstrip()
            assert shown.endswith(MIGRATE), what
    finally:
        pgq.dispose()
