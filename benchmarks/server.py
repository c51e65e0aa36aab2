"""Where the benchmarks run: a durable embedded PostgreSQL, or ``$PGQUEUE_DATABASE_URL``.

Every workload gets a fresh database (``CREATE DATABASE`` + pgqueue's migrations, or a copy of a
database already migrated to pgqueue's head) so no run sees another's dead tuples, sequences or
cached plans; it is dropped afterwards to keep the disk small.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, make_url

from pgqueue import PgQueue, migrations
from pgqueue.embedded import EmbeddedPostgres

_counter = itertools.count(1)


def libpq(url: URL) -> str:
    """A libpq URI for a SQLAlchemy URL (psycopg does not understand ``+psycopg``)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def sqlalchemy_url(url: URL) -> str:
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


@dataclass
class Server:
    """An admin URL plus what the run needs to describe the server in its report."""

    admin_url: URL
    embedded: bool
    # A database migrated to pgqueue's head (and otherwise unused while a workload runs): each
    # fresh migrated database is created as a copy of it, the same schema without running
    # every migration again.
    template: str | None = None

    def settings(self) -> dict[str, str]:
        """The server settings that decide durability and memory, as the report shows them."""
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_sync_method",
            "shared_buffers",
            "max_connections",
            "jit",
        )
        with psycopg.connect(libpq(self.admin_url), autocommit=True) as conn:
            # current_setting() renders memory in its own units (128MB); pg_settings' setting is
            # a count of the unit, which is 8kB for shared_buffers.
            rows = conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                [list(names)],
            ).fetchall()
            jit_available = conn.execute("SELECT pg_jit_available()").fetchone()
        settings = {name: value for name, value in rows}
        settings["jit_available"] = "on" if jit_available and jit_available[0] else "off"
        return settings

    @contextmanager
    def fresh_database(self, label: str, *, migrate: bool = True) -> Iterator[URL]:
        """A new database migrated to pgqueue's head (a copy of ``template`` when given), or
        an empty one (``migrate=False``); dropped (with force) on exit."""
        name = f"bench_{label}_{os.getpid()}_{next(_counter)}"
        copy = migrate and self.template is not None
        with psycopg.connect(libpq(self.admin_url), autocommit=True) as conn:
            # Names built from a fixed pattern, or given by the caller.
            clause = f' TEMPLATE "{self.template}"' if copy else ""
            conn.execute(f'CREATE DATABASE "{name}"{clause}')
        url = self.admin_url.set(database=name)
        try:
            if migrate and not copy:
                engine = create_engine(sqlalchemy_url(url))
                try:
                    with engine.begin() as connection:
                        migrations.upgrade(connection)
                finally:
                    engine.dispose()
            yield url
        finally:
            with psycopg.connect(libpq(self.admin_url), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextmanager
    def app_beside_baseline(
        self, label: str, shape: Callable[[URL], None] | None = None
    ) -> Iterator[tuple[PgQueue, str]]:
        """The benchmark app on a fresh pgqueue database, and the libpq URI of a fresh database
        beside it holding the raw-SQL baseline's schema: the pair a paired workload compares.
        ``shape`` changes pgqueue's freshly migrated database first (``benchmarks.schema_bounds``).
        The app's connections are closed and both databases dropped on exit."""
        from benchmarks import app, baseline

        with (
            self.fresh_database(label) as url,
            self.fresh_database(f"{label}_raw", migrate=False) as raw_url,
        ):
            if shape is not None:
                shape(url)
            raw = libpq(raw_url)
            baseline.create_schema(raw)
            pgq = app.build(sqlalchemy_url(url))
            try:
                yield pgq, raw
            finally:
                pgq.dispose()


@contextmanager
def start(database_url: str | None) -> Iterator[Server]:
    """Use ``database_url`` when given, else a durable embedded server in a temp directory."""
    if database_url:
        yield Server(make_url(database_url).set(drivername="postgresql+psycopg"), embedded=False)
        return
    base = Path(tempfile.mkdtemp(prefix="pgqueue-bench-"))
    # When root, the server runs as `nobody`, which must traverse this directory.
    base.chmod(0o755)
    # fsync and synchronous_commit stay on (durable=True): the numbers are for a real deployment.
    server = EmbeddedPostgres(base / "data", durable=True)
    try:
        server.start()
        yield Server(make_url(server.url()), embedded=True)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
