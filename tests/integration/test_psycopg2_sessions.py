"""Applications whose engine is on psycopg2 (``postgresql+psycopg2://``, what most Flask apps
configure): jobs enqueued in their own sessions, one, many (a batch as large as the one that
goes by ``COPY`` on psycopg 3), a workflow, a unique job, commit with the session or roll back
with it, and a worker (on pgqueue's own psycopg 3 engines) runs each exactly once. Real
server, real psycopg2; the Flask extension on such an app, in a request and through
``flask pgqueue stats``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from support.cli_invoke import invoke

from pgqueue import ConfigurationError, Job, JobState, PgQueue
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue
from pgqueue.data.insert_choice import COPY_THRESHOLD
from pgqueue.db import ConnectionExecutor
from pgqueue.sqlstates import UNIQUE_VIOLATION, is_unique_violation, sqlstate_of
from pgqueue.workflows import chain


def _psycopg2(url: URL) -> URL:
    return url.set(drivername="postgresql+psycopg2")


@pytest.fixture
def psycopg2_engine(database_url: URL) -> Iterator[Engine]:
    engine = create_engine(_psycopg2(database_url))
    assert engine.dialect.driver == "psycopg2"
    yield engine
    engine.dispose()


def _states(engine: Engine) -> dict[str, int]:
    """How many jobs of the tests' tasks (not the workflow's own record) are in each state."""
    query = select(Job.state, func.count()).where(Job.task_name.like("p2.%")).group_by(Job.state)
    with engine.connect() as connection:
        rows = connection.execute(query).all()
    return {str(state): count for state, count in rows}


def test_jobs_enqueued_in_a_psycopg2_session_run_once(
    pgq: PgQueue, psycopg2_engine: Engine
) -> None:
    runs: list[Any] = []

    @pgq.task(name="p2.record")
    def record(n: int) -> None:
        runs.append(n)

    @pgq.task(name="p2.unique", unique_key=lambda n: f"unique-{n}")
    def unique(n: int) -> None:
        runs.append(("unique", n))

    many = COPY_THRESHOLD + 5
    with Session(psycopg2_engine) as session:
        record.configure(session=session).enqueue(-1)
        record.configure(session=session).enqueue_many([(n,) for n in range(many)])
        record.configure(session=session).enqueue_many([(-2,), (-3,)])
        chain(record.s(-10), record.si(-11)).enqueue(session=session)
        unique.configure(session=session).enqueue(7)
        unique.configure(session=session).enqueue(7)  # held by the first: not a second job
        session.commit()

    stats = pgq.run_worker(concurrency=4, drain=True)

    expected = [-1, *range(many), -2, -3, -10, -11, ("unique", 7)]
    assert sorted(map(str, runs)) == sorted(map(str, expected))
    assert stats.claimed == len(expected)
    assert _states(psycopg2_engine) == {str(JobState.SUCCEEDED): len(expected)}


def test_a_rolled_back_psycopg2_session_writes_no_job(
    pgq: PgQueue, psycopg2_engine: Engine
) -> None:
    @pgq.task(name="p2.never")
    def never(n: int) -> None:
        raise AssertionError("a rolled-back job ran")

    with Session(psycopg2_engine) as session:
        never.configure(session=session).enqueue(1)
        never.configure(session=session).enqueue_many([(n,) for n in range(COPY_THRESHOLD + 5)])
        chain(never.s(2), never.si(3)).enqueue(session=session)
        session.rollback()

    assert pgq.run_worker(drain=True).claimed == 0
    assert _states(psycopg2_engine) == {}


def test_copy_on_a_psycopg2_connection_is_refused_in_one_line(psycopg2_engine: Engine) -> None:
    with psycopg2_engine.connect() as connection:
        executor = ConnectionExecutor(connection)
        with pytest.raises(ConfigurationError, match=r"postgresql\+psycopg://") as raised:
            executor.copy("COPY pgqueue_jobs (task_name) FROM STDIN", ["p2.copy\n"])
    assert "\n" not in str(raised.value)


@pytest.fixture
def flask_app(database_url: URL) -> Iterator[tuple[Flask, SQLAlchemy, FlaskPgQueue]]:
    app = Flask("psycopg2_app")
    app.config["SQLALCHEMY_DATABASE_URI"] = _psycopg2(database_url).render_as_string(
        hide_password=False
    )
    app.config["PGQUEUE_POLL_INTERVAL"] = 0.2
    db = SQLAlchemy()
    db.init_app(app)
    flask_pgq = FlaskPgQueue(db=db)
    ran: list[int] = []

    @flask_pgq.task(name="p2flask.ship")
    def ship(n: int) -> None:
        ran.append(n)

    @app.post("/ship/<int:n>")
    def ship_view(n: int) -> str:
        ship.enqueue(n)
        db.session.commit()
        return "ok"

    @app.post("/fail/<int:n>")
    def fail_view(n: int) -> str:
        ship.enqueue(n)
        raise RuntimeError("the request fails before committing")

    flask_pgq.init_app(app)
    app.config["ran"] = ran
    yield app, db, flask_pgq
    with app.app_context():
        flask_pgq.queue.dispose()
        db.engine.dispose()


def test_flask_app_on_psycopg2_enqueues_with_the_request(
    flask_app: tuple[Flask, SQLAlchemy, FlaskPgQueue],
) -> None:
    app, db, flask_pgq = flask_app
    with app.app_context():
        assert db.engine.dialect.driver == "psycopg2"
        assert flask_pgq.queue.engine.dialect.driver == "psycopg"
    client = app.test_client()
    assert client.post("/ship/1").status_code == 200
    app.testing = False  # a failing view answers 500 instead of raising into the test
    assert client.post("/fail/2").status_code == 500
    with app.app_context():
        stats = flask_pgq.run_worker(drain=True)
    assert stats.claimed == 1
    assert app.config["ran"] == [1]


# A Flask app as most are configured: Flask-SQLAlchemy on psycopg2, pgqueue on db.
_APP_MODULE = """
import os

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from pgqueue.contrib.flask import PgQueue

