"""A Flask app serving the pgqueue dashboard on a test database: for the tests that read its
pages through Flask's test client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask
from sqlalchemy.engine import URL

from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard


@contextmanager
def dashboard_app(queue: PgQueue, database_url: URL, name: str) -> Iterator[Flask]:
    """An app named ``name`` with ``queue`` on ``database_url`` and the dashboard open to all
    (at ``/pgqueue``); the queue's engines are disposed of on exit."""
    app = Flask(name)
    app.config.update(
        SECRET_KEY="test-secret",
        PGQUEUE_DATABASE_URL=database_url.render_as_string(hide_password=False),
    )
    queue.init_app(app)
    init_dashboard(app, access=lambda: True)
    try:
        yield app
    finally:
        queue.state(app).queue.dispose()
