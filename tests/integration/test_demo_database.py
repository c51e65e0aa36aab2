"""``pgqueue demo`` and the ``pgqueue_demo`` database: on a server named by a URL it drops only
a ``pgqueue_demo`` an earlier demo created (marked by its comment), and refuses, in one line
with exit code 2 and nothing dropped, when one it did not create exists. On the embedded server
(no URL) the demo's database is always made afresh."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from server_databases import admin_engine
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from pgqueue import demo
from pgqueue.cli import main as cli_main

NAME = demo.DEMO_DATABASE


def _drop_demo(server_url: URL) -> None:
    admin = admin_engine(server_url)
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def server(server_url: URL, monkeypatch: pytest.MonkeyPatch) -> Iterator[URL]:
    """The test server, with no ``pgqueue_demo`` before or after the test."""
    for variable in ("PGQUEUE_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    _drop_demo(server_url)
    yield server_url
    _drop_demo(server_url)


def _someone_elses_database(server_url: URL) -> None:
    """A ``pgqueue_demo`` the demo did not create, holding a table of data."""
    admin = admin_engine(server_url)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{NAME}"'))
    admin.dispose()
    _add_table(server_url)


def _add_table(server_url: URL) -> None:
    engine = create_engine(server_url.set(database=NAME))
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE precious (id int)"))
        connection.execute(text("INSERT INTO precious VALUES (1)"))
    engine.dispose()


def _precious_rows(server_url: URL) -> int | None:
    """Rows of ``precious`` in ``pgqueue_demo``; None when the table is gone."""
    engine = create_engine(server_url.set(database=NAME))
    try:
        with engine.connect() as connection:
            if connection.scalar(text("SELECT to_regclass('precious')")) is None:
                return None
            return int(connection.scalar(text("SELECT count(*) FROM precious")) or 0)
    finally:
        engine.dispose()


def _demo(*args: str) -> Result:
    return CliRunner().invoke(cli_main, ["demo", "--jobs", "3", "--concurrency", "2", *args])


def test_with_a_url_the_demo_refuses_to_drop_a_database_it_did_not_create(server: URL) -> None:
    _someone_elses_database(server)
    url = server.render_as_string(hide_password=False)
    result = _demo("--database-url", url)
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"error: database {NAME} already exists on "), line
    assert "pgqueue demo did not create it: refusing to drop it" in line
    assert _precious_rows(server) == 1


def test_with_a_url_the_demo_recreates_the_database_it_created(server: URL) -> None:
    url = server.render_as_string(hide_password=False)
    first = _demo("--database-url", url)
    assert first.exit_code == 0, first.output
    assert "pgqueue demo summary" in first.output
    _add_table(server)  # the demo's own database, whatever was added to it since
    second = _demo("--database-url", url)
    assert second.exit_code == 0, second.output
    assert _precious_rows(server) is None


def test_on_the_embedded_server_the_demo_always_starts_afresh(
    server: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session's server stands in for the embedded one the demo would start.
    url = server.render_as_string(hide_password=False)
    monkeypatch.setattr(demo, "shared_server", lambda *args, **kwargs: url)
    _someone_elses_database(server)
    result = _demo()
    assert result.exit_code == 0, result.output
    assert "pgqueue demo summary" in result.output
    assert _precious_rows(server) is None
    assert f"  PGQUEUE_EMBEDDED_DATABASE={NAME} pgqueue stats" in result.output.splitlines()


def test_the_demo_ends_with_commands_that_show_its_jobs(
    server: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = server.render_as_string(hide_password=False)
    result = _demo("--database-url", url)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    steps = lines[lines.index(next(line for line in lines if line.endswith("Next:"))) + 1 :]
    commands = [line.strip().removeprefix("PGQUEUE_DATABASE_URL=... ") for line in steps[:3]]
    assert [c.split()[:2] for c in commands] == [
        ["pgqueue", "stats"],
        ["pgqueue", "jobs"],
        ["pgqueue", "show"],
    ]
    monkeypatch.setenv(
        "PGQUEUE_DATABASE_URL", server.set(database=NAME).render_as_string(hide_password=False)
    )
    for command in commands:
        shown = CliRunner().invoke(cli_main, command.split()[1:])
        assert shown.exit_code == 0, (command, shown.output)
    job_id = int(commands[2].split()[2])
    shown = CliRunner().invoke(cli_main, ["show", str(job_id)])
    assert shown.output.splitlines()[0].split() == ["id", str(job_id)], shown.output
    assert re.search(r"^task_name +demo\.", shown.output, re.MULTILINE), shown.output
