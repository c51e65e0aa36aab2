"""A small orders service: creating an order enqueues a job that sends its receipt.

Run it (see ../README.md)::

    flask --app orders pgqueue migrate && flask --app orders create-tables
    flask --app orders run                  # the web app, dashboard at /pgqueue
    flask --app orders pgqueue worker       # the worker, in another terminal
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, abort, current_app, request

from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.database_urls import normalize_database_url


def database_url() -> str:
    """``$DATABASE_URL``, else database ``orders_flask`` of pgqueue's embedded PostgreSQL (shared by
    the app and its worker; other apps on that server have databases of their own)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        from pgqueue.embedded import app_database, shared_server

        url = app_database(shared_server(), "orders_flask")
    return normalize_database_url(url).render_as_string(hide_password=False)


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    from orders import tasks  # noqa: F401 - declares the tasks (before init_app or after: both work)
    from orders.extensions import db, migrate, pgq
    from orders.views import bp

    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=os.environ.get("SECRET_KEY") or secrets.token_hex(32),
        DASHBOARD_PASSWORD=os.environ.get("DASHBOARD_PASSWORD"),
    )
    if config is not None:
        app.config.update(config)
    if "SQLALCHEMY_DATABASE_URI" not in app.config:
        # Only now: looking the URL up may start the embedded development server.
        app.config["SQLALCHEMY_DATABASE_URI"] = database_url()

    db.init_app(app)
    migrate.init_app(app, db)  # before or after pgq.init_app: pgqueue hides its tables either way
    pgq.init_app(app)
    app.register_blueprint(bp)
    init_dashboard(app, url_prefix="/pgqueue", access=dashboard_access)

    @app.cli.command("create-tables")
    def create_tables() -> None:
        """Create the service's own tables (a real app would use `flask db upgrade`)."""
        db.create_all()
        print("tables created")

    return app


def dashboard_access() -> bool:
    """HTTP basic auth against $DASHBOARD_PASSWORD (any user name); closed when it is unset."""
    password = current_app.config.get("DASHBOARD_PASSWORD")
    if not password:
        abort(403, description="set DASHBOARD_PASSWORD to open the dashboard")
    auth = request.authorization
    given = auth.password if auth is not None and auth.password is not None else ""
    # As bytes: compare_digest refuses str holding non-ASCII characters (a TypeError, so a 500),
    # and a password may hold anything. A header that is not valid Base64 or UTF-8 reaches here
    # as no credentials at all, and is refused like a wrong password.
    if hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), str(password).encode("utf-8", "surrogatepass")
    ):
        return True
    abort(Response("login required", 401, {"WWW-Authenticate": 'Basic realm="pgqueue"'}))
