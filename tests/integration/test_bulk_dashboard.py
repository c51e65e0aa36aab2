"""The dashboard's bulk actions through Flask's test client on a real database: the job list's
form previews a count, the confirmation carries that count and acts only while it still holds,
each action writes one audit row with the dashboard's actor, and a POST without the CSRF token
changes nothing."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.engine import URL
from support.audit import audit_rows
from support.dashboard import dashboard_app

from pgqueue import JobState
from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.cli import pgqueue_group
from pgqueue.testing import states_of

pgq = PgQueue()


@pgq.task(name="dash.flaky", queue="dash", max_attempts=1)
def flaky(n: int) -> None:
    raise RuntimeError(f"gateway_timeout {n}")


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    with dashboard_app(pgq, database_url, "bulk_dashboard", actor=lambda: "alice") as app:
        yield app


def _failed_jobs(app: Flask, count: int) -> list[int]:
    queue = pgq.state(app).queue
    with app.app_context():
        ids = flaky.enqueue_many([[n] for n in range(count)])
    queue.run_worker(drain=True, concurrency=4)
    assert set(states_of(queue, ids).values()) == {JobState.FAILED}
    return ids


def _token(client: FlaskClient) -> str:
    page = client.get("/pgqueue/jobs?queue=dash&state=failed")
    assert 'action="/pgqueue/jobs/bulk"' in page.text
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _confirm_form(page: str) -> dict[str, str]:
    """The hidden fields of the preview's confirmation form."""
    marker = page.index('name="step" value="confirm"')
    form = page[page.rindex("<form", 0, marker) :].split("</form>", 1)[0]
    fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form))
    return {k: html.unescape(v) for k, v in fields.items()}


def test_preview_then_confirm_retries_the_filtered_jobs_once_recorded(app: Flask) -> None:
    ids = _failed_jobs(app, 5)
    queue = pgq.state(app).queue
    client = app.test_client()
    token = _token(client)
    filters = {"queue": "dash", "state": "failed", "error_contains": "gateway_timeout"}

    forged = client.post("/pgqueue/jobs/bulk", data={**filters, "action": "retry"})
    assert forged.status_code == 400
    preview = client.post(
        "/pgqueue/jobs/bulk", data={**filters, "action": "retry", "csrf_token": token}
    )
    assert preview.status_code == 200
    assert "This will retry 5 jobs." in preview.text
    assert audit_rows(pgq.state(app).queue.engine, "actor", "source", "action", "count") == []
    assert set(states_of(queue, ids).values()) == {JobState.FAILED}

    confirm = _confirm_form(preview.text)
    assert confirm["expected_count"] == "5"
    assert client.post("/pgqueue/jobs/bulk", data={**confirm, "csrf_token": ""}).status_code == 400
    assert set(states_of(queue, ids).values()) == {JobState.FAILED}

    done = client.post("/pgqueue/jobs/bulk", data=confirm, follow_redirects=True)
    assert done.status_code == 200
    assert "Retried 5 jobs (audit record 1)." in done.text
    assert set(states_of(queue, ids).values()) == {JobState.QUEUED}
    assert audit_rows(pgq.state(app).queue.engine, "actor", "source", "action", "count") == [
        ("alice", "dashboard", "retry", 5)
    ]


def test_a_count_changed_since_the_preview_is_refused_and_shown(app: Flask) -> None:
    ids = _failed_jobs(app, 3)
    queue = pgq.state(app).queue
    client = app.test_client()
    token = _token(client)
    preview = client.post(
        "/pgqueue/jobs/bulk",
        data={"queue": "dash", "action": "delete", "csrf_token": token},
    )
    assert "This will delete 3 jobs." in preview.text
    more = _failed_jobs(app, 2)

    refused = client.post("/pgqueue/jobs/bulk", data=_confirm_form(preview.text))
    assert refused.status_code == 409
    assert "(3 then, 5 now): nothing was done. Confirm again to delete 5 jobs." in refused.text
    assert len(states_of(queue, ids + more)) == 5
    assert audit_rows(pgq.state(app).queue.engine, "actor", "source", "action", "count") == []

    done = client.post(
        "/pgqueue/jobs/bulk", data=_confirm_form(refused.text), follow_redirects=True
    )
    assert "Deleted 5 jobs (audit record 1)." in done.text
    assert states_of(queue, ids + more) == {}


