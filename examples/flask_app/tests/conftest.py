"""Fixtures of the orders service's tests, on pgqueue's pytest plugin.

The plugin gives each test a fresh database with pgqueue's tables (``pgqueue_database_url``);
``pgqueue_prepare_database`` adds the service's own tables to the template it is copied from,
and ``pgqueue_queue`` tells the plugin which queue is the app's, for ``pgqueue_run_jobs`` and
``pgqueue_immediate``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from orders import create_app
from orders.extensions import Base, db, pgq
from sqlalchemy import create_engine

from pgqueue import PgQueue


@pytest.fixture(scope="session")
def pgqueue_prepare_database() -> Callable[[str], None]:
    """Create the service's tables once, in the template every test's database copies."""

    def create_tables(url: str) -> None:
        import orders.models  # noqa: F401 - registers the tables on Base.metadata

        engine = create_engine(url)
        Base.metadata.create_all(engine)
        engine.dispose()

    return create_tables


@pytest.fixture
def app(pgqueue_database_url: str) -> Iterator[Flask]:
    app = create_app(
        {
            "SQLALCHEMY_DATABASE_URI": pgqueue_database_url,
            "SECRET_KEY": "test",
            "DASHBOARD_PASSWORD": "test",
        }
    )
    yield app
    with app.app_context():
        db.engine.dispose()


@pytest.fixture
def pgqueue_queue(app: Flask) -> PgQueue:
    """The app's queue: the plugin's fixtures run jobs and read them through it."""
    return pgq.state(app).queue


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
