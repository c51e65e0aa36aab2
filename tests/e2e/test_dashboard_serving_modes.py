"""The same dashboard in headless Chromium under each way of serving it: Flask
(``init_dashboard``), FastAPI (``asgi_app`` mounted, served by uvicorn) and standalone
(``pgqueue dashboard`` as a real process, logged in through its form with the printed token).
In each: every page renders under the strict Content-Security-Policy with no violation, a
failed job is retried with its page's button, a queue is paused and resumed, and a waiting job
is run now, rescheduled, given a priority and sent a signal from its page, each audited.

One browser for the module, one server per mode (module-scoped), one database for all: each
mode acts on jobs and a queue of its own.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from flask import Flask
from playwright.sync_api import expect
from server_databases import create_database, drop_database
from sqlalchemy.engine import URL
from support.dashboard import CHROMIUM, CHROMIUM_ARGS, serving, start_standalone

from pgqueue import JobState, PgQueue
from pgqueue.contrib.flask import PgQueue as FlaskQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.dashboard.asgi import asgi_app

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = pytest.mark.slow

MODES = ["flask", "fastapi", "standalone"]


@dataclass
class Mounted:
    """A dashboard being served: its URL, and the token to log in with (standalone only)."""

    base: str
    token: str | None = None


@pytest.fixture(scope="module")
def url(server_url: URL, template_name: str) -> Iterator[URL]:
    database = create_database(server_url, template_name)
    yield database
    drop_database(server_url, database)


@pytest.fixture(scope="module")
def pgq(url: URL) -> Iterator[PgQueue]:
    queue = PgQueue(url)
    for mode in MODES:
        queue.task(name=f"{mode}.fails", queue=f"{mode}-q", max_attempts=1)(_fails)
        queue.task(name=f"{mode}.later", queue=f"{mode}-later")(_later)
    yield queue
    queue.dispose()


def _fails() -> None:
    raise RuntimeError("always fails")


def _later(order: int) -> int:
    return order


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _flask(url: URL) -> Iterator[Mounted]:
    app = Flask("serving_modes")
    app.config.update(
        SECRET_KEY="test-secret", PGQUEUE_DATABASE_URL=url.render_as_string(hide_password=False)
    )
    extension = FlaskQueue()
    extension.init_app(app)
    init_dashboard(app, public=True)
    try:
        with serving(app) as base:
            yield Mounted(base + "/pgqueue")
    finally:
        extension.state(app).queue.dispose()


def _fastapi(pgq: PgQueue) -> Iterator[Mounted]:
    import uvicorn
    from fastapi import FastAPI

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


def _standalone(url: URL, directory: Path) -> Iterator[Mounted]:
    served = start_standalone(url, directory)
    token = served.printed[-1].rsplit(" ", 1)[1]
    try:
        yield Mounted(served.base, token)
    finally:
        served.process.terminate()
        served.process.wait(timeout=30)


@pytest.fixture(scope="module", params=MODES)
def served(
    request: pytest.FixtureRequest, url: URL, pgq: PgQueue, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Mounted]]:
    mode = request.param
    if mode == "flask":
        yield from ((mode, s) for s in _flask(url))
    elif mode == "fastapi":
        yield from ((mode, s) for s in _fastapi(pgq))
    else:
        yield from ((mode, s) for s in _standalone(url, tmp_path_factory.mktemp("standalone")))


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()


def test_every_page_and_the_job_and_queue_actions(
    served: tuple[str, Mounted], pgq: PgQueue, page: Page
) -> None:
    mode, dashboard = served
    job_id = pgq.registry.get(f"{mode}.fails").enqueue()
    pgq.run_worker(queues=[f"{mode}-q"], drain=True)
    assert pgq.admin.get_job(job_id).state is JobState.FAILED
    violations: list[str] = []
    page.on(
        "console",
        lambda message: (
            violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )

    page.goto(dashboard.base + "/")
    if dashboard.token is not None:
        expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        page.fill('input[name="password"]', dashboard.token)
        page.click('button[type="submit"]')
    expect(page.locator("header .brand")).to_have_text("pgqueue")
    expect(page.locator("main")).to_contain_text(f"{mode}-q")
    for link, heading in (("Jobs", "Jobs"), ("Queues", "Queue controls"), ("Workers", "Workers")):
        page.click(f"header nav >> text={link}")
        expect(page.locator("h1")).to_contain_text(heading)

    page.goto(f"{dashboard.base}/jobs/{job_id}")
    expect(page.locator("#job-state")).to_have_text("failed")
    expect(page.locator("main")).to_contain_text("always fails")
    page.click("button.retry")
    expect(page.locator(".flash-ok")).to_have_text(f"Job {job_id} queued again.")
    expect(page.locator("#job-state")).to_have_text(re.compile("queued|retrying"))

    page.goto(dashboard.base + "/queues")
    row = page.locator("tr", has_text=f"{mode}-q")
    row.locator("button.pause").click()
    expect(page.locator(".flash-ok")).to_contain_text(f"Queue {mode}-q paused")
    assert pgq.admin.queue_settings()[f"{mode}-q"].paused
    page.locator("tr", has_text=f"{mode}-q").locator("button.resume").click()
    expect(page.locator(".flash-ok")).to_have_text(f"Queue {mode}-q resumed.")
    assert not pgq.admin.queue_settings()[f"{mode}-q"].paused
    if dashboard.token is not None:
        page.click("header .logout button")
        expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        page.goto(dashboard.base + "/queues")
        expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    assert violations == []


def _log_in(page: Page, dashboard: Mounted, path: str) -> None:
    page.goto(dashboard.base + path)
    if dashboard.token is not None:
        expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        page.fill('input[name="password"]', dashboard.token)
        page.click('button[type="submit"]')


def test_run_now_reschedule_priority_and_signal_from_the_job_page(
    served: tuple[str, Mounted], pgq: PgQueue, page: Page
) -> None:
    mode, dashboard = served
    later = pgq.registry.get(f"{mode}.later")
    job_id = later.configure(run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).enqueue(1)
    _log_in(page, dashboard, f"/jobs/{job_id}")
    expect(page.locator("#job-state")).to_have_text("queued")

    page.click("button.run-now")
    expect(page.locator(".flash-ok")).to_contain_text(f"Job {job_id} may run now")
    target = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).replace(microsecond=0)
    page.fill('#job-reschedule input[name="run_at"]', target.strftime("%Y-%m-%dT%H:%M:%S"))
    page.click("button.reschedule")
    shown = target.strftime("%Y-%m-%d %H:%M:%S UTC")
    expect(page.locator(".flash-ok")).to_have_text(f"Job {job_id} rescheduled to {shown}.")
    page.fill('#job-priority input[name="priority"]', "-3")
    page.click("button.priority")
    expect(page.locator(".flash-ok")).to_have_text(f"Job {job_id} now has priority -3.")
    page.fill('#job-signal input[name="name"]', "approved")
    page.fill('#job-signal input[name="payload"]', '{"by": "ops"}')
    page.click("button.signal")
    expect(page.locator(".flash-ok")).to_have_text(f"Signal 'approved' sent to job {job_id}.")
    expect(page.locator("#job-signals .signal-name")).to_have_text("approved")

    job = pgq.admin.get_job(job_id)
    assert (job.run_at, job.priority) == (target, -3)
    actor = "token" if dashboard.token is not None else "dashboard"
    actions = [
        (entry.action, entry.actor, entry.source)
        for entry in pgq.admin.audit_log(limit=100).entries
        if entry.job_id == job_id
    ]
    assert actions == [
        ("signal", actor, "dashboard"),
        ("set_priority", actor, "dashboard"),
        ("reschedule", actor, "dashboard"),
        ("run_now", actor, "dashboard"),
    ]
