"""The dashboard's workflow page in real headless Chromium: reached from a member's job page,
it draws a chord in stages (the members, then the callback that waits on them), with each
member's state and what the callback still waits on; once the workflow ends, the page shows
its state and result by itself."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from playwright.sync_api import expect
from sqlalchemy.engine import URL
from support.dashboard import chromium_page, served_dashboard
from support.workers import in_thread

from pgqueue import JobState, chord
from pgqueue.contrib.flask import PgQueue
from pgqueue.dashboard.workflow_view import STAGE_SHOWN
from pgqueue.testing import wait_for_states
from pgqueue.worker import Worker

pgq = PgQueue()
release = threading.Event()


@pgq.task(name="parts.fetch", queue="parts")
def fetch(n: int) -> int:
    if n == 0:
        release.wait(60)  # one member runs until the test lets it go
    return n


@pgq.task(name="parts.merge", queue="parts")
def merge(results: list[int]) -> int:
    return sum(results)


@pytest.fixture
def served(database_url: URL) -> Iterator[tuple[Flask, str]]:
    release.clear()
    with served_dashboard(pgq, database_url, "dashboard_workflow_browser") as app_and_base:
        yield app_and_base
    release.set()


def test_workflow_page_in_a_browser(served: tuple[Flask, str], tmp_path: Path) -> None:
    app, base = served
    queue = pgq.state(app).queue
    members = STAGE_SHOWN + 5
    with app.app_context():
        workflow = chord([fetch.s(n) for n in range(members)], merge.s()).enqueue()
    status = queue.get_workflow(workflow.id)
    first = min(job.id for job in status.jobs)
    worker = Worker(queue, queues=["parts"], concurrency=4, maintenance=False)
    with in_thread(worker, before_stop=release.set):
        callback = max(job.id for job in status.jobs)
        wait_for_states(queue, [first], {JobState.RUNNING}, timeout=30)
        others = [job.id for job in status.jobs if job.id not in (first, callback)]
        wait_for_states(queue, others, {JobState.SUCCEEDED}, timeout=60)
        with chromium_page(viewport={"width": 1280, "height": 600}) as page:
            page.goto(f"{base}/jobs/{first}")
            page.click("#job-workflow")
            expect(page.locator("#workflow-state")).to_have_text("running")
            stages = page.locator(".workflow-stage")
            expect(stages).to_have_count(2)
            expect(stages.nth(0).locator(".workflow-member")).to_have_count(STAGE_SHOWN)
            expect(stages.nth(0).locator(".workflow-hidden")).to_have_text(
                f"and {members - STAGE_SHOWN} more"
            )
            expect(page.locator(f'[data-job="{first}"]')).to_have_attribute("data-state", "running")
            waiting = page.locator(f'[data-job="{callback}"]')
            expect(waiting).to_have_attribute("data-state", "waiting")
            expect(waiting.locator(".waits-on")).to_have_text(f"waits on #{first}")
            expect(page.locator("#workflow-counts")).to_contain_text(f"{members - 1} succeeded")
            page.screenshot(path=str(tmp_path / "dashboard-workflow.png"), full_page=True)

            release.set()
            queue.wait_for_workflow(workflow.id, timeout=60)
            # The page refreshes itself every 2 s until the workflow ends; a reload of our own
            # would race that navigation.
            expect(page.locator("#workflow-state")).to_have_text("succeeded", timeout=15_000)
            expect(page.locator("#workflow-result")).to_have_text(str(sum(range(members)) - 0))
