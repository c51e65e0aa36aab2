"""The orders service's tests: a view that enqueues a job, and that job's effect, tested with
pgqueue's pytest plugin (its fixtures and ``pgqueue.testing``'s assertions)."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask
from flask.testing import FlaskClient
from orders.tasks import send_receipt

from pgqueue import JobState
from pgqueue.testing import ImmediateMode, JobRun, assert_enqueued, assert_not_enqueued

ORDER = {"item": "tea", "quantity": 2, "email": "ada@example.com"}


def test_creating_an_order_enqueues_its_receipt(app: Flask, client: FlaskClient) -> None:
    response = client.post("/orders", json=ORDER)
    assert response.status_code == 201
    order_id = response.json["id"]
    with app.app_context():
        job = assert_enqueued(send_receipt, order_id=order_id)
    assert job.job_id == response.json["job_id"]
    assert job.queue == "mail"


def test_a_rejected_order_enqueues_nothing(app: Flask, client: FlaskClient) -> None:
    response = client.post("/orders", json={"item": "tea"})
    assert response.status_code == 400
    with app.app_context():
        assert_not_enqueued(send_receipt)


def test_the_receipt_job_records_the_receipt(
    client: FlaskClient, pgqueue_run_jobs: Callable[[], list[JobRun]]
) -> None:
    order_id = client.post("/orders", json=ORDER).json["id"]
    assert client.get(f"/orders/{order_id}").json["receipt_sent"] is False

    runs = pgqueue_run_jobs()

    assert [(run.task, run.args, run.state, run.result) for run in runs] == [
        ("orders.tasks.send_receipt", (order_id,), JobState.SUCCEEDED, {"order_id": order_id})
    ]
    assert client.get(f"/orders/{order_id}").json["receipt_sent"] is True


def test_in_immediate_mode_the_receipt_is_sent_when_the_request_commits(
    client: FlaskClient, pgqueue_immediate: ImmediateMode
) -> None:
    order_id = client.post("/orders", json=ORDER).json["id"]

    assert client.get(f"/orders/{order_id}").json["receipt_sent"] is True
    assert [run.state for run in pgqueue_immediate.runs] == [JobState.SUCCEEDED]
