"""The dashboard's live fragments through Flask's test client on a real database: each live
page answers ``?fragment=<name>`` with its ``data-live`` element alone, cut from the same
rendering as the whole page, showing what changed since; an unknown name is a 400; the script
that polls them is served under the policy that lets it run and nothing else."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask import Flask
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app

from pgqueue.contrib.flask import PgQueue
from pgqueue.workflows import chain

pgq = PgQueue()


@pgq.task(name="live.noop", queue="live-q")
def noop(value: str) -> str:
    return value


@pgq.task(name="live.step", queue="live-q")
def step(*values: object) -> int:
    return len(values)


@pytest.fixture
def app(database_url: URL) -> Iterator[Flask]:
    with dashboard_app(pgq, database_url, "dashboard_live") as app:
        yield app


def _queued_cell(html: str) -> str:
    found = re.search(
        r'<tr data-queue="live-q">.*?<td class="num" data-state="queued">\s*(.*?)\s*</td>',
        html,
        re.S,
    )
    assert found is not None, html
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def test_the_overview_fragment_is_its_live_element_and_shows_a_new_job(app: Flask) -> None:
    client = app.test_client()
    with app.app_context():
        noop.enqueue("a")
    page = client.get("/pgqueue/")
    fragment = client.get("/pgqueue/?fragment=overview")
    assert fragment.status_code == 200
    assert fragment.mimetype == "text/html"
    text = fragment.text.strip()
    assert text.startswith('<div data-live="overview">') and text.endswith("</div>")
    assert "<html" not in text and "<nav" not in text
    # One rendering: the fragment is the page's own block, byte for byte.
    assert fragment.text in page.text
    assert _queued_cell(text) == "1"
    with app.app_context():
        noop.enqueue("b")
    assert _queued_cell(client.get("/pgqueue/?fragment=overview").text) == "2"


def test_the_jobs_and_job_fragments_follow_the_jobs(app: Flask) -> None:
    client = app.test_client()
    with app.app_context():
        first = noop.enqueue("a")
    jobs = client.get("/pgqueue/jobs?queue=live-q&fragment=jobs").text
    assert re.findall(r'data-job-id="(\d+)"', jobs) == [str(first)]
    with app.app_context():
        second = noop.enqueue("b")
    jobs = client.get("/pgqueue/jobs?queue=live-q&fragment=jobs").text
    assert jobs.strip().startswith('<div data-live="jobs">')
    assert re.findall(r'data-job-id="(\d+)"', jobs) == [str(second), str(first)]
    job = client.get(f"/pgqueue/jobs/{first}?fragment=job")
    assert job.status_code == 200
    assert job.text.strip().startswith('<div data-live="job">')
    assert re.findall(r'id="job-state">(\w+)<', job.text) == ["queued"]
    assert job.text in client.get(f"/pgqueue/jobs/{first}").text
    with app.app_context():
        pgq.queue.admin.cancel_job(first)
    job = client.get(f"/pgqueue/jobs/{first}?fragment=job")
    assert re.findall(r'id="job-state">(\w+)<', job.text) == ["cancelled"]


def test_an_unknown_fragment_is_refused(app: Flask) -> None:
    client = app.test_client()
    response = client.get("/pgqueue/?fragment=nope")
    assert response.status_code == 400
    assert "this page has no live fragment &#39;nope&#39; (it has: overview)" in response.text
    response = client.get("/pgqueue/queues?fragment=overview")
    assert response.status_code == 400
    assert "this page has no live fragment &#39;overview&#39; (it has none)" in response.text


def test_every_live_page_loads_the_script_and_marks_its_fragment(app: Flask) -> None:
    client = app.test_client()
    with app.app_context():
        job_id = noop.enqueue("a")
    for path, name in [("/", "overview"), ("/jobs", "jobs"), (f"/jobs/{job_id}", "job")]:
        html = client.get("/pgqueue" + path).text
        assert '<script src="/pgqueue/static/live.js" defer></script>' in html, path
        assert html.count("data-live=") == 1, path
        assert f'<div data-live="{name}">' in html, path
    script = client.get("/pgqueue/static/live.js")
    assert script.status_code == 200
    assert script.mimetype in {"text/javascript", "application/javascript"}
    assert "fragment" in script.text and "visibilitychange" in script.text


FINISHED = text(
    """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, run_at, started_at,
                                 finished_at, updated_at, args)
       VALUES ('live.noop', 'chart-q', :state, 1, now() - make_interval(secs => 5 + :waited),
               now() - make_interval(secs => 5), now() - make_interval(secs => 5), now(), '[]')"""
)


def test_the_overview_charts_wait_time_and_failure_rate_per_queue(
    app: Flask, database_url: URL
) -> None:
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(FINISHED, {"state": "succeeded", "waited": 3})
        connection.execute(FINISHED, {"state": "failed", "waited": 1})
    engine.dispose()
    html = app.test_client().get("/pgqueue/?fragment=overview").text
    row = re.search(r'<tr data-queue="chart-q">(.*?)</tr>', html, re.S)
    assert row is not None
    wait = re.search(r'<td class="chart wait">(.*?)</td>', row.group(1), re.S)
    failures = re.search(r'<td class="chart failures">(.*?)</td>', row.group(1), re.S)
    assert wait is not None and failures is not None
    # p95 of waits 1 s and 3 s: 1 + 0.95 * 2; in the newest bucket (five-minute ones: a quiet hour).
    assert "now 2.9 s · peak 2.9 s" in wait.group(1)
    assert "300 s to now: 2 jobs, waited p50 2 s, p95 2.9 s" in wait.group(1)
    assert wait.group(1).count('class="bar-wait"') == 1
    assert "50.0% failed" in failures.group(1)
    assert "300 s to now: 1 of 2 failed (50%)" in failures.group(1)
    assert failures.group(1).count('class="bar-failures"') == 1


def test_the_workflow_fragment_follows_its_members(app: Flask) -> None:
    client = app.test_client()
    with app.app_context():
        flow = chain(step.s("a"), step.s("b")).enqueue()
        first = pgq.queue.admin.get_workflow(flow.id).jobs[0].id
    url = f"/pgqueue/workflows/{flow.id}?fragment=workflow"
    html = client.get(url).text
    assert html.strip().startswith('<div data-live="workflow">')
    assert html in client.get(f"/pgqueue/workflows/{flow.id}").text
    assert re.findall(r'data-job="(\d+)" data-state="(\w+)"', html)[0] == (str(first), "queued")
    with app.app_context():
        pgq.queue.admin.cancel_workflow(flow.id)
    states = re.findall(r'data-state="(\w+)"', client.get(url).text)
    assert states and "queued" not in states
