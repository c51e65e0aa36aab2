"""The service's database: its URL, its ``AsyncEngine`` and its session factory."""

from __future__ import annotations

import os

from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase

from pgqueue.database_urls import normalize_database_url


def database_url() -> str:
    """``$DATABASE_URL``, else database ``orders_api`` of pgqueue's embedded PostgreSQL (shared by
    the app and its worker; other apps on that server have databases of their own)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        from pgqueue.embedded import app_database, shared_server

        url = app_database(shared_server(), "orders_api")
    return normalize_database_url(url).render_as_string(hide_password=False)


class Base(DeclarativeBase):
    """The service's declarative base (pgqueue's tables live in pgqueue's own MetaData)."""


# ``postgresql+psycopg://`` under create_async_engine is psycopg's asyncio driver.
engine = create_async_engine(database_url())
Session = async_sessionmaker(engine, expire_on_commit=False)
