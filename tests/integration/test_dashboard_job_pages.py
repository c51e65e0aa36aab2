"""The dashboard's job pages through the core's WSGI test client (``werkzeug.test.Client``) on a
real database: run now, reschedule, priority and signal from a job's page, each writing its
audit record with the actor; their refusals shown as messages; bad input a 400 that writes
nothing; the CSRF and read-only refusals; what the page shows of a job (timeline, signals,
pgqueue's frames folded); and the job list's search form (found, not found, cut short, bad
input)."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from werkzeug.test import Client, TestResponse

from pgqueue import JobContext, JobState, PgQueue
from pgqueue.admin import JsonMatch
from pgqueue.dashboard import Dashboard

ACTOR = "ada"


@pytest.fixture
def tasks(pgq: PgQueue) -> Iterator[PgQueue]:
    pgq.task(name="pages.echo", queue="pages-q")(_echo)
    pgq.task(name="pages.boom", queue="pages-q", max_attempts=1)(_boom)
    pgq.task(name="pages.approval", queue="pages-q", pass_context=True)(_approval)
    yield pgq


def _approval(ctx: JobContext) -> object:
    return ctx.wait_for_signal("approved", timeout=3600)


def _echo(user_id: int = 0, tags: list[str] | None = None) -> dict[str, int]:
    return {"user": user_id}


def _boom() -> None:
    # Fails inside pgqueue, called from here: the traceback ends in pgqueue's frames.
    JsonMatch.parse("the user's own failure")


def _client(pgq: PgQueue, **options: object) -> Client:
    options.setdefault("public", True)
    dashboard = Dashboard(pgq, secret_key="test-secret", actor=lambda _: ACTOR, **options)  # type: ignore[arg-type]
    return Client(dashboard)


def _later(pgq: PgQueue, hours: int = 1, **kwargs: object) -> int:
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=hours)
    return pgq.registry.get("pages.echo").configure(run_at=run_at).enqueue(**kwargs)


def _token(client: Client, job_id: int) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(f"/jobs/{job_id}").text)
    assert found is not None
    return found.group(1)


def _post(client: Client, job_id: int, action: str, **form: str) -> TestResponse:
    return client.post(f"/jobs/{job_id}/{action}", data=form)


def _flash(client: Client, job_id: int) -> str:
    found = re.search(
        r'class="flash flash-(\w+)"[^>]*>([^<]*)<', client.get(f"/jobs/{job_id}").text
    )
    assert found is not None
    return f"{found.group(1)}: {found.group(2)}"


def test_run_now_reschedule_priority_and_signal_each_write_their_audit_record(
    tasks: PgQueue,
) -> None:
    pgq = tasks
    job_id = _later(pgq, user_id=1)
    client = _client(pgq)
    html = client.get(f"/jobs/{job_id}").text
    for marker in (
        'class="run-now"',
        'id="job-reschedule"',
        'id="job-priority"',
        'id="job-signal"',
    ):
        assert marker in html, marker
    token = _token(client, job_id)

    response = _post(client, job_id, "run_now", csrf_token=token)
    assert response.status_code == 302 and response.location.endswith(f"/jobs/{job_id}")
    assert _flash(client, job_id).startswith(f"ok: Job {job_id} may run now (")
    assert pgq.admin.get_job(job_id).run_at <= dt.datetime.now(dt.UTC)

    target = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=3)).replace(microsecond=0)
    typed = target.strftime("%Y-%m-%dT%H:%M:%S")
    assert _post(client, job_id, "reschedule", csrf_token=token, run_at=typed).status_code == 302
    shown = target.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert _flash(client, job_id) == f"ok: Job {job_id} rescheduled to {shown}."
    assert pgq.admin.get_job(job_id).run_at == target

    assert _post(client, job_id, "priority", csrf_token=token, priority=" -7 ").status_code == 302
    assert _flash(client, job_id) == f"ok: Job {job_id} now has priority -7."
    assert pgq.admin.get_job(job_id).priority == -7

    sent = _post(client, job_id, "signal", csrf_token=token, name="go", payload='{"ok": [1, 2]}')
    assert sent.status_code == 302
    assert _flash(client, job_id) == f"ok: Signal &#39;go&#39; sent to job {job_id}."
    again = _post(client, job_id, "signal", csrf_token=token, name="go", payload="3")
    assert again.status_code == 302
    assert _flash(client, job_id).startswith(f"error: Job {job_id} already has a signal")
    page = client.get(f"/jobs/{job_id}").text
    assert re.search(r'class="signal-name">go</td>', page)
    assert "&#34;ok&#34;: [\n    1,\n    2\n  ]" in page

    entries = pgq.admin.audit_log().entries
    assert [(e.action, e.actor, e.source) for e in entries] == [
        ("signal", ACTOR, "dashboard"),
        ("set_priority", ACTOR, "dashboard"),
        ("reschedule", ACTOR, "dashboard"),
        ("run_now", ACTOR, "dashboard"),
    ]
    assert entries[0].target == {"job_id": job_id, "signal": "go"}
    assert entries[1].target == {"job_id": job_id, "priority": -7}
    assert entries[2].target == {"job_id": job_id, "run_at": target.isoformat()}


def test_a_finished_job_offers_no_edit_and_refuses_one_with_a_message(tasks: PgQueue) -> None:
    pgq = tasks
    job_id = pgq.registry.get("pages.echo").enqueue(user_id=2)
    pgq.run_worker(queues=["pages-q"], drain=True)
    assert pgq.admin.get_job(job_id).state is JobState.SUCCEEDED
    client = _client(pgq)
    html = client.get(f"/jobs/{job_id}").text
    for marker in (
        'class="run-now"',
        'id="job-reschedule"',
        'id="job-priority"',
        'id="job-signal"',
    ):
        assert marker not in html, marker
    token = _token(client, job_id)
    refusals = {
        "run_now": {},
        "reschedule": {"run_at": "2030-01-01T00:00"},
        "priority": {"priority": "3"},
        "signal": {"name": "go"},
    }
    for action, form in refusals.items():
        response = _post(client, job_id, action, csrf_token=token, **form)
        assert response.status_code == 302, action
        flash = _flash(client, job_id)
        assert flash.startswith("error: cannot "), (action, flash)
        assert "succeeded" in flash, (action, flash)
    assert pgq.admin.audit_log().entries == ()
    assert pgq.admin.get_job(job_id).priority == 0


def test_bad_input_answers_400_with_the_message_and_writes_nothing(tasks: PgQueue) -> None:
    pgq = tasks
    job_id = _later(pgq)
    before = pgq.admin.get_job(job_id)
    client = _client(pgq)
    token = _token(client, job_id)
    cases = [
        ("reschedule", {"run_at": "tomorrow"}, "run_at must be a date and time in UTC"),
        ("reschedule", {"run_at": ""}, "run_at is empty"),
        ("reschedule", {"run_at": "2999-01-01T00:00"}, "run_at"),
        ("priority", {"priority": "high"}, "priority must be a whole number, got &#39;high&#39;"),
        ("priority", {"priority": "40000"}, "priority"),
        ("signal", {"name": "go", "payload": "{bad"}, "payload is not JSON"),
        ("signal", {"name": "", "payload": "1"}, "signal"),
    ]
    for action, form, message in cases:
        response = _post(client, job_id, action, csrf_token=token, **form)
        assert response.status_code == 400, (action, form)
        problem = re.search(r'id="job-problem"[^>]*>([^<]*)<', response.text)
        assert problem is not None and message in problem.group(1), (action, form, response.text)
    after = pgq.admin.get_job(job_id)
    assert (after.run_at, after.priority) == (before.run_at, before.priority)
    assert pgq.admin.job_signals(job_id).received == ()
    assert pgq.admin.audit_log().entries == ()


def test_each_new_action_refuses_a_missing_or_forged_csrf_token(tasks: PgQueue) -> None:
    pgq = tasks
    job_id = _later(pgq)
    client = _client(pgq)
    client.get(f"/jobs/{job_id}")
    forms = {
        "run_now": {},
        "reschedule": {"run_at": "2030-01-01T00:00"},
        "priority": {"priority": "3"},
        "signal": {"name": "go"},
    }
    for action, form in forms.items():
        for token in (None, "forged"):
            data = form if token is None else {**form, "csrf_token": token}
            response = _post(client, job_id, action, **data)
            assert response.status_code == 400, (action, token)
            assert "CSRF token missing or invalid" in response.text
    assert pgq.admin.audit_log().entries == ()
    assert pgq.admin.job_signals(job_id).received == ()


def test_read_only_shows_no_action_and_refuses_each(tasks: PgQueue) -> None:
    pgq = tasks
    job_id = _later(pgq)
    client = _client(pgq, read_only=True)
    html = client.get(f"/jobs/{job_id}").text
    assert 'method="post"' not in html
    for action in ("run_now", "reschedule", "priority", "signal", "cancel"):
        assert _post(client, job_id, action, csrf_token="x").status_code == 403, action
    assert pgq.admin.audit_log().entries == ()


def test_the_page_shows_the_timeline_signals_and_the_users_frames_first(
    tasks: PgQueue,
) -> None:
    pgq = tasks
    failed = pgq.registry.get("pages.boom").enqueue()
    pgq.run_worker(queues=["pages-q"], drain=True)
    client = _client(pgq)
    html = client.get(f"/jobs/{failed}").text
    timeline = re.search(r'<ol class="timeline" id="job-timeline">(.*?)</ol>', html, re.S)
    assert timeline is not None
    whats = re.findall(r'class="what">([^<]*)<', timeline.group(1))
    assert whats == ["created", "attempt 1 started", "attempt 1 failed", "failed"]
    assert "ValidationError: a JSON match is PATH=JSON" in timeline.group(1)
    # The handler's own frame shows; the frames inside pgqueue it called fold away.
    errors = html[html.index("<h2>Errors</h2>") :]
    parts = re.findall(
        r'(<details class="internal-frames"><summary[^>]*>(\d+) pgqueue frames?</summary>)?'
        r'<pre class="traceback">([^<]*)</pre>',
        errors,
    )
    assert [bool(folded) for folded, _, _ in parts] == [False, True, False]
    assert parts[0][2].startswith("Traceback (most recent call last):")
    assert "in _boom" in parts[0][2] and "/pgqueue/" not in parts[0][2]
    assert int(parts[1][1]) >= 1 and "job_search.py" in parts[1][2]
    assert parts[2][2].startswith("pgqueue.errors.ValidationError: a JSON match")

    waiting = _later(pgq)
    assert pgq.admin.signal(waiting, "early", {"n": 1}) is True
    page = client.get(f"/jobs/{waiting}").text
    assert 'class="signal-name">early</td>' in page
    assert "None received." not in page
    quiet = client.get(f"/jobs/{_later(pgq)}").text
    assert "None received." in quiet
    assert asyncio.run(pgq.admin.ajob_signals(waiting)) == pgq.admin.job_signals(waiting)


def test_a_suspended_job_says_what_it_waits_for_and_offers_its_signal(tasks: PgQueue) -> None:
    pgq = tasks
    job_id = pgq.registry.get("pages.approval").enqueue()
    pgq.run_worker(queues=["pages-q"], drain=True)
    signals = pgq.admin.job_signals(job_id)
    assert (signals.suspended, signals.waiting_for, signals.arrived) == (True, "approved", False)
    client = _client(pgq)
    html = client.get(f"/jobs/{job_id}").text
    waiting = re.search(r'id="job-waiting">([^<]*)<', html)
    assert waiting is not None
    assert waiting.group(1).startswith("waiting for signal &#39;approved&#39; until ")
    assert re.search(r'<input name="name" value="approved" required>', html)
    # A suspended job's time is its wait's deadline: the signal moves it, not a reschedule.
    assert 'class="run-now"' not in html and 'id="job-reschedule"' not in html
    assert 'id="job-priority"' in html
    token = _token(client, job_id)
    sent = _post(client, job_id, "signal", csrf_token=token, name="approved", payload="true")
    assert sent.status_code == 302
    assert pgq.admin.job_signals(job_id).arrived is True
    pgq.run_worker(queues=["pages-q"], drain=True)
    done = pgq.admin.get_job(job_id)
    assert (done.state, done.result) == (JobState.SUCCEEDED, True)


def _search(client: Client, **query: str) -> TestResponse:
    return client.get("/jobs?" + urlencode(query))


def _ids(response: TestResponse) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job-id="(\d+)">', response.text)]


def test_search_by_id_task_state_and_json_finds_and_links(tasks: PgQueue) -> None:
    pgq = tasks
    echo = pgq.registry.get("pages.echo")
    first = echo.enqueue(user_id=42, tags=["vip", "eu"])
    second = echo.enqueue(user_id=7)
    client = _client(pgq)
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")

    found = _search(client, json="kwargs.user_id=42", since=since)
    assert found.status_code == 200 and _ids(found) == [first]
    assert "searched the whole window (2 jobs)" in found.text
    assert _ids(_search(client, json='kwargs.tags=["vip"]', match="contains", since=since)) == [
        first
    ]
    none = _search(client, json="kwargs.user_id=43", since=since)
    assert none.status_code == 200 and _ids(none) == [] and "No jobs match." in none.text
    assert _ids(_search(client, id=str(second))) == [second]
    assert _ids(_search(client, id=str(second), task="pages.boom")) == []
    assert _ids(_search(client, state="queued", task="pages.echo")) == [second, first]

    # No window given: the last 24 hours, shown in the form and carried by the links.
    defaulted = _search(client, json="kwargs.user_id=7")
    assert _ids(defaulted) == [second]
    shown = re.search(r'name="since" value="([^"]+)"', defaulted.text)
    assert shown is not None
    moment = dt.datetime.fromisoformat(shown.group(1)).replace(tzinfo=dt.UTC)
    expected = dt.datetime.now(dt.UTC) - dt.timedelta(hours=24)
    assert abs((moment - expected).total_seconds()) < 60
    assert 'id="search-window"' in defaulted.text


def test_a_search_cut_short_says_so_and_links_its_continuation(tasks: PgQueue) -> None:
    pgq = tasks
    echo = pgq.registry.get("pages.echo")
    ids = [echo.enqueue(user_id=i % 2) for i in range(6)]
    client = _client(pgq)
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    first = _search(client, json="kwargs.user_id=0", since=since, scan="3")
    assert _ids(first) == [ids[4]]
    extent = re.search(r'id="search-extent">([^<]*)', first.text)
    assert extent is not None and extent.group(1).startswith(
        "searched the newest 3 jobs of the window"
    )
    link = re.search(r'id="search-continue" href="([^"]+)"', first.text)
    assert link is not None
    rest = client.get(link.group(1).replace("&amp;", "&").removeprefix("http://localhost"))
    assert rest.status_code == 200
    assert _ids(rest) == [ids[2], ids[0]]


def test_bad_search_input_answers_400_with_the_message(tasks: PgQueue) -> None:
    pgq = tasks
    client = _client(pgq)
    cases = [
        ({"json": "nope.x=1"}, "must start with args, kwargs, result"),
        ({"json": "kwargs.user_id=not json"}, "is not JSON"),
        ({"json": "kwargs.user_id"}, "a JSON match is PATH=JSON"),
        ({"since": "yesterday"}, "since must be a date and time in UTC"),
        ({"since": "2026-02-01T00:00", "until": "2026-01-01T00:00"}, "must be before until"),
        ({"id": "abc"}, "id must be a job id"),
        ({"state": "sleeping"}, "unknown state"),
        ({"time": "updated_at"}, "time must be one of created_at, finished_at"),
        ({"error": "x", "scan": "0"}, "scan must be an int from 1"),
        ({"task": "a\x00b"}, "task must not contain a NUL character"),
        ({"error": "x" * 10_001}, "error must be at most 10000 characters"),
    ]
    for query, message in cases:
        response = _search(client, **query)
        assert response.status_code == 400, query
        shown = re.search(r'id="search-error"[^>]*>([^<]*)<', response.text)
        assert shown is not None and message in shown.group(1), (query, response.text[:300])
        assert 'id="job-search"' in response.text
