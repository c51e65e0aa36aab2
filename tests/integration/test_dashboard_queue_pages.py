"""The dashboard's Queues and Workers pages through the core's WSGI test client on a real
database: a queue's switches as the page shows them (limit, max depth, rate, key overrides),
its rate limit set and cleared from the page, bad rates refused with nothing written, and the
workers' health summary, tasks and pools."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text
from werkzeug.test import Client, TestResponse

from pgqueue import PgQueue
from pgqueue.dashboard.app import Dashboard


def _client(queue: PgQueue, *, read_only: bool = False) -> Client:
    return Client(Dashboard(queue, secret_key="test", public=True, read_only=read_only))


def _post(client: Client, action: str, **form: str) -> TestResponse:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/queues").text)
    assert found is not None
    return client.post(f"/queues/{action}", data={"csrf_token": found.group(1), **form})


def _row(page: str, name: str) -> str:
    return page.split(f'data-queue="{name}"')[1].split("</tr>")[0]


def test_the_queues_page_shows_every_switch(pgq: PgQueue) -> None:
    pgq.admin.set_queue_limit("mail", 4)
    pgq.admin.set_queue_max_depth("mail", 10_000)
    pgq.admin.set_rate_limit("mail", 30, per=1.5)
    pgq.admin.set_key_limit("account:", 2)
    pgq.admin.set_rate_limit(key="tenant:", limit=5, per=60)

    page = _client(pgq).get("/queues").text
    row = _row(page, "mail")
    for cell in (
        '<td class="limit">4</td>',
        '<td class="num max-depth">10,000</td>',
        '<td class="num rate-limit">30 per 1.5s</td>',
        'name="rate" class="limit-input"',
        'value="30"',
        'value="1.5"',
        'class="clear-rate cancel">Clear</button>',
    ):
        assert cell in row, cell
    overrides = page.split('<table class="key-limits">')[1]
    assert '<td class="num key-limit">2</td>' in overrides.split('data-prefix="tenant:"')[0]
    assert '<td class="num rate-limit">5 per 60s</td>' in overrides

    read_only = _client(pgq, read_only=True).get("/queues").text
    assert "30 per 1.5s" in read_only and "<form" not in read_only.split("<main>")[1]


def test_a_rate_limit_set_and_cleared_from_the_page(pgq: PgQueue) -> None:
    client = _client(pgq)
    pgq.admin.set_queue_limit("mail", 4)

    done = _post(client, "rate", queue="mail", rate="12", per=" 2.5 ")
    assert done.status_code == 302 and done.headers["Location"] == "/queues"
    settings = pgq.admin.queue_settings()["mail"]
    assert (settings.rate_limit, settings.rate_per, settings.concurrency_limit) == (12, 2.5, 4)
    assert "Queue mail: at most 12 of its jobs start per 2.5s." in client.get("/queues").text

    _post(client, "unrate", queue="mail")
    settings = pgq.admin.queue_settings()["mail"]
    assert (settings.rate_limit, settings.rate_per, settings.concurrency_limit) == (None, None, 4)
    assert "Queue mail: rate limit removed." in client.get("/queues").text


@pytest.mark.parametrize(
    ("rate", "per", "problem"),
    [
        ("0", "1", "Queue mail: rate limit must be at least 1, got 0"),
        ("many", "1", "Queue mail: rate limit must be a whole number, got &#39;many&#39;"),
        ("", "1", "Queue mail: rate limit is empty"),
        ("3", "", "Queue mail: the window must be a number of seconds, got &#39;&#39;"),
        ("3", "0", "Queue mail: the window must be more than 0 and at most 86,400 seconds"),
        ("3", "nan", "the window must be more than 0 and at most 86,400 seconds"),
        ("3", "86401", "the window must be more than 0 and at most 86,400 seconds"),
    ],
)
def test_a_bad_rate_is_refused_and_writes_nothing(
    pgq: PgQueue, rate: str, per: str, problem: str
) -> None:
    pgq.admin.set_rate_limit("mail", 7, per=1)
    refused = _post(_client(pgq), "rate", queue="mail", rate=rate, per=per)
    assert refused.status_code == 400
    assert problem in refused.text.split('id="queue-error">')[1].split("</p>")[0]
    settings = pgq.admin.queue_settings()["mail"]
    assert (settings.rate_limit, settings.rate_per) == (7, 1.0)


def test_a_rate_on_a_bad_queue_name_is_refused(pgq: PgQueue) -> None:
    pgq.admin.pause_queue("mail")  # a row with forms, so the page has a CSRF token
    refused = _post(_client(pgq), "rate", queue="no spaces", rate="3", per="1")
    assert refused.status_code == 400 and "queue name" in refused.text
    assert "no spaces" not in pgq.admin.queue_settings()


def test_the_workers_page_sums_up_health_and_names_tasks(pgq: PgQueue) -> None:
    with pgq.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO pgqueue_workers (id, host, pid, queues, concurrency, version,"
                " last_seen_at, claim_error, claim_failing_since, tasks, pool) VALUES"
                " ('ok', 'a', 1, '{}', 2, '1', now(), NULL, NULL, '{t.one,t.two}', 'thread'),"
                " ('failing', 'a', 2, '{}', 2, '1', now(), 'boom', now(), '{t.one}', 'process'),"
                " ('gone', 'b', 3, '{}', 2, '1', now() - interval '1 hour', NULL, NULL, NULL,"
                " NULL)"
            )
        )
    page = _client(pgq).get("/workers").text
    summary = page.split('id="worker-summary">')[1].split("</p>")[0]
    assert summary == "2 live (1 healthy, 1 with failing claims), 1 stale; 2 host(s)."

    def tasks(worker_id: str) -> str:
        row = page.split(f'data-worker-id="{worker_id}"')[1].split("</tr>")[0]
        return row.split('<td class="tasks">')[1].split("</td>")[0]

    assert tasks("ok") == '<span title="t.one, t.two">2 tasks</span>'
    pools = {
        w: page.split(f'data-worker-id="{w}"')[1].split('<td class="pool">')[1].split("</td>")[0]
        for w in ("ok", "failing", "gone")
    }
    assert ">threads</span>" in pools["ok"] and ">processes</span>" in pools["failing"]
    assert "did not record its pool" in pools["gone"]
    assert tasks("failing") == '<span title="t.one">1 task</span>'
    assert "all</span>" in tasks("gone")
    health = {
        w: page.split(f'data-worker-id="{w}"')[1].split('<td class="health">')[1].split("</td>")[0]
        for w in ("ok", "failing", "gone")
    }
    assert health["ok"] == "ok"
    assert health["failing"].startswith('<span class="badge state-failed">claims failing</span>')
    assert health["gone"] == (
        '<span class="badge state-failed" title="no heartbeat for 1m">stale</span>'
    )
