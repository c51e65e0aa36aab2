"""Screenshots of the Flask dashboard for the docs, from a demo queue with realistic data.

Run from the repository root (needs Debian's ``postgresql`` and ``chromium`` packages and the
``test`` extra):

    python docs/screenshots.py

It starts a throwaway PostgreSQL (``tests/debian_postgres.py``; or pass ``--database-url`` of an
empty database), migrates it, runs real jobs through a real worker (mail that succeeds, reports,
a billing task that times out twice, then fails the same way three times, image jobs still running), spreads the
finished jobs' timestamps over the last hour so the chart has a history to show (the only
hand-edited data), pauses one queue, limits another, and writes PNGs of the overview, the job
list, a failed job's page, a waiting job's "why isn't it running" box, the queue controls, the
workers page and a bulk retry's preview to ``docs/screenshots/``.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from flask import Flask
from playwright.sync_api import sync_playwright
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from pgqueue import backoff
from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.testing import run_until_final
from pgqueue.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from dashboard_app import serving  # noqa: E402  (a test helper, found through the path above)

OUT = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
SPREAD_SQL = text(
    """UPDATE pgqueue_jobs
       SET finished_at = now() - ((id * 7919) % 3500 || ' seconds')::interval,
           started_at = now() - ((id * 7919) % 3500 || ' seconds')::interval
                        - ((id % 40) * 0.05 + 0.02 || ' seconds')::interval
       WHERE finished_at IS NOT NULL"""
)

pgq = PgQueue()


@pgq.task(name="mail.send")
def send_mail(to: str) -> str:
    return f"sent to {to}"


@pgq.task(name="reports.build", queue="reports")
def build_report(report_id: int) -> dict[str, int]:
    return {"report": report_id, "rows": report_id * 37}


tries: dict[str, int] = {}


@pgq.task(name="billing.charge", queue="billing", max_attempts=5, retry=backoff.constant(0))
def charge(customer: str, cents: int) -> None:
    tries[customer] = tries.get(customer, 0) + 1
    if tries[customer] <= 2:
        raise TimeoutError(f"payment gateway did not answer within 30 s ({customer})")
    raise ConnectionError(f"payment gateway refused the connection for {customer}")


@pgq.task(name="images.resize", queue="images")
def resize(path: str) -> str:
    time.sleep(6)
    return path


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """``url``, or a database on a throwaway server stopped on exit."""
    if url:
        yield url
        return
    root = Path(tempfile.mkdtemp(prefix="pgqueue-screenshots-"))
    script = str(ROOT / "tests" / "debian_postgres.py")
    started = subprocess.run(
        [sys.executable, script, "start", str(root)], check=True, capture_output=True, text=True
    )
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run([sys.executable, script, "stop", str(root)], check=True)


def fill(app: Flask) -> tuple[int, int]:
    """Run the demo jobs; returns the ids of a billing job that failed five times and of an
    image job that waits for its queue's limit."""
    queue = pgq.state(app).queue
    queue.migrate()
    with app.app_context():
        mail = send_mail.enqueue_many([[f"user{i}@example.com"] for i in range(420)])
        reports = build_report.enqueue_many([[i] for i in range(60)])
        failing = charge.enqueue_many([[f"cus_{i:04d}", 1999] for i in range(4)])
    run_until_final(queue, mail + reports + failing, concurrency=8, timeout=120)
    engine = create_engine(make_url(app.config["PGQUEUE_DATABASE_URL"]))
    with engine.begin() as connection:
        connection.execute(SPREAD_SQL)
    engine.dispose()
    with app.app_context():
        build_report.enqueue_many([[i] for i in range(60, 85)])
        send_mail.enqueue_many([[f"late{i}@example.com"] for i in range(12)])
        images = resize.enqueue_many([[f"/uploads/{i}.jpg"] for i in range(6)])
    queue.admin.pause_queue("reports")
    queue.admin.set_queue_limit("images", 2)
    return failing[0], images[-1]


def shoot(base: str, failed_job: int, waiting_job: int) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            for name, path in [
                ("overview", "/"),
                ("jobs", "/jobs"),
                ("job-errors", f"/jobs/{failed_job}"),
                ("job-waiting", f"/jobs/{waiting_job}"),
                ("queues", "/queues"),
                ("workers", "/workers"),
            ]:
                page.goto(base + path)
                page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
                print(f"wrote {OUT / f'{name}.png'}")
            page.goto(base + "/jobs?state=failed")
            page.select_option("details.bulk select[name=action]", "retry")
            page.fill("details.bulk input[name=error_contains]", "refused the connection")
            page.click("details.bulk button[type=submit]")
            page.screenshot(path=str(OUT / "bulk-preview.png"), full_page=True)
            print(f"wrote {OUT / 'bulk-preview.png'}")
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an empty database (default: a throwaway server)")
    args = parser.parse_args()
    with database(args.database_url) as url:
        app = Flask("pgqueue_screenshots")
        app.config.update(
            SECRET_KEY=secrets.token_hex(16), PGQUEUE_DATABASE_URL=url, PGQUEUE_POLL_INTERVAL=0.2
        )
        pgq.init_app(app)
        init_dashboard(app, public=True)
        queue = pgq.state(app).queue
        try:
            failed_job, waiting_job = fill(app)
            worker = Worker(queue, queues=["images", "default"], concurrency=4)
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            time.sleep(2)  # the image jobs are running, two at a time (the limit)
            try:
                with serving(app) as base:
                    shoot(base + "/pgqueue", failed_job, waiting_job)
            finally:
                worker.stop()
                thread.join(timeout=30)
        finally:
            queue.dispose()


if __name__ == "__main__":
    main()
