"""The dashboard's Schedules and Audit pages through the core's WSGI test client on a real
database: what each shows, the pause, resume and run-now actions with their audit records
naming the actor, and the refusals (CSRF, read-only, a bad or unknown schedule name) that
write nothing."""

from __future__ import annotations

import datetime as dt
import html
import re

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session
from support.audit import audit_rows
from werkzeug.test import Client, TestResponse

from pgqueue import PgQueue
from pgqueue.dashboard.app import Dashboard
from pgqueue.models import Job, PeriodicTick


def nightly(region: str) -> str:
    return region


@pytest.fixture
def scheduled(pgq: PgQueue) -> PgQueue:
    task = pgq.task(name="ops.nightly", queue="reports")(nightly)
    pgq.periodic("30 2 * * *", tz="Europe/Paris", name="nightly-<b>", args=["eu"])(task)
    return pgq


def _client(queue: PgQueue, *, read_only: bool = False) -> Client:
    dashboard = Dashboard(
        queue, secret_key="test", public=True, actor=lambda _: "ada", read_only=read_only
    )
    return Client(dashboard)


def _csrf(client: Client) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/schedules").text)
    assert found is not None
    return found.group(1)


def _post(client: Client, action: str, name: str, token: str | None) -> TestResponse:
    form = {"schedule": name} | ({} if token is None else {"csrf_token": token})
    return client.post(f"/schedules/{action}", data=form)


def _row(page: str, name: str) -> str:
    return page.split(f'data-schedule="{html.escape(name)}"')[1].split("</tr>")[0]


def test_the_schedules_page_shows_each_schedule_and_the_database_only_names(
    scheduled: PgQueue, engine: Engine
) -> None:
    # A name only the database knows: paused by an older deployment's code.
    older = PgQueue(scheduled.engine)
    older.periodic("* * * * *", name="retired", args=["us"])(
        older.task(name="ops.retired")(nightly)
    )
    assert older.admin.pause_schedule("retired", actor="bob")
    tick = dt.datetime(2026, 1, 2, 1, 30, tzinfo=dt.UTC)
    with Session(engine) as session, session.begin():
        session.add(PeriodicTick(schedule_name="nightly-<b>", scheduled_at=tick, job_id=77))

    page = _client(scheduled).get("/schedules")
    assert page.status_code == 200
    text = page.text
    assert "<b>" not in text.split("<main>")[1]
    assert 'href="/schedules">Schedules</a>' in text and 'href="/audit">Audit</a>' in text
    row = _row(text, "nightly-<b>")
    for cell in (
        '<span class="badge state-running">active</span>',
        "<code>30 2 * * *</code>",
        '<td class="zone">Europe/Paris</td>',
        '<td class="task">ops.nightly</td>',
        '<td class="when last-tick">2026-01-02 01:30:00 UTC</td>',
        '<a href="/jobs/77">#77</a>',
        '<td class="missed">latest</td>',
        'class="pause cancel">Pause</button>',
        'class="run-now">Run now</button>',
    ):
        assert cell in row, cell
    next_tick = scheduled.admin.schedules()[0].next_tick
    assert next_tick is not None and next_tick.strftime("%Y-%m-%d %H:%M:%S UTC") in row
    retired = _row(text, "retired")
    assert "database only" in retired and '<span class="badge paused">paused</span>' in retired
    assert 'class="resume">Resume</button>' in retired and "Run now" not in retired
    assert 'id="no-code-schedules"' not in text


