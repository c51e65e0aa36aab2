"""The dashboard mounted in a FastAPI app (``pgqueue.dashboard.asgi.asgi_app``), called
in-process through httpx's ASGI transport on a real database: its pages, the host's access check
(sync or async; 401 it raises, 403 when it refuses), the CSRF refusal, an action's audit record
naming the actor, and the read-only role."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import URL
from werkzeug.datastructures import WWWAuthenticate
from werkzeug.exceptions import Unauthorized

from pgqueue import JobState, PgQueue
from pgqueue.dashboard import DashboardRequest, Role
from pgqueue.dashboard.asgi import asgi_app

BASE = "http://service.test"


@pytest.fixture
def pgq(database_url: URL) -> Iterator[PgQueue]:
    queue = PgQueue(database_url)
    queue.task(name="asgi.noop", queue="asgi-q")(_noop)
    yield queue
    queue.dispose()


def _noop(value: str) -> str:
    return value


def _enqueue(pgq: PgQueue, value: str) -> int:
    return pgq.registry.get("asgi.noop").enqueue(value)


def _serve(pgq: PgQueue, **options: Any) -> FastAPI:
    app = FastAPI()
    app.mount("/pgqueue", asgi_app(pgq, secret_key="test-secret", **options))
    return app


def _run(app: FastAPI, scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 4567))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            await scenario(client)

    asyncio.run(main())


def _token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_every_page_renders_under_the_mount_with_the_dashboard_headers(pgq: PgQueue) -> None:
    job_id = _enqueue(pgq, "<b>x</b>")
    seen: list[DashboardRequest] = []

    def access(request: DashboardRequest) -> bool:
        seen.append(request)
        return True

    async def scenario(client: httpx.AsyncClient) -> None:
        pages = ["/", "/jobs", "/jobs?queue=asgi-q", f"/jobs/{job_id}", "/queues", "/workers"]
        for path in pages:
            response = await client.get("/pgqueue" + path)
            assert response.status_code == 200, path
            assert response.headers["X-Frame-Options"] == "DENY"
            assert "default-src 'none'" in response.headers["Content-Security-Policy"]
            assert 'href="/pgqueue/static/pgqueue.css"' in response.text
        job = await client.get(f"/pgqueue/jobs/{job_id}")
        assert "&lt;b&gt;x&lt;/b&gt;" in job.text and "<b>x</b>" not in job.text
        assert f'href="/pgqueue/jobs/{job_id}"' in (await client.get("/pgqueue/jobs")).text
        css = await client.get("/pgqueue/static/pgqueue.css")
        assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")
        bare = await client.get("/pgqueue?x=1")
        # Starlette's Mount or the core itself sends the slash-less mount point on.
        assert bare.status_code in (307, 308)
        assert bare.headers["Location"].endswith("/pgqueue/?x=1")
        assert (await client.get("/pgqueue/jobs/999999999")).status_code == 404

    _run(_serve(pgq, access=access), scenario)
    assert seen[0].path == "/" and seen[0].method == "GET"
    assert seen[0].client == "10.1.2.3" and seen[0].scope is not None
    assert seen[3].path == f"/jobs/{job_id}"


def test_the_access_check_answers_401_and_403_and_may_be_async(pgq: PgQueue) -> None:
    async def access(request: DashboardRequest) -> bool:
        await asyncio.sleep(0)
        if request.headers.get("Authorization") is None:
            raise Unauthorized(www_authenticate=WWWAuthenticate("basic", {"realm": "pgqueue"}))
        return request.headers["Authorization"] == "Bearer ok"

    async def scenario(client: httpx.AsyncClient) -> None:
        anonymous = await client.get("/pgqueue/")
        assert anonymous.status_code == 401
        assert anonymous.headers["WWW-Authenticate"] == "Basic realm=pgqueue"
        assert anonymous.headers["X-Frame-Options"] == "DENY"
        refused = await client.get("/pgqueue/jobs", headers={"Authorization": "Bearer no"})
        assert refused.status_code == 403
        # Not even the refusal of an unknown page tells a stranger what exists.
        assert (await client.get("/pgqueue/nowhere")).status_code == 401
        ok = await client.get("/pgqueue/jobs", headers={"Authorization": "Bearer ok"})
        assert ok.status_code == 200

    _run(_serve(pgq, access=access), scenario)
    with pytest.raises(Exception, match="access="):
        asgi_app(pgq, secret_key="k")


def test_an_action_needs_the_csrf_token_of_its_session(pgq: PgQueue) -> None:
    job_id = _enqueue(pgq, "x")

    async def scenario(client: httpx.AsyncClient) -> None:
        page = await client.get(f"/pgqueue/jobs/{job_id}")
        token = _token(page.text)
        action = f"/pgqueue/jobs/{job_id}/cancel"
        assert (await client.post(action)).status_code == 400
        assert (await client.post(action, data={"csrf_token": "x"})).status_code == 400
        # The right token from another session (no cookie): refused too.
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=client._transport.app),  # type: ignore[attr-defined]
            base_url=BASE,
        ) as stranger:
            forged = await stranger.post(action, data={"csrf_token": token})
            assert forged.status_code == 400
        assert pgq.admin.get_job(job_id).state is JobState.QUEUED
        done = await client.post(action, data={"csrf_token": token})
        assert (done.status_code, done.headers["Location"]) == (302, f"/pgqueue/jobs/{job_id}")
        shown = await client.get(f"/pgqueue/jobs/{job_id}")
        assert f"Job {job_id} cancelled." in shown.text

    _run(_serve(pgq, access=lambda request: True, actor=_actor), scenario)
    assert pgq.admin.get_job(job_id).state is JobState.CANCELLED
    # Only the action that ran is recorded, with who took it (the actor reads the request).
    entries = pgq.admin.audit_log().entries
    assert [(e.actor, e.source, e.action, e.target) for e in entries] == [
        ("ada@10.1.2.3", "dashboard", "cancel", {"job_id": job_id, "state": "cancelled"})
    ]


def _actor(request: DashboardRequest) -> str:
    return f"ada@{request.client}"


@pytest.mark.parametrize("how", ["role", "read_only"])
def test_read_only_shows_pages_without_actions_and_refuses_every_post(
    pgq: PgQueue, how: str
) -> None:
    job_id = _enqueue(pgq, "x")
    options: dict[str, Any] = (
        {"access": lambda request: Role.READ_ONLY}
        if how == "role"
        else {"public": True, "read_only": True}
    )

    async def scenario(client: httpx.AsyncClient) -> None:
        for path in (f"/pgqueue/jobs/{job_id}", "/pgqueue/jobs", "/pgqueue/queues"):
            page = await client.get(path)
            assert page.status_code == 200
            assert 'method="post"' not in page.text, path
        # Refused before the CSRF check: no token can make an action of it.
        assert (await client.post(f"/pgqueue/jobs/{job_id}/cancel")).status_code == 403
        bulk = await client.post("/pgqueue/jobs/bulk", data={"queue": "asgi-q", "action": "cancel"})
        assert bulk.status_code == 403
        pause = await client.post("/pgqueue/queues/pause", data={"queue": "asgi-q"})
        assert pause.status_code == 403

    _run(_serve(pgq, **options), scenario)
    assert pgq.admin.get_job(job_id).state is JobState.QUEUED
    settings = pgq.admin.queue_settings()
    assert "asgi-q" not in settings or not settings["asgi-q"].paused
