"""The dashboard's pages only read, so a read replica can serve them; its actions write.

The database is made read-only for new sessions (``default_transaction_read_only``, which
refuses writes as a hot standby does): every page renders from it, and an action is refused
by the server and changes nothing. docs/how-to/scaling.md says which connections must stay on the
primary on this evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask import Flask
from server_databases import admin_engine
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue import JobState
from pgqueue.contrib.flask import PgQueue

pgq = PgQueue()


@pgq.task(name="replica.work", queue="replica", max_attempts=1)
def work(n: int) -> int:
    if n < 0:
        raise ValueError("negative")
    return n


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    with dashboard_app(pgq, database_url, "replica") as flask_app:
        yield flask_app


def _read_only(server_url: URL, database: str, on: bool) -> None:
    admin = admin_engine(server_url)
    try:
        with admin.connect() as connection:
            # The name is the test database's own (pgqueue_test_<pid>_<n>), never input.
            connection.execute(
                text(
                    f'ALTER DATABASE "{database}" SET default_transaction_read_only = '
                    + ("on" if on else "off")
                )
            )
    finally:
        admin.dispose()


def test_every_page_renders_read_only_and_an_action_is_refused(
    app: Flask, server_url: URL, database_url: URL, engine: Engine
) -> None:
    with app.app_context():
        done = work.enqueue(1)
        failed = work.enqueue(-1)
        pgq.state(app).queue.run_worker(drain=True)
        waiting = work.enqueue(2)
        queue = pgq.state(app).queue
    assert database_url.database is not None
    _read_only(server_url, database_url.database, True)
    queue.dispose()  # the next sessions start read-only
    try:
        client = app.test_client()
        pages = [
            "/pgqueue/",
            "/pgqueue/jobs",
            "/pgqueue/jobs?state=failed",
            "/pgqueue/jobs?queue=replica&task=replica.work",
            f"/pgqueue/jobs/{done}",
            f"/pgqueue/jobs/{failed}",
            f"/pgqueue/jobs/{waiting}",
            "/pgqueue/queues",
            "/pgqueue/workers",
        ]
        statuses = {page: client.get(page).status_code for page in pages}
        assert statuses == dict.fromkeys(pages, 200)
        with queue.engine.connect() as connection:
            assert connection.execute(text("SHOW transaction_read_only")).scalar() == "on"

        page = client.get(f"/pgqueue/jobs/{failed}")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        csrf = {"csrf_token": token.group(1)}
        # A bulk action's preview (its dry run) only counts; the action itself writes.
        bulk = {"state": "failed", "action": "retry", **csrf}
        preview = client.post("/pgqueue/jobs/bulk", data=bulk)
        assert preview.status_code == 200
        assert "1 job" in preview.text
        retry = client.post(f"/pgqueue/jobs/{failed}/retry", data=csrf)
        assert retry.status_code == 500  # the server refused the write
        confirmed = client.post(
            "/pgqueue/jobs/bulk", data={**bulk, "step": "confirm", "expected_count": "1"}
        )
        assert confirmed.status_code == 500
    finally:
        _read_only(server_url, database_url.database, False)
    with engine.connect() as connection:
        state = connection.execute(
            text("SELECT state FROM pgqueue_jobs WHERE id = :id"), {"id": failed}
        ).scalar()
    assert state == JobState.FAILED.value
