"""``flask pgqueue ...`` and ``flask db migrate``, run as a fresh process runs them (in this
process: ``support.cli_invoke``; the first command in a real one): the example app, an app
factory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from support.cli_invoke import invoke

from pgqueue import migrations

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flask_app"


def _env(database_url: URL, *extra_paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(EXAMPLE), *map(str, extra_paths), env.get("PYTHONPATH", "")]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
        DATABASE_URL=database_url.render_as_string(hide_password=False),
        PGQUEUE_POLL_INTERVAL="0.2",
        SECRET_KEY="test",
        COLUMNS="200",  # rich tables: keep task names on one line
    )
    env.pop("FLASK_APP", None)
    return env


def flask(
    args: list[str],
    env: dict[str, str],
    cwd: Path = EXAMPLE,
    app: str = "orders",
    *,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m flask --app APP ARGS``, in this process (or, with ``process``, in a real one)."""
    argv = ["-m", "flask", "--app", app, *args]
    if process:
        result = subprocess.run(
            [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
    else:
        result = invoke(argv, env=env, cwd=cwd)
    assert result.returncode == 0, f"flask {args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_flask_pgqueue_migrate_enqueue_worker_against_the_example(
    empty_database_url: URL,
) -> None:
    env = _env(empty_database_url)
    # The first command starts a real interpreter: the extension's commands as a shell runs them.
    out = flask(["pgqueue", "migrate"], env, process=True).stdout
    assert f"pgqueue schema at {migrations.head()}" in out
    assert "(head)" in flask(["pgqueue", "migrate", "current"], env).stdout
    flask(["create-tables"], env)
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            order_id = connection.scalar(
                text(
                    "INSERT INTO orders (item, quantity, email) "
                    "VALUES ('book', 1, 'e@x.org') RETURNING id"
                )
            )
        job_id = int(
            flask(
                ["pgqueue", "enqueue", "orders.tasks.send_receipt", "--args", f"[{order_id}]"], env
            ).stdout.strip()
        )
        flask(["pgqueue", "worker", "--drain", "--concurrency", "2"], env)
        with engine.connect() as connection:
            state = connection.scalar(
                text("SELECT state FROM pgqueue_jobs WHERE id = :id"), {"id": job_id}
            )
            receipts = connection.execute(text("SELECT order_id FROM receipts")).scalars().all()
        assert state == "succeeded"
        assert receipts == [order_id]
        listing = flask(["pgqueue", "jobs", "--state", "succeeded"], env).stdout
        assert "orders.tasks.send_receipt" in listing and str(job_id) in listing
    finally:
        engine.dispose()


def _autogenerate(database_url: URL, tmp_path: Path, app: str, name: str, **extra_env: str) -> str:
    """``flask db init`` + ``flask db migrate`` into a temp migrations dir; the revision text."""
    env = _env(database_url, tmp_path) | extra_env
    directory = tmp_path / name
    flask(["db", "init", "-d", str(directory)], env, app=app)
    result = flask(["db", "migrate", "-d", str(directory), "-m", "initial"], env, app=app)
    revisions = list((directory / "versions").glob("*.py"))
    assert len(revisions) == 1, result.stdout + result.stderr
    return revisions[0].read_text()


def test_flask_db_migrate_proposes_nothing_for_pgqueue_tables(
    database_url: URL, tmp_path: Path
) -> None:
    # Control first (before any upgrade): without the automatic configuration, the same host
    # would drop pgqueue's tables.
    (tmp_path / "plain_host.py").write_text(
        "from orders import create_app\napp = create_app({'PGQUEUE_CONFIGURE_MIGRATE': False})\n"
    )
    control = _autogenerate(database_url, tmp_path, "plain_host:app", "control")
    assert "op.drop_table('pgqueue_jobs')" in control

    # The database already holds pgqueue's tables (and its version table).
    revision = _autogenerate(database_url, tmp_path, "orders", "migrations")
    assert "op.create_table('orders'" in revision
    assert "op.create_table('receipts'" in revision
    assert "pgqueue" not in revision

    # Once the host's own tables exist, there is nothing left to propose at all.
    env = _env(database_url, tmp_path)
    flask(["db", "upgrade", "-d", str(tmp_path / "migrations")], env)
    again = flask(["db", "migrate", "-d", str(tmp_path / "migrations")], env)
    assert "No changes in schema detected" in again.stdout + again.stderr


FACTORY_HOST = '''
"""An app factory whose Flask-Migrate setup comes before or after pgq.init_app ($MIGRATE_ORDER)."""

import os

from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import Mapped, mapped_column

from pgqueue.contrib.flask import PgQueue

db = SQLAlchemy()
migrate = Migrate()
pgq = PgQueue(db=db)


class Widget(db.Model):
    __tablename__ = "widgets"
    id: Mapped[int] = mapped_column(primary_key=True)


def create_app():
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["DATABASE_URL"]
    db.init_app(app)
    if os.environ["MIGRATE_ORDER"] == "after":
        pgq.init_app(app)
        migrate.init_app(app, db)
    else:
        migrate.init_app(app, db)
        pgq.init_app(app)
    return app
'''


@pytest.mark.parametrize("order", ["before", "after"])
def test_flask_db_migrate_skips_pgqueue_tables_whichever_comes_first(
    database_url: URL, tmp_path: Path, order: str
) -> None:
    # "after" is an app factory calling Migrate(app, db) once pgq.init_app(app) has run: the
    # filter must still reach the configure_args Flask-Migrate built last.
    (tmp_path / "factory_host.py").write_text(FACTORY_HOST)
    revision = _autogenerate(
        database_url, tmp_path, "factory_host:create_app", "migrations", MIGRATE_ORDER=order
    )
    assert "op.create_table('widgets'" in revision
    assert "pgqueue" not in revision
