"""The dashboard through PgBouncer in transaction mode, as the role with DML rights only.

Operators serve the dashboard through the pooler and the role their application uses. So each
of its transactions may land on any server session of the pool: nothing it does may need a
startup option, a prepared statement, a session setting, a session lock, LISTEN or a temporary
table, or any right beyond reading and writing pgqueue's rows. One walk over the WSGI core
(which Flask, ASGI and the standalone server all hand their requests to; the browser suite
covers those layers) with werkzeug's test client: every page answers 200 with what it must
show, and every action, posted through its page's form with the CSRF token, takes effect and
writes its audit record. Then every server session the pool opened must be as a new one.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from support.audit import audit_rows
from support.dashboard import Form, page_form
from support.polling import wait_until
from support.roles import app_role, as_role
from support.workers import in_thread
from werkzeug.test import Client, TestResponse

from pgqueue import JobState, PgQueue, Settings
from pgqueue.dashboard import Dashboard
from pgqueue.worker import Worker
from pgqueue.workflows import chain

if TYPE_CHECKING:
    from conftest import App

__all__ = ["app_role"]  # the fixture, used by name

ACTOR = "ops@example"

# What a server session carries from one transaction to the next, as one of the pool's clients
# reads it: its user; the settings set for the session rather than for one transaction (but
# those PgBouncer itself sets to each client's startup parameters); statements left prepared,
# advisory locks held, channels listened to, and a temporary schema (made by a temporary table).
SESSION_STATE = """
SELECT pg_backend_pid(), current_user,
       (SELECT array_agg(name ORDER BY name) FROM pg_settings WHERE source = 'session'
          AND name NOT IN ('application_name', 'client_encoding', 'DateStyle', 'TimeZone',
                           'standard_conforming_strings')),
       (SELECT count(*) FROM pg_prepared_statements),
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
       (SELECT count(*) FROM pg_listening_channels()),
       pg_my_temp_schema() <> 0
