"""The pgqueue dashboard as the tests read it: a Flask app serving it on a test database, a real
HTTP server for that app, and the headless Chromium (Debian's, driven by Playwright) that
browses it; the standalone ``pgqueue dashboard`` as a process; and the forms of a page as a
browser would submit them. For the tests that read its pages through a test client or a
browser."""

from __future__ import annotations

import re
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from flask import Flask
from sqlalchemy.engine import URL
from werkzeug.serving import make_server

from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from support.processes import pgqueue_command, pgqueue_env

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def dashboard_app(
    queue: PgQueue,
    database_url: URL,
    name: str,
    *,
    access: Callable[[], Any] | None = None,
    public: bool = False,
    actor: Callable[[], str] | None = None,
    read_only: bool = False,
    **config: object,
) -> Iterator[Flask]:
    """An app named ``name`` with ``queue`` on ``database_url`` and the dashboard at
    ``/pgqueue``, open to all unless ``access`` says otherwise (with ``public``, mounted with no
    check at all; ``actor`` and ``read_only`` as ``init_dashboard``'s), with ``config`` added
    to its settings; the queue's engines are disposed of on exit."""
    app = Flask(name)
    app.config.update(
        SECRET_KEY="test-secret",
        PGQUEUE_DATABASE_URL=database_url.render_as_string(hide_password=False),
        **config,
    )
    queue.init_app(app)
    if access is None and not public:
        access = _everyone
    init_dashboard(app, access=access, public=public, actor=actor, read_only=read_only)
    try:
        yield app
    finally:
        queue.state(app).queue.dispose()


def _everyone() -> bool:
    return True


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


@contextmanager
def served_dashboard(
    queue: PgQueue, database_url: URL, name: str, **options: Any
) -> Iterator[tuple[Flask, str]]:
    """``dashboard_app`` (``options`` as there) served over HTTP; yields the app and the
    dashboard's URL."""
    with dashboard_app(queue, database_url, name, **options) as app, serving(app) as base:
        yield app, f"{base}/pgqueue"


@contextmanager
def chromium_page(**options: Any) -> Iterator[Page]:
    """A new page (``options`` as Playwright's ``new_page``) in a headless Chromium, closed
    with its browser at the end."""
    # Imported here: the tests that read pages through Flask's test client need no browser.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(**options)
        finally:
            browser.close()


@dataclass
class StandaloneProcess:
    """One ``pgqueue dashboard`` process: its base URL and the first lines it printed (the
    last: the token line, unless a login option replaced the token)."""

    process: subprocess.Popen[str]
    base: str
    printed: list[str]


def standalone_login(
    client: httpx.Client, headers: dict[str, str] | None = None, **form: str
) -> httpx.Response:
    """POST the standalone dashboard's login form as a browser does: fetch the form (and the
    session cookie holding its CSRF token), then post ``form`` with that token. The session
    cookie the form sets goes back as a header: ``client``'s jar keeps a Secure one (set over
    TLS, as a trusted proxy's ``X-Forwarded-Proto`` says) for HTTPS only."""
    page = client.get("/login", headers=headers)
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, page.text
    sent = dict(headers or {})
    for header in page.headers.get_list("set-cookie"):
        if header.startswith("pgqueue_dashboard="):
            sent["Cookie"] = header.split(";")[0]
    return client.post("/login", data={"csrf_token": found.group(1), **form}, headers=sent)


def start_standalone(url: URL, directory: Path, *args: str) -> StandaloneProcess:
    """``pgqueue dashboard ARGS`` on a free port of 127.0.0.1, in ``directory``, on ``url``;
    returned once it printed its address."""
    process = subprocess.Popen(
        pgqueue_command("dashboard", "--bind", "127.0.0.1:0", *args),
        env={**pgqueue_env(url), "PYTHONUNBUFFERED": "1"},
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    printed: list[str] = []
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if selector.select(timeout=deadline - time.monotonic()):
            line = process.stdout.readline()
            if not line:
                break
            printed.append(line.rstrip("\n"))
            found = re.match(r"pgqueue dashboard on (http://127\.0\.0\.1:\d+)/$", printed[-1])
            if found:
                if "--auth-file" not in args and "--trust-header" not in args:
                    printed.append(process.stdout.readline().rstrip("\n"))
                return StandaloneProcess(process, found.group(1), printed)
    process.kill()
    raise AssertionError(f"no address printed: {printed}")


@dataclass
class Form:
    """A form of a page as a browser submits it untouched: its method, where it goes, and each
    field's value (a select's selected option, else its first)."""

    method: str
    action: str
    fields: dict[str, str] = field(default_factory=dict)


class _FormReader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.forms: list[Form] = []
        self._open: Form | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        name = attributes.get("name")
        if tag == "form":
            method = attributes.get("method", "get").lower()
            self._open = Form(method, attributes.get("action", ""))
            self.forms.append(self._open)
        elif self._open is None or (name is None and tag != "option"):
            return
        elif tag == "input" and name is not None:
            # The dashboard's forms have text, hidden, number and time inputs, and no boxes.
            if attributes.get("type", "text").lower() not in ("submit", "button", "reset"):
                self._open.fields[name] = attributes.get("value", "")
        elif tag == "select":
            self._select = name
        elif tag == "option" and self._select is not None:
            # The first option is the default; one marked selected takes its place.
            chosen = self._select not in self._open.fields or "selected" in attributes
            if chosen:
                self._open.fields[self._select] = attributes.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._open = None
        elif tag == "select":
            self._select = None


def page_form(html: str, action: str, **fields: str) -> Form:
    """The one form of the page ``html`` that goes to ``action`` with ``fields`` among its
    values (e.g. the pause form of one queue's row)."""
    reader = _FormReader()
    reader.feed(html)
    found = [
        form
        for form in reader.forms
        if form.action == action and all(form.fields.get(k) == v for k, v in fields.items())
    ]
    assert len(found) == 1, f"{len(found)} forms to {action} with {fields} on the page"
    return found[0]