def test_a_retry_that_would_give_a_unique_key_two_holders_is_refused_and_shown(
    app: Flask,
) -> None:
    queue = pgq.state(app).queue
    with app.app_context():
        failed = flaky.configure(unique_key="order-9").enqueue(1)
    queue.run_worker(drain=True)
    with app.app_context():
        holder = flaky.configure(unique_key="order-9").enqueue(2)
    client = app.test_client()
    preview = client.post(
        "/pgqueue/jobs/bulk",
        data={"queue": "dash", "state": "failed", "action": "retry", "csrf_token": _token(client)},
    )
    assert "This will retry 1 jobs." in preview.text or "This will retry 1 job." in preview.text

    refused = client.post("/pgqueue/jobs/bulk", data=_confirm_form(preview.text))
    assert refused.status_code == 409
    assert "retry changed nothing: a matched job&#39;s unique_key is held" in refused.text
    assert states_of(queue, [failed, holder]) == {failed: JobState.FAILED, holder: JobState.QUEUED}
    assert audit_rows(pgq.state(app).queue.engine, "actor", "source", "action", "count") == []

    page = client.post(f"/pgqueue/jobs/{failed}/retry", data={"csrf_token": _token(client)},
                       follow_redirects=True)  # fmt: skip
    assert (
        f"cannot retry job {failed}: its unique_key &#39;order-9&#39; is held by job {holder}"
        in page.text
    )
    assert states_of(queue, [failed]) == {failed: JobState.FAILED}


def test_bad_or_empty_filters_are_a_clear_400_and_write_nothing(app: Flask) -> None:
    ids = _failed_jobs(app, 2)
    client = app.test_client()
    token = _token(client)
    for data, message in [
        ({"action": "delete"}, "refusing to delete every job"),
        ({"action": "retry", "state": "succeeded"}, "cannot retry jobs in state succeeded"),
        (
            {"action": "retry", "queue": "dash", "since": "soon"},
            "since &#39;soon&#39; is not a time",
        ),
        ({"action": "explode", "queue": "dash"}, "Choose retry, cancel or delete."),
    ]:
        for step in ("preview", "confirm"):
            page = client.post(
                "/pgqueue/jobs/bulk",
                data={**data, "step": step, "expected_count": "2", "csrf_token": token},
            )
            assert page.status_code == 400, (data, step)
            assert message in page.text, (data, step)
    assert set(states_of(pgq.state(app).queue, ids).values()) == {JobState.FAILED}
    assert audit_rows(pgq.state(app).queue.engine, "actor", "source", "action", "count") == []


def test_flask_pgqueue_bulk_counts_then_acts_in_the_app(app: Flask) -> None:
    ids = _failed_jobs(app, 4)
    runner = app.test_cli_runner()
    args = ["bulk", "retry", "--queue", "dash", "--error-contains", "GATEWAY_TIMEOUT"]
    dry = runner.invoke(pgqueue_group, [*args, "--dry-run"])
    assert dry.output.strip() == "dry run: retry would change 4 jobs"
    refused = runner.invoke(pgqueue_group, args)
    assert refused.exit_code == 2
    assert refused.output.strip().startswith("error: refusing to retry 4 jobs without")
    done = runner.invoke(pgqueue_group, [*args, "--yes", "--actor", "bob"])
    assert done.output.strip() == "retried 4 jobs (audit record 1)"
    assert set(states_of(pgq.state(app).queue, ids).values()) == {JobState.QUEUED}
    assert audit_rows(pgq.state(app).queue.engine, "actor", "source", "action", "count") == [
        ("bob", "cli", "retry", 4)
    ]
