"""Screenshots of the dashboard for the docs: a demo database on the embedded PostgreSQL, the
dashboard served standalone (``pgqueue dashboard``), and a PNG of each of its pages.

Run from the repository root (needs the ``dashboard`` and ``test`` extras and Debian's
``chromium``):

    python docs/screenshots.py

It starts a throwaway embedded server, runs real jobs through a real worker (mail that
succeeds, reports, a billing task that times out twice, then fails the same way three times,
image jobs still running under their queue's limit, a workflow half done), spreads the finished
jobs' timestamps over the last hour so the chart has a history to show (the only hand-edited
data), pauses one queue, limits another, then serves it with ``pgqueue dashboard --no-auth`` on
a loopback port. The pages are those of the dashboard's route map (every GET page, so a page
added later gets its picture), plus a bulk retry's preview, each written to
``docs/images/dashboard/`` at a 1280x800 viewport.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Page, sync_playwright
from sqlalchemy import text

from pgqueue import PgQueue, backoff
from pgqueue.dashboard.app import Dashboard
from pgqueue.embedded import EmbeddedPostgres
from pgqueue.testing import run_until_final
from pgqueue.worker import Worker
from pgqueue.workflows import chain

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "images" / "dashboard"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}
# File names of the pages the docs show; any other page is named after its endpoint.
NAMES = {
    "overview": "overview",
    "job_list": "jobs",
    "queue_list": "queues",
    "worker_list": "workers",
    "workflow_detail": "workflow",
}
# Each finished job moved back in time whole (its times and its errors' times by one offset, so
# their order holds), to finish at a spread point of the last hour.
SPREAD_SQL = text(
    """UPDATE pgqueue_jobs AS j
       SET created_at = j.created_at - s.d, run_at = j.run_at - s.d,
           started_at = j.started_at - s.d, finished_at = j.finished_at - s.d,
           updated_at = j.updated_at - s.d,
           errors = (SELECT coalesce(jsonb_agg(CASE WHEN e ? 'at' THEN jsonb_set(
                         e, '{at}', to_jsonb((e->>'at')::timestamptz - s.d)) ELSE e END
                         ORDER BY n), '[]'::jsonb)
                     FROM jsonb_array_elements(j.errors) WITH ORDINALITY AS x(e, n))
       FROM (SELECT id,
                    finished_at - (now() - ((id * 7919) % 3500 || ' seconds')::interval) AS d
               FROM pgqueue_jobs WHERE finished_at IS NOT NULL) AS s
       WHERE j.id = s.id"""
)

tries: dict[str, int] = {}


def send_mail(to: str) -> str:
    return f"sent to {to}"


def build_report(report_id: int) -> dict[str, int]:
    return {"report": report_id, "rows": report_id * 37}


def charge(customer: str, cents: int) -> None:
    tries[customer] = tries.get(customer, 0) + 1
    if tries[customer] <= 2:
        raise TimeoutError(f"payment gateway did not answer within 30 s ({customer})")
    raise ConnectionError(f"payment gateway refused the connection for {customer}")


def resize(path: str) -> str:
    time.sleep(6)
    return path


def register(pgq: PgQueue) -> None:
    pgq.task(name="mail.send")(send_mail)
    pgq.task(name="reports.build", queue="reports")(build_report)
    pgq.task(name="billing.charge", queue="billing", max_attempts=5, retry=backoff.constant(0))(
        charge
    )
    pgq.task(name="images.resize", queue="images")(resize)


@contextlib.contextmanager
def embedded_database() -> Iterator[str]:
    """A throwaway embedded server's database URL, stopped and removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="pgqueue-screenshots-"))
    # As root the server runs as another user, which must reach its data directory.
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "data", durable=False)
    server.start()
    try:
        yield server.url()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def fill(pgq: PgQueue) -> dict[str, list[int]]:
    """Run the demo jobs; returns the ids to show: a billing job that failed five times, an
    image job that waits for its queue's limit, and a workflow."""
    pgq.migrate()
    tasks = pgq.registry
    mail = tasks.get("mail.send").enqueue_many([[f"user{i}@example.com"] for i in range(420)])
    reports = tasks.get("reports.build").enqueue_many([[i] for i in range(60)])
    failing = tasks.get("billing.charge").enqueue_many([[f"cus_{i:04d}", 1999] for i in range(4)])
    run_until_final(pgq, mail + reports + failing, concurrency=8, timeout=120)
    with pgq.engine.begin() as connection:
        connection.execute(SPREAD_SQL)
    tasks.get("reports.build").enqueue_many([[i] for i in range(60, 85)])
    tasks.get("mail.send").enqueue_many([[f"late{i}@example.com"] for i in range(12)])
    images = tasks.get("images.resize").enqueue_many([[f"/uploads/{i}.jpg"] for i in range(6)])
    flow = chain(
        tasks.get("mail.send").si("ops@example.com"),
        tasks.get("reports.build").si(99),
        tasks.get("mail.send").si("finance@example.com"),
    ).enqueue()
    run_until_final(pgq, [flow.job_ids[0]], timeout=60)
    pgq.admin.pause_queue("reports")
    pgq.admin.set_queue_limit("images", 2)
    return {"job_id": [failing[0], images[-1]], "workflow_id": [flow.id]}