"""


@pytest.fixture
def bouncer_login(server_tcp_url: URL, app_role: str) -> URL:
    """The pool logs in as the role with DML rights only (the e2e ``bouncer`` fixture's)."""
    return as_role(server_tcp_url, app_role)


def _echo(user_id: int, tags: list[str]) -> int:
    return user_id


def _step(*values: object) -> int:
    return len(values)


def _charge() -> None:
    raise RuntimeError("card declined by the issuing bank")


def _report() -> None:
    pass


def test_every_page_and_action_through_pgbouncer_as_the_dml_role(
    app: App,
    bouncer: URL,
    app_role: str,
) -> None:
    pgq = PgQueue(bouncer, settings=Settings(pooler="transaction", poll_interval=0.1))
    echo = pgq.task(name="pb.echo", queue="pb-q")(_echo)
    charge = pgq.task(name="pb.charge", queue="pb-fail", max_attempts=1)(_charge)
    step = pgq.task(name="pb.step", queue="pb-flow")(_step)
    report = pgq.task(name="pb.report", queue="pb-reports")(_report)
    pgq.periodic("0 3 * * *", name="pb.nightly")(report)
    client = Client(Dashboard(pgq, secret_key="test-secret", public=True, actor=lambda _: ACTOR))
    started = dt.datetime.now(dt.UTC)
    try:
        failed = charge.enqueue()
        later = echo.configure(delay=3600)
        to_cancel, to_run, to_reschedule, to_prioritize, to_signal = (
            later.enqueue(n, []) for n in range(5)
        )
        vip = later.enqueue(7, ["vip"])
        bulk = [echo.configure(queue="pb-bulk", delay=3600).enqueue(n, []) for n in range(3)]
        flow = chain(step.s("a"), step.s("b")).enqueue()

        # A worker through the same pool fails the charge, and is on the workers page meanwhile.
        with in_thread(Worker(pgq, queues=["pb-fail"], concurrency=2, maintenance=False)) as w:
            wait_until(lambda: pgq.get_job(failed).state is JobState.FAILED, 30, "the failure")
            workers = _page(client, "/workers")
            assert f'data-worker-id="{html.escape(w.worker_id)}"' in workers
            assert "pb-fail" in workers

        # -- every page --------------------------------------------------------------------------
        overview = _page(client, "/")
        fragment = _page(client, "/?fragment=overview")
        # Not compared byte for byte: the ages and charts on them move with the clock.
        assert fragment.strip().startswith('<div data-live="overview">')
        for shown in (overview, fragment):
            assert _count(shown, "pb-q", "queued") == "6"
            assert _count(shown, "pb-fail", "failed") == "1"
            assert _count(shown, "pb-bulk", "queued") == "3"

        newest_first = [vip, to_signal, to_prioritize, to_reschedule, to_run, to_cancel]
        assert _ids(_page(client, "/jobs?queue=pb-q")) == newest_first
        job = _page(client, f"/jobs/{failed}")
        assert 'id="job-state">failed<' in job and "card declined by the issuing bank" in job
        json_search = {"json": 'args.1=["vip"]', "match": "contains"}
        assert _ids(_page(client, "/jobs?" + urlencode(json_search))) == [vip]
        assert _ids(_page(client, "/jobs?" + urlencode({"error": "card declined"}))) == [failed]
        window = {
            "time": "finished_at",
            "since": _typed(started - dt.timedelta(minutes=1)),
            "until": _typed(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)),
        }
        assert _ids(_page(client, "/jobs?" + urlencode(window))) == [failed]
        assert "active" in _row(_page(client, "/queues"), "pb-q")
        assert "active" in _row(_page(client, "/schedules"), "pb.nightly", "schedule")
        members = [member.id for member in pgq.admin.get_workflow(flow.id).jobs]
        drawn = re.findall(
            r'data-job="(\d+)" data-state="(\w+)"', _page(client, f"/workflows/{flow.id}")
        )
        assert drawn == [(str(members[0]), "queued"), (str(members[1]), "waiting")]
        assert "No action taken yet." in _page(client, "/audit")

        # -- every action, through its page's form ---------------------------------------------
        _act(client, f"/jobs/{failed}", f"/jobs/{failed}/retry")
        _act(client, f"/jobs/{to_cancel}", f"/jobs/{to_cancel}/cancel")
        _act(client, f"/jobs/{to_run}", f"/jobs/{to_run}/run_now")
        moved_to = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=0)
        reschedule = f"/jobs/{to_reschedule}/reschedule"
        _act(client, f"/jobs/{to_reschedule}", reschedule, run_at=_typed(moved_to))
        _act(client, f"/jobs/{to_prioritize}", f"/jobs/{to_prioritize}/priority", priority="-5")
        signal = {"name": "go", "payload": '{"approved": true}'}
        _act(client, f"/jobs/{to_signal}", f"/jobs/{to_signal}/signal", **signal)
        jobs = {
            i: pgq.get_job(i) for i in (failed, to_cancel, to_run, to_reschedule, to_prioritize)
        }
        assert jobs[failed].state is JobState.QUEUED
        assert jobs[to_cancel].state is JobState.CANCELLED
        ran_at, soon = jobs[to_run].run_at, started + dt.timedelta(minutes=5)
        assert ran_at is not None and ran_at < soon  # from an hour ahead to the database's now
        assert jobs[to_reschedule].run_at == moved_to
        assert jobs[to_prioritize].priority == -5
        [received] = pgq.admin.job_signals(to_signal).received
        assert (received.name, received.payload) == ("go", {"approved": True})

        _act(client, "/queues", "/queues/pause", queue="pb-q")
        assert pgq.admin.queue_settings()["pb-q"].paused
        assert "paused" in _row(_page(client, "/queues"), "pb-q")
        _act(client, "/queues", "/queues/resume", queue="pb-q")
        assert not pgq.admin.queue_settings()["pb-q"].paused

        _act(client, "/schedules", "/schedules/pause", schedule="pb.nightly")
        assert pgq.admin.schedules()[0].paused
        _act(client, "/schedules", "/schedules/resume", schedule="pb.nightly")
        assert not pgq.admin.schedules()[0].paused
        _act(client, "/schedules", "/schedules/run", schedule="pb.nightly")
        [scheduled] = _ids(_page(client, "/jobs?queue=pb-reports"))

        listing = _page(client, "/jobs?queue=pb-bulk")
        preview = _post(client, page_form(listing, "/jobs/bulk", queue="pb-bulk"), action="cancel")
        assert preview.status_code == 200, preview.text
        assert "Confirm: cancel 3 jobs" in preview.text
        confirmed = _post(client, page_form(preview.text, "/jobs/bulk", step="confirm"))
        assert confirmed.status_code == 302, confirmed.text
        assert {pgq.get_job(i).state for i in bulk} == {JobState.CANCELLED}

        expected = [
            ("retry", {"job_id": failed}, 1),
            ("cancel", {"job_id": to_cancel}, 1),
            ("run_now", {"job_id": to_run}, 1),
            ("reschedule", {"job_id": to_reschedule}, 1),
            ("set_priority", {"job_id": to_prioritize}, 1),
            ("signal", {"job_id": to_signal}, 1),
            ("pause_queue", {"queue": "pb-q"}, 1),
            ("resume_queue", {"queue": "pb-q"}, 1),
            ("pause_schedule", {"schedule": "pb.nightly"}, 1),
            ("resume_schedule", {"schedule": "pb.nightly"}, 1),
            ("run_schedule", {"schedule": "pb.nightly", "job_id": scheduled}, 1),
            ("cancel", {"queue": "pb-bulk"}, 3),
        ]
        recorded = audit_rows(app.engine, "actor", "source", "action", "filter", "count")
        assert len(recorded) == len(expected), recorded
        seen = [
            (actor, source, action, {k: where.get(k) for k in target}, count)
            for (actor, source, action, where, count), (_, target, _) in zip(recorded, expected)
        ]
        assert seen == [(ACTOR, "dashboard", *record) for record in expected]
        audit = _page(client, "/audit")
        assert len(re.findall(r'<tr data-audit-id="\d+">', audit)) == len(expected)
        assert audit.count(f'<td class="actor">{html.escape(ACTOR)}</td>') == len(expected)
    finally:
        pgq.dispose()

    for state in _pool_sessions(bouncer, app.engine, app_role):
        assert state[1:] == (app_role, None, 0, 0, 0, False), state


