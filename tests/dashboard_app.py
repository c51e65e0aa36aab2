"""A Flask app serving the pgqueue dashboard on a test database, and a real HTTP server for it:
for the tests that read its pages through Flask's test client or a browser (and the docs'
screenshot script)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask
from sqlalchemy.engine import URL
from werkzeug.serving import make_server

from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard


@contextmanager
def dashboard_app(
    queue: PgQueue, database_url: URL, name: str, **config: object
) -> Iterator[Flask]:
    """An app named ``name`` with ``queue`` on ``database_url`` and the dashboard open to all
    (at ``/pgqueue``), with ``config`` added to its settings; the queue's engines are disposed
    of on exit."""
    app = Flask(name)
    app.config.update(
        SECRET_KEY="test-secret",
        PGQUEUE_DATABASE_URL=database_url.render_as_string(hide_password=False),
        **config,
    )
    queue.init_app(app)
    init_dashboard(app, access=lambda: True)
    try:
        yield app
    finally:
        queue.state(app).queue.dispose()


@contextmanager
def serving(app: Flask) -> Iterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1 in a thread; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
