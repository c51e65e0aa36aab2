"""The dashboard in real headless Chromium (Debian's, driven by Playwright): counts on the
overview, retry of a failed job from its page, and the CSRF guard on POSTs.

Set ``PGQUEUE_DASHBOARD_SCREENSHOT=PATH`` to save the overview screenshot there (the docs'
screenshots come from ``docs/screenshots.py``).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from playwright.sync_api import expect
from sqlalchemy.engine import URL
from support.dashboard import chromium_page, served_dashboard
from support.workers import in_thread

from pgqueue import JobState
from pgqueue.contrib.flask import PgQueue
from pgqueue.testing import run_until_final, wait_for_states
from pgqueue.worker import Worker

pgq = PgQueue()
allow_flaky = threading.Event()


@pgq.task(name="reports.build", queue="reports")
def build_report(report_id: int) -> dict[str, int]:
    return {"report": report_id}


@pgq.task(name="mail.send")
def send_mail(to: str) -> str:
    return f"sent to {to}"


@pgq.task(name="mail.flaky", max_attempts=1)
def flaky(to: str) -> str:
    if not allow_flaky.is_set():
        raise ConnectionError(f"SMTP server refused {to}")
    return f"sent to {to} at last"


@pytest.fixture
def served(database_url: URL) -> Iterator[tuple[Flask, str]]:
    with served_dashboard(
        pgq, database_url, "dashboard_test", PGQUEUE_POLL_INTERVAL=0.2
    ) as app_and_base:
        yield app_and_base


def test_dashboard_in_chromium(served: tuple[Flask, str], tmp_path: Path) -> None:
    app, base = served
    allow_flaky.clear()
    queue = pgq.state(app).queue
    with app.app_context():
        ok_ids = [send_mail.enqueue(f"user{i}@example.com") for i in range(3)]
        failed_ids = [flaky.enqueue(f"bounce{i}@example.com") for i in range(2)]
    states = run_until_final(queue, ok_ids + failed_ids, concurrency=4)
    assert [states[i] for i in ok_ids] == [JobState.SUCCEEDED] * 3
    assert [states[i] for i in failed_ids] == [JobState.FAILED] * 2
    with app.app_context():
        waiting_ids = [build_report.enqueue(i) for i in range(4)]

    with chromium_page(viewport={"width": 1280, "height": 560}) as page:
        page.goto(base + "/")

        def cell(queue_name: str, state: str) -> Any:
            return page.locator(f'tr[data-queue="{queue_name}"] td[data-state="{state}"]')

        expect(cell("default", "succeeded")).to_have_text("3")
        expect(cell("default", "failed")).to_have_text("2")
        expect(cell("default", "queued")).to_have_text("0")
        expect(cell("reports", "queued")).to_have_text("4")
        expect(cell("reports", "succeeded")).to_have_text("0")
        expect(page.locator('tr[data-queue="reports"] td.oldest')).to_contain_text(
            f"#{waiting_ids[0]}"
        )
        expect(page.locator('tr[data-queue="default"] svg.throughput')).to_have_attribute(
            "aria-label", "5 jobs finished in the last hour"
        )
        screenshot = tmp_path / "dashboard.png"
        page.screenshot(path=str(screenshot), full_page=True)
        target = os.environ.get("PGQUEUE_DASHBOARD_SCREENSHOT")
        if target:
            shutil.copyfile(screenshot, target)

        # Filter the job list down to the failed jobs and open one.
        page.click('tr[data-queue="default"] td[data-state="failed"] a')
        expect(page.locator("tr[data-job-id]")).to_have_count(2)
        page.click(f'tr[data-job-id="{failed_ids[0]}"] a')
        expect(page.locator("#job-state")).to_have_text("failed")
        expect(page.locator("pre.traceback")).to_contain_text(
            "ConnectionError: SMTP server refused bounce0@example.com"
        )

        # A POST without the CSRF token (same browser session) is rejected; nothing changes.
        rejected = page.request.post(f"{base}/jobs/{waiting_ids[0]}/cancel", form={})
        assert rejected.status == 400
        assert queue.get_job(waiting_ids[0]).state is JobState.QUEUED

        # Retry from the page while a worker runs: the page (refreshing itself) shows success.
        allow_flaky.set()
        worker = Worker(queue, queues=["default"], concurrency=2)
        with in_thread(worker):
            page.click("button.retry")
            expect(page.locator(".flash-ok")).to_contain_text("queued again")
            expect(page.locator("#job-state")).to_have_text("succeeded", timeout=30_000)
            expect(page.locator("#job-result")).to_contain_text("at last")
            wait_for_states(queue, [failed_ids[0]], {JobState.SUCCEEDED}, timeout=5)

        page.goto(base + "/")
        expect(cell("default", "succeeded")).to_have_text("4")
        expect(cell("default", "failed")).to_have_text("1")