def _page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response.text


def _post(client: Client, form: Form, **typed: str) -> TestResponse:
    """Submit ``form`` with ``typed`` filled in."""
    assert form.method == "post"
    return client.post(form.action, data={**form.fields, **typed})


def _act(client: Client, page: str, action: str, **typed: str) -> None:
    """Post the form of ``page`` that goes to ``action`` (the one whose hidden fields hold
    ``typed``'s ``queue``/``schedule``, when given), with ``typed`` filled in; the action
    succeeds and its page says so."""
    hidden = {k: v for k, v in typed.items() if k in ("queue", "schedule")}
    response = _post(client, page_form(_page(client, page), action, **hidden), **typed)
    assert response.status_code == 302, (action, response.status_code, response.text)
    shown = _page(client, response.headers["Location"])
    assert "flash-ok" in shown and "flash-error" not in shown, (action, shown)


def _ids(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job-id="(\d+)">', page)]


def _row(page: str, name: str, kind: str = "queue") -> str:
    return page.split(f'<tr data-{kind}="{html.escape(name)}">')[1].split("</tr>")[0]


def _count(page: str, queue: str, state: str) -> str:
    cell = _row(page, queue).split(f'data-state="{state}">')[1].split("</td>")[0]
    return re.sub(r"<[^>]+>", "", cell).strip()


def _typed(moment: dt.datetime) -> str:
    """``moment`` as an operator types it into a form's UTC time field."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _pool_sessions(bouncer: URL, owner: Engine, role: str) -> list[tuple[Any, ...]]:
    """``SESSION_STATE`` of every server session the pool has open, read through the pool: one
    client per session, each holding its transaction open so that the next gets another."""
    with owner.connect() as connection:
        pids = set(
            connection.execute(
                text(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND usename = :role"
                ),
                {"role": role},
            ).scalars()
        )
    assert pids, "the pool opened no server session"
    conninfo = bouncer.set(drivername="postgresql").render_as_string(hide_password=False)
    clients = [psycopg.connect(conninfo, prepare_threshold=None) for _ in pids]
    try:
        states = [tuple(c.execute(SESSION_STATE).fetchone() or ()) for c in clients]
    finally:
        for client in clients:
            client.close()
    assert {state[0] for state in states} == pids
    return states
