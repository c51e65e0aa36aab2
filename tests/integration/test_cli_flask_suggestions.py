"""``flask pgqueue ...`` names its own commands in what it prints: each message that tells the
user to run a command, or names the command that failed, says ``flask pgqueue ...`` there (the
same messages of ``pgqueue ...`` say ``pgqueue ...``). Real server, the Flask CLI in-process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from click.testing import Result
from flask import Flask
from sqlalchemy import create_engine
from sqlalchemy.engine import URL
from support.roles import app_role, as_role
from test_migration_safety import BEFORE_INDEXES, lock_held

from pgqueue import migrations
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.contrib.flask.cli import pgqueue_group

__all__ = ["app_role"]  # the fixture, used by name


@contextmanager
def _flask_cli(url: URL, **config: object) -> Iterator[Flask]:
    app = Flask("suggestions")
    app.config["PGQUEUE_DATABASE_URL"] = url.render_as_string(hide_password=False)
    app.config.update(config)
    flask_pgq = FlaskPgQueue(app)
    try:
        yield app
    finally:
        with app.app_context():
            flask_pgq.state(app).queue.dispose()


def _run(url: URL, *args: str, exit_code: int = 2) -> str:
    with _flask_cli(url) as app:
        result: Result = app.test_cli_runner().invoke(pgqueue_group, list(args))
    assert result.exit_code == exit_code, (args, result.output, result.exception)
    [line] = result.output.strip().splitlines()
    assert " `pgqueue " not in line and not line.split(": ", 1)[1].startswith("pgqueue "), line
    return line


def test_tables_missing(empty_database_url: URL) -> None:
    line = _run(empty_database_url, "stats")
    name = empty_database_url.database
    assert line.endswith(f"tables are missing in database {name}: run `flask pgqueue migrate`")


def test_schema_older_than_the_worker(empty_database_url: URL) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, BEFORE_INDEXES)
    engine.dispose()
    line = _run(empty_database_url, "worker", "--drain")
    assert f"is at {BEFORE_INDEXES}" in line and line.endswith("run `flask pgqueue migrate`"), line


def test_downgrade_that_loses_data(database_url: URL) -> None:
    from pgqueue import PgQueue

    pgq = PgQueue(database_url)
    pgq.task(name="suggestions.noop")(lambda: None).enqueue()
    pgq.dispose()
    line = _run(database_url, "migrate", "downgrade", "base")
    assert line.startswith("error: flask pgqueue migrate: downgrade to base would delete"), line


def test_migrate_waits_for_a_lock(empty_database_url: URL, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = create_engine(empty_database_url)
    with engine.begin() as connection:
        migrations.upgrade(connection, BEFORE_INDEXES)
    engine.dispose()
    monkeypatch.setenv("PGQUEUE_MIGRATION_LOCK_TIMEOUT", "1")
    with lock_held(empty_database_url, "LOCK TABLE pgqueue_jobs IN ROW EXCLUSIVE MODE", 20):
        line = _run(empty_database_url, "migrate")
    assert line.startswith("error: flask pgqueue migrate: waited 1 s"), line


def test_migrate_and_history_maintain_without_ddl_rights(database_url: URL, app_role: str) -> None:
    app_url = as_role(database_url, app_role)
    line = _run(app_url, "migrate", exit_code=1)
    assert line.startswith("Error: flask pgqueue migrate: permission denied"), line
    line = _run(app_url, "history", "maintain", exit_code=1)
    assert line.startswith("Error: flask pgqueue history maintain: "), line
    assert "(SQLSTATE 42501)" in line, line
