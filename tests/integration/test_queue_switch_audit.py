"""The queue and concurrency-key switches audited: each switch thrown through ``pgq.admin``
writes exactly one audit record (actor, source, action, and the queue or key prefix with the
value written) with the switch; a refused one (a bad value, queue name or actor) writes
neither. Thrown from the CLI (source ``cli``, ``--actor``) and from the dashboard's queues page
(the request's actor, source ``dashboard``), and shown on the audit page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine
from support.audit import audit_rows
from werkzeug.test import Client

from pgqueue import PgQueue, ValidationError, cli
from pgqueue.admin import default_actor
from pgqueue.dashboard.app import Dashboard


def _records(engine: Engine) -> list[tuple[Any, ...]]:
    return audit_rows(engine, "actor", "source", "action", "filter", "count")


def test_each_switch_writes_one_audit_record_with_its_value(pgq: PgQueue, engine: Engine) -> None:
    admin = pgq.admin
    admin.pause_queue("mail", actor="ada")
    admin.resume_queue("mail", actor="ada", source="cli")
    admin.set_queue_limit("mail", 4, actor="ada", source="dashboard")
    admin.set_queue_limit("mail", None, actor="ada")
    admin.set_queue_max_depth("mail", 100)
    admin.set_key_limit("account:", 2, actor="bob")
    admin.set_rate_limit("mail", 30, per=1.5, actor="bob")
    admin.set_rate_limit(key="tenant:", limit=5, per=60, actor="bob")
    admin.set_rate_limit("mail", None, actor="bob")
    me = default_actor()
    assert _records(engine) == [
        ("ada", "api", "pause_queue", {"queue": "mail"}, 1),
        ("ada", "cli", "resume_queue", {"queue": "mail"}, 1),
        ("ada", "dashboard", "set_queue_limit", {"queue": "mail", "limit": 4}, 1),
        ("ada", "api", "set_queue_limit", {"queue": "mail", "limit": None}, 1),
        (me, "api", "set_queue_max_depth", {"queue": "mail", "max_depth": 100}, 1),
        ("bob", "api", "set_key_limit", {"key_prefix": "account:", "limit": 2}, 1),
        ("bob", "api", "set_rate_limit", {"queue": "mail", "rate_limit": 30, "per": 1.5}, 1),
        ("bob", "api", "set_rate_limit", {"key_prefix": "tenant:", "rate_limit": 5, "per": 60}, 1),
        ("bob", "api", "set_rate_limit", {"queue": "mail", "rate_limit": None, "per": None}, 1),
    ]
    entries = admin.audit_log().entries
    assert [(e.queue, e.key_prefix) for e in entries[:3]] == [
        ("mail", None),
        (None, "tenant:"),
        ("mail", None),
    ]


@pytest.mark.parametrize(
    ("switch", "positional", "keywords"),
    [
        ("pause_queue", ("",), {}),
        ("pause_queue", ("mail",), {"actor": ""}),
        ("resume_queue", ("mail",), {"actor": "x" * 201}),
        ("resume_queue", ("mail",), {"source": "web"}),
        ("set_queue_limit", ("mail", 0), {}),
        ("set_queue_limit", ("mail", True), {}),
        ("set_queue_max_depth", ("mail", -1), {}),
        ("set_queue_max_depth", ("mail", 5), {"on_full": "drop"}),
        ("set_key_limit", ("", 3), {}),
        ("set_key_limit", ("account:", 2), {"actor": "a\x00b"}),
        ("set_rate_limit", ("mail", 5), {}),
        ("set_rate_limit", ("mail", 5), {"per": 0}),
        ("set_rate_limit", (None, 5), {"per": 1}),
    ],
)
def test_a_refused_switch_writes_nothing(
    pgq: PgQueue,
    engine: Engine,
    switch: str,
    positional: tuple[Any, ...],
    keywords: dict[str, Any],
) -> None:
    pgq.admin.set_queue_limit("mail", 3, actor="ada")
    thrown = [("ada", "api", "set_queue_limit", {"queue": "mail", "limit": 3}, 1)]
    assert _records(engine) == thrown
    with pytest.raises(ValidationError):
        getattr(pgq.admin, switch)(*positional, **keywords)
    assert _records(engine) == thrown
    settings = pgq.admin.queue_settings()
    assert list(settings) == ["mail"] and not settings["mail"].paused
    assert settings["mail"].max_depth is None and settings["mail"].rate_limit is None
    assert settings["mail"].concurrency_limit == 3 and pgq.admin.key_overrides() == []


def test_the_cli_audits_its_switches_and_writes_nothing_when_it_refuses(
    pgq: PgQueue, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DATABASE_URL", pgq.url.render_as_string(hide_password=False))
    runner = CliRunner()

    def invoke(*args: str) -> int:
        return runner.invoke(cli.main, list(args)).exit_code

    assert invoke("pause", "mail", "--new", "--actor", "ops-ada") == 0
    assert invoke("limit", "mail", "3", "--actor", "ops-ada") == 0
    assert invoke("max-depth", "mail", "none") == 0
    assert invoke("key-limit", "account:", "2") == 0
    assert invoke("rate-limit", "mail", "5", "--per", "2") == 0
    assert invoke("resume", "mail") == 0
    refusals = [
        ("pause", "mial"),  # a typo: no such queue
        ("limit", "mail", "0"),
        ("rate-limit", "mail", "5"),  # no window
        ("pause", "mail", "--actor", ""),
    ]
    for refused in refusals:
        assert invoke(*refused) != 0, refused
    me = default_actor()
    assert [row[:3] for row in _records(engine)] == [
        ("ops-ada", "cli", "pause_queue"),
        ("ops-ada", "cli", "set_queue_limit"),
        (me, "cli", "set_queue_max_depth"),
        (me, "cli", "set_key_limit"),
        (me, "cli", "set_rate_limit"),
        (me, "cli", "resume_queue"),
    ]


def test_the_queues_page_audits_its_switches_with_the_actor_and_shows_them(
    pgq: PgQueue, engine: Engine
) -> None:
    client = Client(Dashboard(pgq, secret_key="test", public=True, actor=lambda _: "ada"))
    pgq.admin.set_queue_limit("mail", 2, actor="setup")

    def post(action: str, **form: str) -> int:
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/queues").text)
        assert token is not None
        data = {"csrf_token": token.group(1), "queue": "mail", **form}
        return client.post(f"/queues/{action}", data=data).status_code

    assert post("pause") == 302
    assert post("limit", limit="7") == 302
    assert post("rate", rate="12", per="2.5") == 302
    assert post("unrate") == 302
    assert post("unlimit") == 302
    assert post("resume") == 302
    # Refused by the form's checks or the admin API's: nothing written.
    assert post("limit", limit="0") == 400
    assert post("rate", rate="3", per="-1") == 400
    assert post("pause", queue="no spaces") == 400
    read_only = Client(Dashboard(pgq, secret_key="test", public=True, read_only=True))
    assert read_only.post("/queues/pause", data={"queue": "mail"}).status_code == 403
    assert [row[:4] for row in _records(engine)[1:]] == [
        ("ada", "dashboard", "pause_queue", {"queue": "mail"}),
        ("ada", "dashboard", "set_queue_limit", {"queue": "mail", "limit": 7}),
        (
            "ada",
            "dashboard",
            "set_rate_limit",
            {"queue": "mail", "rate_limit": 12, "per": 2.5},
        ),
        ("ada", "dashboard", "set_rate_limit", {"queue": "mail", "rate_limit": None, "per": None}),
        ("ada", "dashboard", "set_queue_limit", {"queue": "mail", "limit": None}),
        ("ada", "dashboard", "resume_queue", {"queue": "mail"}),
    ]

    pgq.admin.set_key_limit("account:", 3, actor="setup")
    page = client.get("/audit").text
    rows = page.split("<tbody>")[1].split("</tr>")
    target = [row.split('<td class="target">')[1].split("</td>")[0] for row in rows[:-1]]
    details = [row.split('<td class="details">')[1].split("</td>")[0] for row in rows[:-1]]
    assert target[0] == "keys <code>account:*</code>"
    assert target[1] == 'queue <a href="/queues">mail</a>'
    assert details[0] == "<code>{&#34;limit&#34;: 3}</code>"
    assert details[2] == "<code>{&#34;limit&#34;: null}</code>"
    assert details[4] == "<code>{&#34;per&#34;: 2.5, &#34;rate_limit&#34;: 12}</code>"