def test_pause_resume_and_run_now_are_audited_with_the_actor(
    scheduled: PgQueue, engine: Engine
) -> None:
    client = _client(scheduled)
    token = _csrf(client)
    name = "nightly-<b>"

    paused = _post(client, "pause", name, token)
    assert paused.status_code == 302 and paused.headers["Location"] == "/schedules"
    page = client.get("/schedules").text
    assert (
        f"Schedule {html.escape(name)} paused: its ticks are dropped until it is resumed." in page
    )
    assert '<span class="badge paused">paused</span>' in _row(page, name)
    assert scheduled.admin.schedules()[0].paused

    _post(client, "pause", name, token)
    assert "Schedule nightly-&lt;b&gt; was paused already." in client.get("/schedules").text

    _post(client, "resume", name, token)
    assert "Schedule nightly-&lt;b&gt; resumed from its next tick." in client.get("/schedules").text
    assert not scheduled.admin.schedules()[0].paused

    _post(client, "run", name, token)
    with Session(engine) as session:
        job_id, args = session.execute(select(Job.id, Job.args)).one()
    assert args == ["eu"]
    assert f"Schedule nightly-&lt;b&gt; run now as job {job_id}." in client.get("/schedules").text

    assert audit_rows(engine, "actor", "source", "action", "filter") == [
        ("ada", "dashboard", "pause_schedule", {"schedule": name}),
        ("ada", "dashboard", "resume_schedule", {"schedule": name}),
        ("ada", "dashboard", "run_schedule", {"schedule": name, "job_id": job_id}),
    ]

    audit = client.get("/audit")
    assert audit.status_code == 200
    rows = audit.text.split("<tbody>")[1].split("</tbody>")[0].split("<tr ")[1:]
    actions = [re.findall(r'<td class="action">(\w+)</td>', r) for r in rows]
    assert actions == [["run_schedule"], ["resume_schedule"], ["pause_schedule"]]
    newest = rows[0]
    for cell in (
        '<td class="actor">ada</td>',
        '<td class="source">dashboard</td>',
        'schedule <a href="/schedules">nightly-&lt;b&gt;</a>',
        f'job <a href="/jobs/{job_id}">#{job_id}</a>',
        '<td class="num count">1</td>',
    ):
        assert cell in newest, cell


def test_refusals_write_nothing(scheduled: PgQueue, engine: Engine) -> None:
    client = _client(scheduled)
    token = _csrf(client)

    assert _post(client, "pause", "nightly-<b>", None).status_code == 400
    assert _post(client, "pause", "nightly-<b>", "forged").status_code == 400

    unknown = _post(client, "run", "no-such", token)
    assert unknown.status_code == 302
    page = client.get("/schedules")
    assert page.status_code == 200
    assert "no schedule named &#39;no-such&#39; in the code (its schedules: nightly-&lt;b&gt;)" in (
        page.text
    )
    _post(client, "pause", "no-such", token)
    assert "nor a tick or a pause of it in the database" in client.get("/schedules").text

    empty = _post(client, "pause", "", token)
    assert empty.status_code == 400
    assert "schedule name must be a non-empty str without NUL" in empty.text
    assert _post(client, "explode", "nightly-<b>", token).status_code == 404

    read_only = _client(scheduled, read_only=True)
    shown = read_only.get("/schedules").text
    assert "nightly-&lt;b&gt;" in shown and "<form" not in shown.split("<main>")[1]
    assert _post(read_only, "pause", "nightly-<b>", _csrf(client)).status_code == 403

    assert audit_rows(engine, "actor", "source", "action", "filter") == []
    assert not scheduled.admin.schedules()[0].paused
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_without_code_schedules_the_page_says_to_pass_the_app(pgq: PgQueue) -> None:
    page = _client(pgq).get("/schedules").text
    assert 'id="no-code-schedules"' in page
    assert "pgqueue dashboard myapp.jobs:pgq" in page
    assert "No schedules." in page


def test_the_audit_log_pages_back_newest_first(scheduled: PgQueue) -> None:
    for n in range(51):
        switch = scheduled.admin.resume_schedule if n % 2 else scheduled.admin.pause_schedule
        assert switch("nightly-<b>", actor=f"op{n}", source="cli")
    client = _client(scheduled)

    first = client.get("/audit").text
    actors = re.findall(r'<td class="actor">(\w+)</td>', first)
    assert actors == [f"op{n}" for n in range(50, 0, -1)]
    assert '<td class="source">cli</td>' in first and "← Newest" not in first
    older = re.search(r'<a rel="next" href="/audit\?before=(\d+)">Older', first)
    assert older is not None

    second = client.get(f"/audit?before={older.group(1)}").text
    assert re.findall(r'<td class="actor">(\w+)</td>', second) == ["op0"]
    assert '<a rel="first" href="/audit">← Newest</a>' in second and "Older" not in second

    bad = client.get("/audit?before=x")
    assert (
        bad.status_code == 400 and "before must be an audit record id, got &#39;x&#39;" in bad.text
    )
    assert client.get("/audit?before=-1").status_code == 400


def test_an_empty_audit_log(pgq: PgQueue) -> None:
    page = _client(pgq).get("/audit").text
    assert "No action taken yet." in page and "<table" not in page
