"""The dashboard's Workers page and the worker named on a running job's page, with a real
worker (in a thread) on a real database, through Flask's test client."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest
from flask import Flask
from sqlalchemy import text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.polling import wait_until
from support.workers import in_thread

from pgqueue.contrib.flask import PgQueue
from pgqueue.worker import Worker

pgq = PgQueue()
release = threading.Event()


@pgq.task(name="workers_page.hold", queue="held")
def hold() -> None:
    release.wait(30)


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    release.clear()
    with dashboard_app(pgq, database_url, "dashboard_workers") as served:
        yield served
    release.set()


def test_workers_page_lists_the_registry_and_the_job_page_names_the_holder(app: Flask) -> None:
    queue = pgq.state(app).queue
    with app.app_context():
        job_id = hold.enqueue()
    worker = Worker(
        queue, queues=["held", "other"], concurrency=4, lease_seconds=60, maintenance=False
    )
    with in_thread(worker, before_stop=release.set):
        wait_until(lambda: queue.get_job(job_id).state == "running", 20, "the job to run")
        with queue.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version, "
                    "last_seen_at) VALUES ('<b>gone</b>', 'old-host', 4242, '{}', 2, '0.0.1', "
                    "now() - interval '1 hour')"
                )
            )
        client = app.test_client()
        overview = client.get("/pgqueue/")
        assert 'href="/pgqueue/workers"' in overview.text

        page = client.get("/pgqueue/workers")
        assert page.status_code == 200
        assert page.headers["X-Frame-Options"] == "DENY"
        html = page.text
        live_row = html.split(f'data-worker-id="{worker.worker_id}"')[1].split("</tr>")[0]
        for cell in (
            socket.gethostname(),
            f'<td class="num">{os.getpid()}</td>',
            "held, other",
            '<td class="num">4</td>',  # concurrency
            'href="/pgqueue/jobs?state=running">1</a>',  # running jobs
            "s ago",
        ):
            assert cell in live_row, cell
        assert "stale" not in live_row
        # A stale row is shown as such, its id escaped.
        stale_row = html.split('data-worker-id="&lt;b&gt;gone&lt;/b&gt;"')[1].split("</tr>")[0]
        assert 'class="stale"' in html and "stale</span>" in stale_row and "old-host" in stale_row
        assert "<b>gone</b>" not in html

        detail = client.get(f"/pgqueue/jobs/{job_id}").text
        held_by = detail.split('id="job-holder">')[1].split("</dd>")[0]
        assert worker.worker_id in held_by
        assert f"host {socket.gethostname()}, pid {os.getpid()}, last seen" in held_by

        with queue.engine.begin() as connection:
            connection.execute(text("DELETE FROM pgqueue_workers"))
        gone = client.get(f"/pgqueue/jobs/{job_id}").text
        assert "not registered: the worker is gone" in gone.split('id="job-holder">')[1]
    assert "No worker is running." in app.test_client().get("/pgqueue/workers").text


def test_workers_page_shows_a_worker_whose_claims_fail_as_unhealthy(app: Flask) -> None:
    queue = pgq.state(app).queue
    with queue.engine.begin() as connection:
        insert = (
            "INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version,"
            " last_seen_at, claim_error, claim_failing_since) VALUES (:id, 'h', 1, '{}', 2,"
            " '0.1', now(), :error, now() - make_interval(secs => :failing))"
        )
        connection.execute(
            text(insert),
            {"id": "failing", "error": "InsufficientPrivilege: <no> claims", "failing": 42},
        )
        connection.execute(text(insert), {"id": "healthy", "error": None, "failing": 0})
        connection.execute(
            text("UPDATE pgqueue_workers SET claim_failing_since = NULL WHERE id = 'healthy'")
        )
    html = app.test_client().get("/pgqueue/workers").text

    def health(worker_id: str) -> str:
        row = html.split(f'data-worker-id="{worker_id}"')[1].split("</tr>")[0]
        return row.split('<td class="health">')[1].split("</td>")[0]

    failing = health("failing")
    assert "claims failing</span> for 4" in failing  # 42 s, however the age is worded
    assert "InsufficientPrivilege: &lt;no&gt; claims" in failing
    assert "<no>" not in html
    assert health("healthy") == "ok"
