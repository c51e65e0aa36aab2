"""The dashboard's response headers and CSRF check, through Flask's test client on a real
database: every response (pages, actions, errors, the stylesheet) forbids framing, caching
and content sniffing under a strict Content-Security-Policy, and a forged token of any
characters is a 400, never a crash."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue import JobState
from pgqueue.contrib.flask import PgQueue

pgq = PgQueue()
allowed = {"yes": True}


@pgq.task(name="security.noop", queue="sec")
def noop(value: str) -> str:
    return value


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    with dashboard_app(
        pgq, database_url, "dashboard_security", access=lambda: allowed["yes"]
    ) as app:
        yield app


def _assert_headers(response: object, what: str) -> None:
    headers = response.headers  # type: ignore[attr-defined]
    assert headers.get("X-Frame-Options") == "DENY", what
    assert headers.get("X-Content-Type-Options") == "nosniff", what
    assert headers.get("Cache-Control") == "no-store", what
    policy = headers.get("Content-Security-Policy", "")
    directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ") if d}
    assert directives.get("frame-ancestors") == ["'none'"], what
    assert directives.get("default-src") == ["'none'"], what
    assert directives.get("script-src") == ["'self'"], what  # live.js, nothing inline
    assert directives.get("connect-src") == ["'self'"], what  # its fragment requests
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, what


def _token(client: FlaskClient, job_id: int) -> str:
    page = client.get(f"/pgqueue/jobs/{job_id}")
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def test_every_dashboard_response_carries_the_security_headers(app: Flask) -> None:
    with app.app_context():
        job_id = noop.enqueue("x")
    client = app.test_client()
    token = _token(client, job_id)
    responses = {
        "overview": client.get("/pgqueue/"),
        "job list": client.get("/pgqueue/jobs"),
        "filtered list": client.get("/pgqueue/jobs?queue=sec&state=queued&task=security.noop"),
        "bad filter": client.get("/pgqueue/jobs?state=nonsense"),
        "job": client.get(f"/pgqueue/jobs/{job_id}"),
        "missing job": client.get("/pgqueue/jobs/999999"),
        "stylesheet": client.get("/pgqueue/static/pgqueue.css"),
        "forged action": client.post(f"/pgqueue/jobs/{job_id}/cancel", data={"csrf_token": "x"}),
        "action": client.post(f"/pgqueue/jobs/{job_id}/cancel", data={"csrf_token": token}),
        "unknown action": client.post(
            f"/pgqueue/jobs/{job_id}/nonsense", data={"csrf_token": token}
        ),
    }
    allowed["yes"] = False
    try:
        responses["refused"] = client.get("/pgqueue/")
    finally:
        allowed["yes"] = True
    statuses = {what: r.status_code for what, r in responses.items()}
    assert statuses == {
        "overview": 200,
        "job list": 200,
        "filtered list": 200,
        "bad filter": 400,
        "job": 200,
        "missing job": 404,
        "stylesheet": 200,
        "forged action": 400,
        "action": 302,
        "unknown action": 404,
        "refused": 403,
    }
    for what, response in responses.items():
        _assert_headers(response, what)
        response.close()


@pytest.mark.parametrize(
    "forged",
    # Percent-encoded form bodies: non-ASCII UTF-8, and bytes that are not UTF-8 at all.
    [quote("é" * 43), quote("\u202e" + "a" * 42), quote("令牌"), "%ff%fe%fd"],
)
def test_non_ascii_csrf_token_is_refused_not_a_server_error(app: Flask, forged: str) -> None:
    with app.app_context():
        job_id = noop.enqueue("x")
    client = app.test_client()
    _token(client, job_id)  # the session now holds a real token
    response = client.post(
        f"/pgqueue/jobs/{job_id}/cancel",
        data=f"csrf_token={forged}",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 400
    assert pgq.state(app).queue.get_job(job_id).state is JobState.QUEUED


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("queue=a%00b", "queue must not contain a NUL character"),
        ("task=%00", "task must not contain a NUL character"),
        ("state=failed&queue=%00", "queue must not contain a NUL character"),
        ("before=99999999999999999999", "before must be a job id from 0 to"),
        ("after=-1", "after must be a job id from 0 to"),
        ("before=ten", "before must be a job id, got &#39;ten&#39;"),
    ],
)
def test_bad_filter_values_are_a_clear_400_not_a_server_error(
    app: Flask, query: str, message: str
) -> None:
    response = app.test_client().get(f"/pgqueue/jobs?{query}")
    assert response.status_code == 400
    assert message in response.text


def test_job_id_beyond_bigint_is_not_found(app: Flask) -> None:
    assert app.test_client().get("/pgqueue/jobs/99999999999999999999").status_code == 404
