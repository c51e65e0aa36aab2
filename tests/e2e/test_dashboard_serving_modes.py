"""The same dashboard in headless Chromium under each way of serving it: Flask
(``init_dashboard``), FastAPI (``asgi_app`` mounted, served by uvicorn) and standalone
(``pgqueue dashboard`` as a real process, logged in through its form with the printed token).
In each: every page renders under the strict Content-Security-Policy with no violation, a
failed job is retried with its page's button, a queue is paused and resumed, and a schedule of
the served app's code is paused, resumed and run now from its page, with the audit page showing
those actions; a waiting job is run now, rescheduled, given a priority and sent a signal from
its page, each audited; and a job enqueued while the overview is open appears in its counts
within 2 s without a reload, and the page's polling stops while the tab is hidden and resumes at
once when it is shown.

One browser for the module, one server per mode (module-scoped), one database for all (the
fixtures of ``tests/e2e/conftest.py``): each mode acts on jobs and a queue of its own.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from playwright.sync_api import expect
from sqlalchemy.engine import URL
from support.serving_modes import MODES, Mounted, add_schedule

from pgqueue import JobState, PgQueue

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pgq(url: URL) -> Iterator[PgQueue]:
    queue = PgQueue(url)
    for mode in MODES:
        queue.task(name=f"{mode}.fails", queue=f"{mode}-q", max_attempts=1)(_fails)
        queue.task(name=f"{mode}.later", queue=f"{mode}-later")(_later)
        queue.task(name=f"{mode}.live", queue=f"{mode}-live")(_fails)
    add_schedule(queue, "fastapi")
    yield queue
    queue.dispose()


def _fails() -> None:
    raise RuntimeError("always fails")


def _later(order: int) -> int:
    return order


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
    for link, heading in (
        ("Jobs", "Jobs"),
        ("Queues", "Queue controls"),
        ("Workers", "Workers"),
        ("Schedules", "Schedules"),
        ("Audit", "Audit log"),
    ):
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


def test_a_schedule_paused_resumed_and_run_now_from_its_page_then_the_audit_page(
    served: tuple[str, Mounted], pgq: PgQueue, page: Page
) -> None:
    mode, dashboard = served
    name = f"{mode}.nightly"
    actor = "token" if dashboard.token is not None else "dashboard"
    page.goto(dashboard.base + "/schedules")
    if dashboard.token is not None:
        page.fill('input[name="password"]', dashboard.token)
        page.click('button[type="submit"]')
    row = page.locator(f'tr[data-schedule="{name}"]')
    expect(row.locator(".cron")).to_have_text("0 3 * * *")

    row.locator("button.pause").click()
    expect(page.locator(".flash-ok")).to_contain_text(f"Schedule {name} paused")
    expect(row.locator(".status")).to_have_text("paused")
    row.locator("button.resume").click()
    expect(page.locator(".flash-ok")).to_have_text(f"Schedule {name} resumed from its next tick.")
    expect(row.locator(".status")).to_have_text("active")
    row.locator("button.run-now").click()
    expect(page.locator(".flash-ok")).to_contain_text(f"Schedule {name} run now as job ")
    job_id = int(page.locator(".flash-ok").inner_text().rsplit(" ", 1)[1].rstrip("."))
    assert pgq.admin.get_job(job_id).task_name == f"{mode}.tick"

    page.click("header nav >> text=Audit")
    mine = page.locator("table.audit tbody tr", has_text=name)
    expect(mine.locator(".action")).to_have_text(
        ["run_schedule", "resume_schedule", "pause_schedule"]
    )
    expect(mine.locator(".actor")).to_have_text([actor] * 3)
    mine.first.locator(f'a[href$="/jobs/{job_id}"]').click()
    expect(page.locator("h1")).to_contain_text(str(job_id))


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


def test_a_job_enqueued_while_the_overview_is_open_appears_within_2_s(
    served: tuple[str, Mounted], pgq: PgQueue, page: Page
) -> None:
    mode, dashboard = served
    _log_in(page, dashboard, "/")
    expect(page.locator("header .brand")).to_have_text("pgqueue")
    loaded = page.evaluate("performance.timeOrigin")
    cell = page.locator(f'tr[data-queue="{mode}-live"] td[data-state="queued"]')
    expect(cell).to_have_count(0)
    pgq.registry.get(f"{mode}.live").enqueue()
    expect(cell).to_have_text("1", timeout=2000)
    # The same document: the count came in without a reload.
    assert page.evaluate("performance.timeOrigin") == loaded


def _set_visibility(page: Page, state: str) -> None:
    page.evaluate(
        """state => {
            Object.defineProperty(document, "visibilityState", {get: () => state,
                                                                configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        state,
    )


def test_polling_stops_while_the_tab_is_hidden_and_resumes_when_shown(
    served: tuple[str, Mounted], page: Page
) -> None:
    _, dashboard = served
    # The page's timers run on a clock the test moves, so no test time is spent waiting.
    page.clock.install()
    _log_in(page, dashboard, "/")
    expect(page.locator("header .brand")).to_have_text("pgqueue")
    polled: list[str] = []
    page.on("request", lambda r: polled.append(r.url) if "fragment=overview" in r.url else None)
    with page.expect_response(lambda r: "fragment=overview" in r.url) as first:
        page.clock.run_for(1100)
    assert first.value.status == 200
    status = page.locator("html")
    expect(status).to_have_attribute("data-live-status", "waiting")
    _set_visibility(page, "hidden")
    expect(status).to_have_attribute("data-live-status", "hidden")
    seen = len(polled)
    page.clock.run_for(60_000)
    assert len(polled) == seen
    with page.expect_request(lambda r: "fragment=overview" in r.url):
        _set_visibility(page, "visible")
    assert len(polled) == seen + 1
