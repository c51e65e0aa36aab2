"""The dashboard's Workers page in real headless Chromium: reached from the header, it lists
two running workers with their running jobs, and leads to the job whose page names its holder.

Set ``PGQUEUE_WORKERS_SCREENSHOT=docs/dashboard-workers.png`` to save the page's screenshot.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from flask import Flask
from playwright.sync_api import expect
from sqlalchemy.engine import URL
from support.dashboard import chromium_page, served_dashboard
from support.workers import in_thread

from pgqueue import JobState
from pgqueue.contrib.flask import PgQueue
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

pgq = PgQueue()
release = threading.Event()


@pgq.task(name="mail.send", queue="mail")
def send() -> None:
    release.wait(60)


@pytest.fixture
def served(database_url: URL) -> Iterator[tuple[Flask, str]]:
    release.clear()
    with served_dashboard(pgq, database_url, "dashboard_workers_browser") as app_and_base:
        yield app_and_base
    release.set()


def test_workers_page_in_a_browser(served: tuple[Flask, str], tmp_path: Path) -> None:
    app, base = served
    queue = pgq.state(app).queue
    with app.app_context():
        job_id = send.enqueue()
    workers = [
        Worker(queue, queues=["mail"], concurrency=4, lease_seconds=60, maintenance=False),
        Worker(queue, queues=["reports", "exports"], concurrency=8, maintenance=False),
    ]
    with ExitStack() as running_workers:
        for worker in workers:
            running_workers.enter_context(in_thread(worker, before_stop=release.set))
        wait_for_states(queue, [job_id], {JobState.RUNNING}, timeout=30)
        with chromium_page(viewport={"width": 1280, "height": 420}) as page:
            page.goto(base + "/")
            page.click("header nav >> text=Workers")
            expect(page.locator("tr[data-worker-id]")).to_have_count(2)
            mail = page.locator(f'tr[data-worker-id="{workers[0].worker_id}"]')
            reports = page.locator(f'tr[data-worker-id="{workers[1].worker_id}"]')
            expect(mail).to_contain_text(socket.gethostname())
            expect(mail.locator("td").nth(2)).to_have_text(str(os.getpid()))
            expect(mail.locator("td").nth(3)).to_have_text("mail")
            expect(mail.locator("td").nth(5)).to_have_text("threads")
            expect(mail.locator("td").nth(6)).to_have_text("1")
            expect(reports.locator("td").nth(3)).to_have_text("reports, exports")
            expect(reports.locator("td").nth(4)).to_have_text("8")
            expect(reports.locator("td").nth(6)).to_have_text("0")
            screenshot = tmp_path / "dashboard-workers.png"
            page.screenshot(path=str(screenshot), full_page=True)
            target = os.environ.get("PGQUEUE_WORKERS_SCREENSHOT")
            if target:
                shutil.copyfile(screenshot, target)

            # The running count leads to the running jobs, and the job names its worker.
            mail.locator("td").nth(6).locator("a").click()
            page.click(f'tr[data-job-id="{job_id}"] a')
            expect(page.locator("#job-holder")).to_contain_text(workers[0].worker_id)
            expect(page.locator("#job-holder")).to_contain_text(
                f"host {socket.gethostname()}, pid {os.getpid()}, last seen"
            )