@contextlib.contextmanager
def standalone(url: str) -> Iterator[str]:
    """``pgqueue dashboard --no-auth`` on a free loopback port; yields its address."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "dashboard", "--bind", "127.0.0.1:0", "--no-auth"],
        env={**os.environ, "PGQUEUE_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 60
    try:
        while selector.select(timeout=max(deadline - time.monotonic(), 0)):
            line = process.stdout.readline()
            if not line:
                break
            found = re.match(r"pgqueue dashboard on (http://127\.0\.0\.1:\d+)/$", line.strip())
            if found:
                yield found.group(1)
                return
        raise SystemExit("pgqueue dashboard printed no address")
    finally:
        process.terminate()
        process.wait(timeout=30)


def pages(pgq: PgQueue, ids: dict[str, list[int]]) -> list[tuple[str, str]]:
    """(file name, path) of every GET page of the dashboard's route map."""
    url_map = Dashboard(pgq, secret_key=secrets.token_hex(16), public=True).url_map
    adapter = url_map.bind("dashboard.invalid")
    shots = []
    for rule in url_map.iter_rules():
        if "GET" not in (rule.methods or ()) or rule.endpoint == "static":
            continue
        name = NAMES.get(rule.endpoint, rule.endpoint.replace("_", "-"))
        if not rule.arguments:
            shots.append((name, adapter.build(rule.endpoint)))
        elif rule.endpoint == "job_detail":
            failed, waiting = ids["job_id"]
            shots += [("job-errors", f"/jobs/{failed}"), ("job-waiting", f"/jobs/{waiting}")]
        elif set(rule.arguments) <= set(ids):
            values = {a: ids[a][0] for a in rule.arguments}
            shots.append((name, adapter.build(rule.endpoint, values)))
        else:
            print(f"skipped {rule.rule}: no demo value for {sorted(rule.arguments)}")
    return shots


def shoot(base: str, shots: list[tuple[str, str]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            for name, path in shots:
                page.goto(base + path)
                save(page, name)
            page.goto(base + "/jobs?state=failed")
            page.select_option("details.bulk select[name=action]", "retry")
            page.fill("details.bulk input[name=error_contains]", "refused the connection")
            with page.expect_navigation():
                page.click("details.bulk button[type=submit]")
            save(page, "bulk-preview")
        finally:
            browser.close()


def save(page: Page, name: str) -> None:
    path = OUT / f"{name}.png"
    page.screenshot(path=str(path))
    print(f"wrote {path.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.parse_args()
    with embedded_database() as url:
        pgq = PgQueue(url)
        register(pgq)
        try:
            ids = fill(pgq)
            worker = Worker(pgq, queues=["images", "default"], concurrency=4)
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            time.sleep(2)  # the image jobs are running, two at a time (the limit)
            try:
                with standalone(url) as base:
                    shoot(base, pages(pgq, ids))
            finally:
                worker.stop()
                thread.join(timeout=30)
        finally:
            pgq.dispose()


if __name__ == "__main__":
    main()
