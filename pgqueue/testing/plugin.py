"""The pytest plugin for applications that use pgqueue (registered as the ``pytest11`` entry
point ``pgqueue``, so it loads wherever pgqueue is installed).

Every fixture's name starts with ``pgqueue_``: loaded into any test suite, including pgqueue's
own, the plugin never shadows a fixture of the host (``app``, ``db``, ``pgq``, ``database_url``
...), and it starts no server and opens no connection until a test asks for one of its
fixtures.

- ``pgqueue_database_url``: a fresh database migrated to pgqueue's head, per test (a copy of a
  template made once per session, on the server ``PGQUEUE_TEST_DATABASE_URL`` names or an
  embedded one); also set as ``$PGQUEUE_DATABASE_URL`` for the test.
- ``pgqueue_prepare_database`` (session, override it): a function ``prepare(url)`` run once on
  the template, after pgqueue's migrations, to create the application's own tables.
- ``pgqueue_queue`` (override it): the application's ``PgQueue`` pointed at
  ``pgqueue_database_url``; by default a plain ``PgQueue(pgqueue_database_url)``.
- ``pgqueue_run_jobs``: ``pgqueue_run_jobs()`` runs a worker until nothing is ready and returns
  the ``JobRun`` of each attempt (``pgqueue.testing.run_jobs``).
- ``pgqueue_immediate``: the test runs in ``pgqueue.testing.immediate(pgqueue_queue)``; the
  value is the ``ImmediateMode`` (its ``runs``).
- ``pgqueue_session_database_url`` (session): one migrated database for the whole session.
  With the ini option ``pgqueue_database_env = NAME`` it is made before any ``conftest.py`` is
  imported and exported as ``$NAME``, for applications that read their database URL when
  their modules are imported.

The assertions (``assert_enqueued`` ...) are plain functions of ``pgqueue.testing``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgqueue.core import PgQueue
from pgqueue.testing.databases import TestDatabases
from pgqueue.testing.immediate_mode import ImmediateMode, immediate
from pgqueue.testing.records import JobRun
from pgqueue.testing.running import run_jobs

DATABASE_ENV_OPTION = "pgqueue_database_env"
# The session's TestDatabases and the database made for ``pgqueue_database_env``.
_early = pytest.StashKey[tuple[TestDatabases, str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        DATABASE_ENV_OPTION,
        "pgqueue: the environment variable to set, before conftest.py files are imported, to "
        "the URL of one migrated database for the session (pgqueue_session_database_url)",
        default="",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    name = early_config.getini(DATABASE_ENV_OPTION)
    if not name or early_config.known_args_namespace.help:
        return
    databases = TestDatabases()
    early_config.add_cleanup(databases.close)
    # Not from the template: ``pgqueue_prepare_database`` is a fixture, unknown until later.
    url = databases.create(from_template=False)
    previous = os.environ.get(name)
    os.environ[name] = url
    early_config.add_cleanup(lambda: _restore_env(name, previous))
    early_config.stash[_early] = (databases, url)


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@pytest.fixture(scope="session")
def pgqueue_prepare_database() -> Callable[[str], None] | None:
    """Override to create the application's tables in the template database: return a function
    of the database URL (``metadata.create_all`` on an engine of it, or an Alembic upgrade)."""
    return None


@pytest.fixture(scope="session")
def pgqueue_test_databases(
    request: pytest.FixtureRequest, pgqueue_prepare_database: Callable[[str], None] | None
) -> Iterator[TestDatabases]:
    """The session's server and template (``pgqueue.testing.TestDatabases``)."""
    early = request.config.stash.get(_early, None)
    if early is not None:
        databases = early[0]  # closed by the config's cleanup
        databases.prepare = pgqueue_prepare_database
        yield databases
        return
    databases = TestDatabases(prepare=pgqueue_prepare_database)
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture(scope="session")
def pgqueue_session_database_url(
    request: pytest.FixtureRequest, pgqueue_test_databases: TestDatabases
) -> str:
    """One database with pgqueue's tables for the whole session (the one exported by the
    ``pgqueue_database_env`` ini option, if set), for apps bound to a database at import."""
    early = request.config.stash.get(_early, None)
    if early is not None:
        return early[1]
    return pgqueue_test_databases.create()


@pytest.fixture
def pgqueue_database_url(
    pgqueue_test_databases: TestDatabases, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh database with pgqueue's tables (and the ones ``pgqueue_prepare_database``
    creates), dropped after the test; also ``$PGQUEUE_DATABASE_URL`` during the test."""
    url = pgqueue_test_databases.create()
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", url)
    try:
        yield url
    finally:
        pgqueue_test_databases.drop(url)


@pytest.fixture
def pgqueue_queue(pgqueue_database_url: str) -> Iterator[PgQueue]:
    """Override to return the application's own ``PgQueue`` (with its tasks) pointed at
    ``pgqueue_database_url``. This default is an empty queue on that database."""
    queue = PgQueue(pgqueue_database_url)
    try:
        yield queue
    finally:
        queue.dispose()


@pytest.fixture
def pgqueue_run_jobs(pgqueue_queue: Any) -> Callable[..., list[JobRun]]:
    """``pgqueue_run_jobs(queues=None, concurrency=1)``: run ``pgqueue_queue``'s ready jobs
    with a real worker until none is left; returns each attempt that ran, with its outcome."""

    def run(**options: Any) -> list[JobRun]:
        return run_jobs(pgqueue_queue, **options)

    return run


@pytest.fixture
def pgqueue_immediate(pgqueue_queue: Any) -> Iterator[ImmediateMode]:
    """The whole test in immediate mode: each job runs as soon as its enqueue commits."""
    with immediate(pgqueue_queue) as mode:
        yield mode
