"""The orders endpoints and their receipt job, tested with pgqueue's pytest plugin."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from orders_api.database import engine
from orders_api.tasks import pgq, send_receipt

from pgqueue import JobState
from pgqueue.testing import ImmediateMode, JobRun, assert_enqueued, enqueued_jobs

ORDER = {"item": "tea", "quantity": 2, "email": "ada@example.com"}


@pytest.mark.anyio
async def test_creating_an_order_enqueues_its_receipt(client: httpx.AsyncClient) -> None:
    response = await client.post("/orders", json=ORDER)
    assert response.status_code == 201, response.text
    order_id = response.json()["id"]
    assert_enqueued(send_receipt, order_id=order_id)
    assert (await client.get(f"/orders/{order_id}")).json()["receipt_sent"] is False


@pytest.mark.anyio
async def test_an_invalid_order_enqueues_nothing(client: httpx.AsyncClient) -> None:
    before = len(enqueued_jobs(pgq, send_receipt))
    response = await client.post("/orders", json={"item": "", "quantity": 0, "email": "x"})
    assert response.status_code == 422
    assert len(enqueued_jobs(pgq, send_receipt)) == before


@pytest.mark.anyio
async def test_the_receipt_job_runs(
    client: httpx.AsyncClient, pgqueue_run_jobs: Callable[[], list[JobRun]]
) -> None:
    order_id = (await client.post("/orders", json=ORDER)).json()["id"]
    # The worker's async handler runs on its own event loop, with its own connections.
    await engine.dispose()
    runs = [run for run in pgqueue_run_jobs() if run.args == (order_id,)]
    assert [(run.task, run.state) for run in runs] == [
        ("orders_api.tasks.send_receipt", JobState.SUCCEEDED)
    ]
    assert (await client.get(f"/orders/{order_id}")).json()["receipt_sent"] is True


@pytest.mark.anyio
async def test_in_immediate_mode_the_receipt_is_sent_when_the_request_commits(
    client: httpx.AsyncClient, pgqueue_immediate: ImmediateMode
) -> None:
    response = await client.post("/orders", json=ORDER)
    order_id = response.json()["id"]
    assert [(run.args, run.state) for run in pgqueue_immediate.runs] == [
        ((order_id,), JobState.SUCCEEDED)
    ]
    assert (await client.get(f"/orders/{order_id}")).json()["receipt_sent"] is True
