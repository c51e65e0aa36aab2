"""Fixtures of the orders service's tests, on pgqueue's pytest plugin.

The service binds its database when its modules are imported, so the plugin's ini option
``pgqueue_database_env = DATABASE_URL`` (pytest.ini) makes one migrated database before this
file is imported; the tests share it (``pgqueue_session_database_url``) and each looks only at
its own orders. ``pgqueue_queue`` tells the plugin which queue is the app's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from orders_api.app import create_app
from orders_api.database import Base, engine
from orders_api.tasks import pgq
from sqlalchemy import create_engine

from pgqueue import PgQueue


@pytest.fixture(scope="session", autouse=True)
def tables(pgqueue_session_database_url: str) -> Iterator[None]:
    """The service's tables, beside pgqueue's, in the session's database."""
    sync_engine = create_engine(pgqueue_session_database_url)
    Base.metadata.create_all(sync_engine)
    sync_engine.dispose()
    yield
    pgq.dispose()


@pytest.fixture
def pgqueue_queue() -> PgQueue:
    """The app's queue: the plugin's fixtures run jobs and read them through it."""
    return pgq


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The app called in-process on the test's event loop; the pooled connections made on that
    loop are closed before it ends."""
    transport = httpx.ASGITransport(app=create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://orders.test") as client:
        yield client
    await pgq.adispose()
    await engine.dispose()
