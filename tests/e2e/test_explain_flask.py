"""Explain in a Flask app: the job page's "Why isn't this job running?" box in real headless
Chromium (a job of a paused queue scheduled for later lists both blockers, in the claim's
order, with the time; resuming the queue drops that line on the page's next refresh; a
finished job has no box), and ``flask pgqueue explain`` against the example app."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from flask import Flask
from playwright.sync_api import expect
from sqlalchemy.engine import URL
from support.dashboard import chromium_page, served_dashboard
from test_flask_cli import _env as example_env
from test_flask_cli import flask

from pgqueue.contrib.flask import PgQueue
from pgqueue.testing import run_until_final

pgq = PgQueue()


@pgq.task(name="invoices.send", queue="invoices")
def send_invoice(number: int) -> int:
    return number


@pytest.fixture
def served(database_url: URL) -> Iterator[tuple[Flask, str]]:
    with served_dashboard(pgq, database_url, "explain_dashboard") as app_and_base:
        yield app_and_base


def test_job_page_names_the_blockers(served: tuple[Flask, str]) -> None:
    app, base = served
    queue = pgq.state(app).queue
    with app.app_context():
        later = send_invoice.configure(delay=7200).enqueue(1)
        done = send_invoice.enqueue(2)
    run_until_final(queue, [done])
    queue.pause_queue("invoices")
    run_at = queue.get_job(later).run_at.astimezone(dt.UTC)

    with chromium_page() as page:
        page.goto(f"{base}/jobs/{later}")
        box = page.locator("#job-explain")
        expect(box.locator("h2")).to_have_text("Why isn't this job running?")
        items = box.locator("li.blocker")
        expect(items.nth(0)).to_have_attribute("data-kind", "scheduled")
        expect(items.nth(0)).to_contain_text(f"{run_at:%Y-%m-%d %H:%M:%S} UTC")
        expect(items.nth(1)).to_have_attribute("data-kind", "paused")
        expect(items.nth(1)).to_contain_text("queue invoices is paused")

        queue.resume_queue("invoices")
        # The page refreshes itself every 2 s while the job is not finished.
        expect(box.locator('li[data-kind="paused"]')).to_have_count(0, timeout=10_000)
        expect(box.locator('li[data-kind="scheduled"]')).to_have_count(1)

        page.goto(f"{base}/jobs/{done}")
        expect(page.locator("#job-state")).to_have_text("succeeded")
        expect(page.locator("#job-explain")).to_have_count(0)


def test_flask_pgqueue_explain_names_the_paused_queue(database_url: URL) -> None:
    env = example_env(database_url)
    flask(["pgqueue", "pause", "mail", "--new"], env)
    out = flask(["pgqueue", "enqueue", "orders.tasks.send_receipt", "--args", "[1]"], env).stdout
    job_id = int(out.strip())
    lines = flask(["pgqueue", "explain", str(job_id)], env).stdout.splitlines()
    assert lines[0] == f"job {job_id} (orders.tasks.send_receipt, queue mail): queued"
    assert lines[1] == (
        "  paused: queue mail is paused: `flask pgqueue resume mail` lets workers claim it again"
    )
    data = json.loads(flask(["pgqueue", "explain", str(job_id), "--json"], env).stdout)
    assert data["blockers"][0]["kind"] == "paused"
