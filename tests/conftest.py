"""Test fixtures: one real PostgreSQL per test session, a fresh migrated database per test.

The server is the embedded one (``pgqueue.embedded``) with durability off for speed, unless
``PGQUEUE_TEST_DATABASE_URL`` points at an existing server. A template database is migrated
once; each test gets ``CREATE DATABASE ... TEMPLATE`` of it (tens of milliseconds).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from server_databases import admin_engine, create_database, drop_database
from server_matrix import in_matrix
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL

from pgqueue import PgQueue, Settings, migrations
from pgqueue.config import test_database_url
from pgqueue.database_urls import normalize_database_url

if TYPE_CHECKING:
    from pgqueue.embedded import EmbeddedPostgres


TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker starts with ``COLUMNS=80`` and ``LINES=24`` in its environment,
    which a plain run does not have: the commands the tests run in-process would print tables
    cut to 80 columns. Each worker's environment is made the plain run's again."""
    if hasattr(config, "workerinput"):
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of ``server_matrix.SERVER_MATRIX``'s files ``server_matrix``, but for
    those of ``server_matrix.ONE_SERVER``."""
    for item in items:
        relative = item.path.resolve().relative_to(TESTS).as_posix()
        name = getattr(item, "originalname", None) or item.name
        if in_matrix(relative, name):
            item.add_marker(pytest.mark.server_matrix)


@pytest.fixture(scope="session")
def _embedded_server() -> Iterator[EmbeddedPostgres | None]:
    """The session's embedded server (None when ``PGQUEUE_TEST_DATABASE_URL`` names one)."""
    if test_database_url():
        yield None
        return
    from pgqueue.embedded import EmbeddedPostgres

    # Not tmp_path_factory: its directories are 0700, and as root the server runs as another
    # user.
    root = Path(tempfile.mkdtemp(prefix="pgqueue-test-"))
    root.chmod(0o755)
    # TCP (with its password) for clients that cannot use the socket, such as PgBouncer
    # running as another user.
    server = EmbeddedPostgres(root / "data", durable=False, tcp=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def server_url(_embedded_server: EmbeddedPostgres | None) -> URL:
    """URL of the maintenance database of the test server (the embedded one: its socket)."""
    if _embedded_server is None:
        return normalize_database_url(test_database_url() or "")
    return normalize_database_url(_embedded_server.url())


@pytest.fixture(scope="session")
def server_tcp_url(_embedded_server: EmbeddedPostgres | None, server_url: URL) -> URL:
    """The same server over TCP with a password (what another OS user can connect with)."""
    if _embedded_server is None:
        return server_url
    return normalize_database_url(_embedded_server.tcp_url())


@pytest.fixture(scope="session")
def template_name(server_url: URL) -> Iterator[str]:
    """A database migrated to pgqueue's head, cloned by each test."""
    name = f"pgqueue_template_{os.getpid()}"
    admin = admin_engine(server_url)
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(server_url.set(database=name))
    with engine.begin() as connection:
        migrations.upgrade(connection)
    engine.dispose()
    try:
        yield name
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def database_url(server_url: URL, template_name: str) -> Iterator[URL]:
    """A fresh database with pgqueue's schema at head."""
    url = create_database(server_url, template_name)
    yield url
    drop_database(server_url, url)


@pytest.fixture
def empty_database_url(server_url: URL) -> Iterator[URL]:
    """A fresh database with no tables at all."""
    url = create_database(server_url, None)
    yield url
    drop_database(server_url, url)


@pytest.fixture
def engine(database_url: URL) -> Iterator[Engine]:
    eng = create_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def settings() -> Settings:
    """Settings for fast tests: short polls and leases, nothing from the environment."""
    return Settings(poll_interval=0.2, rescue_interval=0.5, lease_seconds=10.0)


@pytest.fixture
def pgq(database_url: URL, settings: Settings) -> Iterator[PgQueue]:
    queue = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    yield queue
    queue.dispose()
