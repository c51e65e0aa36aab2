"""The FastAPI example (examples/fastapi_app) against real PostgreSQL: an async endpoint writes
an order and enqueues its job in one ``AsyncSession`` transaction, a failing request leaves
neither, and a real worker process (the README's command) runs the async handler.

The example reads ``DATABASE_URL`` when it is imported (as a service reads its settings), so
this module gives it one database, imported once; each test looks only at its own orders.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import Depends
from server_databases import create_database, drop_database, run_example_tests
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession
from support.processes import pgqueue_env, run_pgqueue

from pgqueue import Job, JobState, MessageQueue

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app"


@pytest.fixture(scope="module")
def example_url(server_url: URL, template_name: str) -> Iterator[URL]:
    url = create_database(server_url, template_name)
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="module")
def example(example_url: URL) -> Iterator[SimpleNamespace]:
    """The example's modules, imported with ``DATABASE_URL`` set, and its tables created."""
    saved = os.environ.get("DATABASE_URL")
    os.environ["DATABASE_URL"] = example_url.render_as_string(hide_password=False)
    sys.path.insert(0, str(EXAMPLE))
    try:
        main = importlib.import_module("orders_api.__main__")
        main.main(["init-db"])
        yield SimpleNamespace(
            app=importlib.import_module("orders_api.app"),
            models=importlib.import_module("orders_api.models"),
            tasks=importlib.import_module("orders_api.tasks"),
        )
        main.pgq.dispose()
    finally:
        sys.path.remove(str(EXAMPLE))
        if saved is None:
            del os.environ["DATABASE_URL"]
        else:
            os.environ["DATABASE_URL"] = saved


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(example: SimpleNamespace) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client calling the app in-process, on the test's event loop; the app's and
    pgqueue's pooled connections on that loop are closed after the test."""
    transport = httpx.ASGITransport(app=example.app.create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://orders.test") as client:
        yield client
    await example.tasks.pgq.adispose()
    await example.app.engine.dispose()


def scalar(url: URL, statement: Any, params: dict[str, Any] | None = None) -> Any:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.scalar(statement, params or {})
    finally:
        engine.dispose()


def count(url: URL, model: Any) -> int:
    return int(scalar(url, select(func.count()).select_from(model)))


def run_worker(url: URL) -> subprocess.CompletedProcess[str]:
    """The README's worker command, with ``--drain`` to exit once no job is ready."""
    env = pgqueue_env()
    env.update(
        DATABASE_URL=url.render_as_string(hide_password=False),
        PYTHONPATH=os.pathsep.join(p for p in (str(EXAMPLE), env.get("PYTHONPATH", "")) if p),
    )
    return run_pgqueue(
        "worker", "orders_api.tasks:pgq", "--drain", env=env, cwd=EXAMPLE, process=True
    )


@pytest.mark.anyio
@pytest.mark.slow
async def test_an_order_and_its_job_commit_together_and_a_worker_sends_the_receipt(
    client: httpx.AsyncClient, example: SimpleNamespace, example_url: URL
) -> None:
    response = await client.post(
        "/orders", json={"item": "tea", "quantity": 2, "email": "ada@example.com"}
    )
    assert response.status_code == 201, response.text
    order_id, job_id = response.json()["id"], response.json()["job_id"]
    order_xmin = scalar(
        example_url, text("SELECT xmin::text FROM orders WHERE id = :id"), {"id": order_id}
    )
    job_xmin = scalar(
        example_url, text("SELECT xmin::text FROM pgqueue_jobs WHERE id = :id"), {"id": job_id}
    )
    assert job_xmin == order_xmin  # one PostgreSQL transaction wrote both
    assert (await client.get(f"/orders/{order_id}")).json()["receipt_sent"] is False

    worker = run_worker(example_url)
    assert worker.returncode == 0, worker.stderr

    assert (await client.get(f"/orders/{order_id}")).json() == {
        "id": order_id,
        "item": "tea",
        "quantity": 2,
        "receipt_sent": True,
    }
    job = await example.tasks.pgq.aget_job(job_id)
    assert (job.state, job.queue, job.result) == (
        JobState.SUCCEEDED,
        "mail",
        {"order_id": order_id},
    )


@pytest.mark.anyio
async def test_a_request_that_fails_after_enqueuing_leaves_neither_order_nor_job(
    example: SimpleNamespace, example_url: URL
) -> None:
    """A second endpoint on the example's app that fails after its enqueue, as a payment step
    might: the session's transaction rolls back, and the job with it."""
    app = example.app.create_app()
    Order = example.models.Order

    get_session = example.app.get_session

    @app.post("/orders-then-fail")
    async def create_then_fail(session: AsyncSession = Depends(get_session)) -> None:
        async with session.begin():
            order = Order(item="mug", quantity=1, email="b@example.com")
            session.add(order)
            await session.flush()
            await example.tasks.send_receipt.configure(session=session).aenqueue(order.id)
            raise RuntimeError("payment provider down")

    before = [count(example_url, model) for model in (Order, Job, MessageQueue)]
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://orders.test") as client:
        response = await client.post("/orders-then-fail")
        invalid = await client.post("/orders", json={"item": "", "quantity": 0})
    await example.tasks.pgq.adispose()
    await example.app.engine.dispose()
    assert response.status_code == 500
    assert invalid.status_code == 422
    assert [count(example_url, model) for model in (Order, Job, MessageQueue)] == before


@pytest.mark.slow
def test_the_examples_own_tests_pass_on_the_pytest_plugin(server_url: URL) -> None:
    """``pytest`` in examples/fastapi_app: the plugin makes the session's database before the
    example's conftest imports the app, as its pytest.ini asks."""
    completed = run_example_tests(EXAMPLE, server_url.render_as_string(hide_password=False))
    assert "4 passed" in completed.stdout, completed.stdout


@pytest.mark.anyio
async def test_the_example_mounts_the_dashboard_behind_its_password(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DASHBOARD_PASSWORD", raising=False)
    assert (await client.get("/pgqueue/")).status_code == 403  # closed while unset
    monkeypatch.setenv("DASHBOARD_PASSWORD", "pässwörd")
    anonymous = await client.get("/pgqueue/")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Basic ")
    wrong = await client.get("/pgqueue/", auth=("ada", "nope"))
    assert wrong.status_code == 401
    created = await client.post(
        "/orders", json={"item": "tea", "quantity": 1, "email": "ada@example.com"}
    )
    job_id = created.json()["job_id"]
    page = await client.get(f"/pgqueue/jobs/{job_id}", auth=("ada", "pässwörd"))
    assert page.status_code == 200
    assert "send_receipt" in page.text
    overview = await client.get("/pgqueue/", auth=("ada", "pässwörd"))
    assert overview.status_code == 200 and "mail" in overview.text