db = SQLAlchemy()
pgq = PgQueue(db=db)
app = Flask("psycopg2_app")
app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["APP_DATABASE_URI"]
db.init_app(app)
pgq.init_app(app)
"""


def _stats_row(output: str) -> list[str]:
    """The cells of the ``default`` queue's row of ``pgqueue stats``' table."""
    row = next(line for line in output.splitlines() if "default" in line)
    return [cell.strip() for cell in row.strip("│ ").split("│")]


def test_flask_pgqueue_stats_on_a_psycopg2_app(
    pgq: PgQueue, database_url: URL, tmp_path: Path
) -> None:
    pgq.task(name="p2.stats")(lambda: None).enqueue()
    (tmp_path / "psycopg2_app.py").write_text(_APP_MODULE)
    uri = _psycopg2(database_url).render_as_string(hide_password=False)
    env = {**os.environ, "APP_DATABASE_URI": uri, "COLUMNS": "200"}
    env.pop("PGQUEUE_DATABASE_URL", None)
    argv = ["-m", "flask", "--app", "psycopg2_app:app", "pgqueue", "stats"]
    result = invoke(argv, cwd=tmp_path, env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert _stats_row(result.stdout)[:2] == ["default", "1"], result.stdout


def test_pgqueue_stats_on_a_psycopg2_url(pgq: PgQueue, database_url: URL, tmp_path: Path) -> None:
    pgq.task(name="p2.cli")(lambda: None).enqueue()
    uri = _psycopg2(database_url).render_as_string(hide_password=False)
    env = {**os.environ, "PGQUEUE_DATABASE_URL": uri, "COLUMNS": "200"}
    result = invoke(["-m", "pgqueue", "stats"], cwd=tmp_path, env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert _stats_row(result.stdout)[:2] == ["default", "1"], result.stdout


def test_the_errors_of_a_psycopg2_session_are_read_by_their_sqlstate(
    psycopg2_engine: Engine,
) -> None:
    with psycopg2_engine.connect() as connection:
        connection.execute(text("CREATE TEMPORARY TABLE once (id int PRIMARY KEY)"))
        connection.execute(text("INSERT INTO once VALUES (1)"))
        with pytest.raises(IntegrityError) as raised:
            connection.execute(text("INSERT INTO once VALUES (1)"))
    assert sqlstate_of(raised.value) == UNIQUE_VIOLATION
    assert is_unique_violation(raised.value)
