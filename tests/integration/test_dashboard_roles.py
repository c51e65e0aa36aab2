"""The Flask dashboard's roles, through Flask's test client on a real database: an ``access``
answer of ``Role.READ_ONLY`` or ``init_dashboard(read_only=True)`` shows the pages without any
action form and refuses every POST with 403; an access check that reads the posted form itself
leaves the body whole for the dashboard; the host links to the dashboard's pages by their
endpoint names, and a wrong method is refused after the access check."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask import Flask, request, url_for
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue import JobState
from pgqueue.contrib.flask import PgQueue
from pgqueue.dashboard import Role

pgq = PgQueue()
answer: dict[str, object] = {"role": True}


@pgq.task(name="roles.noop", queue="roles")
def noop(value: str) -> str:
    return value


def _access() -> object:
    # Reads the form first, as a host's check may (e.g. a login field of its own).
    request.form.get("anything")
    return answer["role"]


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    answer["role"] = True
    with dashboard_app(pgq, database_url, "dashboard_roles", access=_access) as flask_app:
        yield flask_app


def _token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_a_read_only_role_sees_every_page_and_cannot_act(app: Flask) -> None:
    with app.app_context():
        job_id = noop.enqueue("x")
    client = app.test_client()
    token = _token(client.get(f"/pgqueue/jobs/{job_id}").text)
    answer["role"] = Role.READ_ONLY
    for path in (f"/pgqueue/jobs/{job_id}", "/pgqueue/jobs", "/pgqueue/queues", "/pgqueue/"):
        page = client.get(path)
        assert page.status_code == 200, path
        assert 'method="post"' not in page.text, path
    # The session's valid token changes nothing: the role refuses before any action runs.
    refused = client.post(f"/pgqueue/jobs/{job_id}/cancel", data={"csrf_token": token})
    assert refused.status_code == 403
    pause = client.post("/pgqueue/queues/pause", data={"csrf_token": token, "queue": "roles"})
    assert pause.status_code == 403
    assert pgq.state(app).queue.admin.get_job(job_id).state is JobState.QUEUED
    answer["role"] = "admin"
    done = client.post(f"/pgqueue/jobs/{job_id}/cancel", data={"csrf_token": token})
    assert done.status_code == 302
    assert pgq.state(app).queue.admin.get_job(job_id).state is JobState.CANCELLED


def test_read_only_mounting_refuses_every_action(database_url: URL) -> None:
    with dashboard_app(pgq, database_url, "dashboard_read_only", read_only=True) as app:
        client = app.test_client()
        page = client.get("/pgqueue/queues")
        assert page.status_code == 200
        assert "roles" in page.text and 'method="post"' not in page.text
        assert client.post("/pgqueue/queues/pause", data={"queue": "roles"}).status_code == 403


def test_the_host_links_by_endpoint_and_the_access_check_comes_first(app: Flask) -> None:
    with app.test_request_context():
        assert url_for("pgqueue_dashboard.overview") == "/pgqueue/"
        assert url_for("pgqueue_dashboard.job_detail", job_id=7) == "/pgqueue/jobs/7"
        assert url_for("pgqueue_dashboard.job_list", state="failed") == "/pgqueue/jobs?state=failed"
        assert url_for("pgqueue_dashboard.static", filename="pgqueue.css") == (
            "/pgqueue/static/pgqueue.css"
        )
    client = app.test_client()
    assert client.post("/pgqueue/jobs").status_code == 405
    assert client.get("/pgqueue/jobs/x").status_code == 404
    answer["role"] = False
    for refused in (client.post("/pgqueue/jobs"), client.get("/pgqueue/nowhere")):
        assert refused.status_code == 403
        assert refused.headers["X-Frame-Options"] == "DENY"
