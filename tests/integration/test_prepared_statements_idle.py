"""Prepared statements through idle periods: the plan refresh never leaves psycopg with a name
the server dropped, and a connection whose statements vanished anyway is dropped, not reused.

pgqueue's connections drop the plans of their prepared statements every few seconds, so a plan
made for a tiny table does not outlive the table's growth. psycopg keeps its own list of the
statements it prepared; the two must agree through any number of refreshes, however long the
connection sat idle between them (an idle worker's claim connection sees one every poll, the
connection kept for single asyncio enqueues one after each quiet spell).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ProgrammingError

from pgqueue import Settings, connections
from pgqueue.aio import AsyncDatabase
from pgqueue.data import claim as claim_data
from pgqueue.db import Database
from pgqueue.jobs import ClaimRequest
from pgqueue.worker.store import WorkerStore

# One claim of one job by worker "w".
ONE_CLAIM: dict[str, Any] = {
    "worker_id": "w",
    "limit": 1,
    "queues": None,
    "lease_seconds": 30.0,
    "task_leases": {},
}
PLAN_AGE = 0.2
# Runs per round: past psycopg's threshold (5), so the claim is prepared in every round.
RUNS = 8
ROUNDS = 4
SERVER_NAMES = text("SELECT name FROM pg_prepared_statements")


def lean_claim(executor: Any) -> Any:
    """One claim of one job with no flow controls seen (the common claim)."""
    lean = claim_data.LimitsSeen()
    lean.record(False, until=float("inf"))
    return claim_data.claim(executor, limits=lean, **ONE_CLAIM)


def psycopg_names(connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> set[str]:
    """The statement names psycopg will send on ``connection``."""
    return {name.decode() for name in connection._prepared._names.values()}


def queue_engine(database_url: URL) -> Engine:
    return connections.create_queue_engine(database_url, Settings(), pool_size=1, max_overflow=0)


def test_claim_connection_keeps_its_statements_through_idle_plan_refreshes(
    database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    engine = queue_engine(database_url)
    store = WorkerStore(engine, stopping=threading.Event())
    held = store._claim_connection
    held._plan_max_age = PLAN_AGE
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(ROUNDS):
                for _ in range(RUNS):
                    store.claim(ClaimRequest(**ONE_CLAIM))
                time.sleep(PLAN_AGE * 1.5)  # idle past the plans' age: the next claim drops them
            store.claim(ClaimRequest(**ONE_CLAIM))
            server = {row[0] for row in held.rows(SERVER_NAMES)}
            known = psycopg_names(held._raw.driver_connection)
        assert caplog.records == []
        assert known, "nothing was prepared: the test would show nothing"
        assert known <= server
    finally:
        store.close()
        engine.dispose()


def test_pooled_connection_keeps_its_statements_through_idle_plan_refreshes(
    database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "PLAN_MAX_AGE", PLAN_AGE)
    engine = queue_engine(database_url)
    database = Database(engine)
    try:
        for _ in range(ROUNDS):
            for _ in range(RUNS):
                database.run(lean_claim, autocommit=True)
            time.sleep(PLAN_AGE * 1.5)  # the next checkout drops the plans
        database.run(lean_claim, autocommit=True)
        raw: Any = engine.raw_connection()
        try:
            known = psycopg_names(raw.driver_connection)
            server = {row[0] for row in raw.driver_connection.execute(SERVER_NAMES.text)}
        finally:
            raw.driver_connection.rollback()
            raw.close()
        assert known, "nothing was prepared: the test would show nothing"
        assert known <= server
    finally:
        engine.dispose()


def test_async_connection_keeps_its_statements_through_idle_plan_refreshes(
    database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connections, "PLAN_MAX_AGE", PLAN_AGE)

    async def main() -> tuple[set[str], set[str]]:
        engine = connections.create_async_queue_engine(
            database_url, Settings(), pool_size=1, max_overflow=0
        )
        database = AsyncDatabase(engine)
        try:
            for _ in range(ROUNDS):
                for _ in range(RUNS):
                    await database.run(lean_claim, autocommit=True)
                await asyncio.sleep(PLAN_AGE * 1.5)
            await database.run(lean_claim, autocommit=True)
            async with engine.connect() as connection:
                raw = await connection.get_raw_connection()
                driver: psycopg.AsyncConnection[Any] = raw.driver_connection  # type: ignore[assignment]
                known = psycopg_names(driver)
                rows = await (await driver.execute(SERVER_NAMES.text)).fetchall()
                await driver.rollback()
            return known, {row[0] for row in rows}
        finally:
            await engine.dispose()

    known, server = asyncio.run(main())
    assert known, "nothing was prepared: the test would show nothing"
    assert known <= server


def test_kept_async_connection_keeps_its_statements_through_idle_plan_refreshes(
    database_url: URL,
) -> None:
    async def main() -> tuple[set[str], set[str]]:
        engine = connections.create_async_queue_engine(
            database_url, Settings(), pool_size=1, max_overflow=0
        )
        database = AsyncDatabase(engine, keeps_a_connection=True)
        try:
            await database.run_single(lean_claim)
            kept = database._kept
            assert kept is not None and kept.connection is not None
            kept._plan_max_age = PLAN_AGE
            backend = kept.connection.info.backend_pid
            for _ in range(ROUNDS):
                for _ in range(RUNS):
                    await database.run_single(lean_claim)
                await asyncio.sleep(PLAN_AGE * 1.5)  # idle past the plans' age
            await database.run_single(lean_claim)
            assert kept.connection is not None
            known = psycopg_names(kept.connection)
            rows = await database.run_single(lambda executor: executor.rows(SERVER_NAMES))
            assert kept.connection.info.backend_pid == backend  # the one connection throughout
            return known, {row[0] for row in rows}
        finally:
            database.close()
            await engine.dispose()

    known, server = asyncio.run(main())
    assert known, "nothing was prepared: the test would show nothing"
    assert known <= server


def _drop_statements_behind_psycopgs_back(connection: psycopg.Connection[Any]) -> int:
    """Make the session forget its prepared statements without psycopg seeing it (as a
    statement psycopg does not inspect would); return the session's backend pid."""
    result = connection.pgconn.exec_(b"DEALLOCATE ALL")
    assert result.status == psycopg.pq.ExecStatus.COMMAND_OK
    return int(connection.info.backend_pid)


