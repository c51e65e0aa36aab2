"""The dashboard served each way a user can serve it, for browser tests parametrised by the
serving mode: Flask (``init_dashboard`` on a werkzeug server), FastAPI (``asgi_app`` mounted,
on uvicorn) and standalone (``pgqueue dashboard`` as a real process, logged in with the token
it printed). The fixtures that start them once per module are in ``tests/e2e/conftest.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page
    from sqlalchemy.engine import URL

    from pgqueue import PgQueue

# The web frameworks are imported by the mode that needs them: the e2e conftest imports this
# module, and most e2e tests serve no dashboard.

MODES = ["flask", "fastapi", "standalone"]


@dataclass
class Mounted:
    """A dashboard being served: its URL, and the token to log in with (standalone only)."""

    base: str
    token: str | None = None


def log_in(page: Page, dashboard: Mounted) -> None:
    """Open the dashboard in ``page``, through the standalone login form when it has one."""
    page.goto(dashboard.base + "/")
    if dashboard.token is not None:
        page.fill('input[name="password"]', dashboard.token)
        page.click('button[type="submit"]')
        page.wait_for_selector("header .brand")


def _tick() -> None:
    pass


def add_schedule(queue: PgQueue, mode: str) -> None:
    """A nightly schedule of ``mode``'s own on ``queue``: the modes share one database."""
    task = queue.task(name=f"{mode}.tick", queue=f"{mode}-ticks")(_tick)
    queue.periodic("0 3 * * *", name=f"{mode}.nightly")(task)


# The app the standalone dashboard is given (APP), for its schedule in code.
STANDALONE_APP = """
from pgqueue import PgQueue

pgq = PgQueue()


@pgq.periodic("0 3 * * *", name="standalone.nightly")
@pgq.task(name="standalone.tick", queue="standalone-ticks")
def tick() -> None:
    pass
"""


def flask_mode(url: URL) -> Iterator[Mounted]:
    from flask import Flask

    from pgqueue.contrib.flask import PgQueue as FlaskQueue
    from pgqueue.contrib.flask.dashboard import init_dashboard
    from support.dashboard import serving

    app = Flask("serving_modes")
    app.config.update(
        SECRET_KEY="test-secret", PGQUEUE_DATABASE_URL=url.render_as_string(hide_password=False)
    )
    extension = FlaskQueue()
    extension.init_app(app)
    add_schedule(extension.state(app).queue, "flask")
    init_dashboard(app, public=True)
    try:
        with serving(app) as base:
            yield Mounted(base + "/pgqueue")
    finally:
        extension.state(app).queue.dispose()


def fastapi_mode(pgq: PgQueue) -> Iterator[Mounted]:
    import uvicorn
    from fastapi import FastAPI

    from pgqueue.dashboard.asgi import asgi_app

    app = FastAPI()
    app.mount("/pgqueue", asgi_app(pgq, public=True, secret_key="test-secret"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Mounted(f"http://127.0.0.1:{port}/pgqueue")
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def standalone_mode(url: URL, directory: Path) -> Iterator[Mounted]:
    from support.dashboard import start_standalone

    (directory / "served_app.py").write_text(STANDALONE_APP)
    served = start_standalone(url, directory, "served_app:pgq")
    token = served.printed[-1].rsplit(" ", 1)[1]
    try:
        yield Mounted(served.base, token)
    finally:
        served.process.terminate()
        served.process.wait(timeout=30)


def mounted(mode: str, url: URL, pgq: PgQueue, directory: Path) -> Iterator[Mounted]:
    """The dashboard on ``url`` served as ``mode`` (FastAPI's with ``pgq``, so it knows its
    tasks and schedules), stopped when the iterator is closed."""
    if mode == "flask":
        return flask_mode(url)
    if mode == "fastapi":
        return fastapi_mode(pgq)
    return standalone_mode(url, directory)
