"""The dashboard while its database cannot be reached (a server down, restarting, failing
over): every page answers 503 with the reason, naming where the connection went, and a
``Retry-After``, not a 500 and a traceback; the live fragments too, so the polling backs off."""

from __future__ import annotations

import pytest
from support.network import free_port
from werkzeug.test import Client

from pgqueue import PgQueue
from pgqueue.dashboard import Dashboard

PAGES = [
    "/",
    "/?fragment=overview",
    "/jobs",
    "/jobs/1",
    "/queues",
    "/workers",
    "/schedules",
    "/audit",
    "/workflows/1",
]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_answers_503_naming_the_unreachable_database(page: str) -> None:
    port = free_port()
    queue = PgQueue(f"postgresql+psycopg://pgqueue:secret@127.0.0.1:{port}/jobs")
    try:
        client = Client(Dashboard(queue, secret_key="test", public=True))
        response = client.get(page)
        assert response.status_code == 503, response.text
        assert f"127.0.0.1:{port}/jobs" in response.text
        assert "cannot be reached" in response.text
        assert "secret" not in response.text
        assert response.headers["Retry-After"] == "5"
    finally:
        queue.dispose()
