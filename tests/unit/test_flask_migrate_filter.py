"""pgqueue's autogenerate filter on Flask-Migrate's configuration, whatever the setup order.

No database: building the apps connects nowhere, and the filter is called on table names only.
The command-line proof (``flask db migrate`` writing no ``pgqueue_`` operation) is in
``tests/e2e/test_flask_cli.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy

from pgqueue.contrib.flask import PgQueue


def _host_filter(obj: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
    return name != "legacy_reports"


@pytest.mark.parametrize("order", ["before", "after"])
def test_filter_reaches_the_last_migrate_config_and_chains_the_host_filter(order: str) -> None:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = "postgresql+psycopg://nobody@localhost/unused"
    db = SQLAlchemy()
    db.init_app(app)
    pgq = PgQueue(db=db)
    migrate = Migrate()
    if order == "after":
        pgq.init_app(app)
        migrate.init_app(app, db, include_object=_host_filter)
    else:
        migrate.init_app(app, db, include_object=_host_filter)
        pgq.init_app(app)

    with app.app_context(), app.app_context():  # a second push must not wrap it again
        include_object = app.extensions["migrate"].configure_args["include_object"]
    assert app.extensions["migrate"].configure_args["include_object"] is include_object
    assert include_object("pgqueue_jobs", "pgqueue_jobs", "table", True, None) is False
    assert include_object("legacy_reports", "legacy_reports", "table", True, None) is False
    assert include_object("widgets", "widgets", "table", True, None) is True


def test_without_configure_migrate_the_host_filter_is_left_as_set() -> None:
    app = Flask(__name__)
    app.config.update(
        SQLALCHEMY_DATABASE_URI="postgresql+psycopg://nobody@localhost/unused",
        PGQUEUE_CONFIGURE_MIGRATE=False,
    )
    db = SQLAlchemy()
    db.init_app(app)
    PgQueue(db=db).init_app(app)
    Migrate(app, db, include_object=_host_filter)
    with app.app_context():
        assert app.extensions["migrate"].configure_args["include_object"] is _host_filter