def test_claim_on_a_connection_whose_statements_vanished_is_retried_on_another(
    database_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    engine = queue_engine(database_url)
    store = WorkerStore(engine, stopping=threading.Event())
    try:
        for _ in range(RUNS):
            store.claim(ClaimRequest(**ONE_CLAIM))
        lost = _drop_statements_behind_psycopgs_back(store._claim_connection._raw.driver_connection)
        with caplog.at_level(logging.WARNING, logger="pgqueue"):
            assert store.claim(ClaimRequest(**ONE_CLAIM)) == []
        assert ["does not exist" in r.getMessage() for r in caplog.records] == [True]
        # The retry ran on a new connection; the broken one left the pool for good.
        for _ in range(RUNS):
            store.claim(ClaimRequest(**ONE_CLAIM))
        assert store._claim_connection._raw.driver_connection.info.backend_pid != lost
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("path", ["driver", "sqlalchemy"])
def test_pooled_connection_whose_statements_vanished_is_dropped(
    database_url: URL, path: str
) -> None:
    engine = queue_engine(database_url)
    if path == "sqlalchemy":
        # Something watching statements sends them through SQLAlchemy's execution layer.
        event.listen(engine, "before_cursor_execute", lambda *args: None)
    database = Database(engine)
    assert database.uses_driver == (path == "driver")
    try:
        for _ in range(RUNS):
            database.run(lean_claim, autocommit=True)
        raw: Any = engine.raw_connection()
        lost = _drop_statements_behind_psycopgs_back(raw.driver_connection)
        raw.close()
        with pytest.raises(ProgrammingError, match="does not exist"):
            database.run(lean_claim, autocommit=True)
        assert database.run(lean_claim, autocommit=True) == []
        raw = engine.raw_connection()
        assert raw.driver_connection.info.backend_pid != lost
        raw.close()
    finally:
        engine.dispose()
