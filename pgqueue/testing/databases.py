"""Fresh migrated databases for a test suite: one server per test session, one template database
migrated once, and a copy of it per test (``CREATE DATABASE ... TEMPLATE``: tens of
milliseconds, where migrating each test's database would take a second).

The server is the one ``PGQUEUE_TEST_DATABASE_URL`` names (its database is used only to create
and drop the others), else an embedded PostgreSQL started for the session, with durability off
for speed. No pytest here: ``pgqueue.testing.plugin`` wraps it in fixtures, and any other test
runner can use it as it is.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL

from pgqueue import migrations
from pgqueue.config import test_database_url
from pgqueue.database_urls import normalize_database_url
from pgqueue.sql.server import create_database, drop_database

if TYPE_CHECKING:
    from pgqueue.embedded import EmbeddedPostgres


class TestDatabases:
    """A server and the databases a test session makes on it.

    ``server_url`` is the server to use (default: ``PGQUEUE_TEST_DATABASE_URL``, else an
    embedded server started on first use). ``prepare(url)``, when given (or set as ``prepare``
    before the first copy is made), runs once on the template after pgqueue's migrations: the
    host application creates its own tables there (``metadata.create_all`` or its Alembic
    upgrade), so every test's copy has them too.
    """

    __test__ = False  # not a test class, whatever its name says to pytest

    def __init__(
        self,
        server_url: str | URL | None = None,
        *,
        prepare: Callable[[str], None] | None = None,
    ) -> None:
        given = server_url if server_url is not None else test_database_url()
        self._server_url = None if given is None else normalize_database_url(given)
        self.prepare = prepare
        self._embedded: EmbeddedPostgres | None = None
        self._embedded_root: Path | None = None
        self._admin: Engine | None = None
        self._template: str | None = None
        self._prefix = f"pgqueue_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._counter = itertools.count()
        self._made: set[str] = set()

    @property
    def server_url(self) -> URL:
        """The URL of the server's maintenance database (starts the embedded server)."""
        if self._server_url is None:
            self._server_url = normalize_database_url(self._start_embedded())
        return self._server_url

    def _start_embedded(self) -> str:
        from pgqueue.embedded import EmbeddedPostgres

        # World-readable parent: as root the server runs as another user, who must reach the
        # data dir.
        root = Path(tempfile.mkdtemp(prefix="pgqueue-test-"))
        root.chmod(0o755)
        server = EmbeddedPostgres(root / "data", durable=False)
        server.start()
        self._embedded, self._embedded_root = server, root
        return server.url()

    def _admin_engine(self) -> Engine:
        if self._admin is None:
            self._admin = create_engine(self.server_url, isolation_level="AUTOCOMMIT")
        return self._admin

    def _url_of(self, name: str) -> str:
        return self.server_url.set(database=name).render_as_string(hide_password=False)

    def template(self) -> str:
        """The name of the template database: migrated to pgqueue's head, then ``prepare``d
        (made on first use)."""
        if self._template is None:
            name = f"{self._prefix}_template"
            self._migrated(name)
            if self.prepare is not None:
                self.prepare(self._url_of(name))
            self._template = name
        return self._template

    def create(self, *, from_template: bool = True) -> str:
        """A new database, a copy of the template; returns its URL (password included).

        ``from_template=False`` migrates a new empty database instead, without ``prepare``
        and without making the template (for a database needed before ``prepare`` is known).
        """
        name = f"{self._prefix}_{next(self._counter)}"
        if not from_template:
            self._migrated(name)
            return self._url_of(name)
        template = self.template()
        with self._admin_engine().connect() as connection:
            connection.execute(create_database(name, template))
        self._made.add(name)
        return self._url_of(name)

    def _migrated(self, name: str) -> None:
        """Create database ``name`` afresh and migrate it to pgqueue's head."""
        with self._admin_engine().connect() as connection:
            connection.execute(drop_database(name))
            connection.execute(create_database(name))
        self._made.add(name)
        engine = create_engine(self._url_of(name))
        try:
            with engine.begin() as connection:
                migrations.upgrade(connection)
        finally:
            engine.dispose()

    def drop(self, url: str | URL) -> None:
        """Drop a database made by ``create`` (ending the sessions still connected to it)."""
        name = normalize_database_url(url).database
        if name is None or not name.startswith(self._prefix):
            raise ValueError(f"{name!r} is not a database these test databases made")
        with self._admin_engine().connect() as connection:
            connection.execute(drop_database(name))
        self._made.discard(name)

    def close(self) -> None:
        """Drop the databases still there (the template too) and stop the embedded server, if
        this object started one."""
        if self._made:
            with self._admin_engine().connect() as connection:
                for name in sorted(self._made):
                    connection.execute(drop_database(name))
            self._made.clear()
        self._template = None
        if self._admin is not None:
            self._admin.dispose()
            self._admin = None
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None
            self._server_url = None
        if self._embedded_root is not None:
            shutil.rmtree(self._embedded_root, ignore_errors=True)
            self._embedded_root = None
