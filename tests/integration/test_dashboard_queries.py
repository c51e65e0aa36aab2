"""The dashboard's reads with a long history: every page reads a bounded part of an index.

With 200,000 finished jobs (and a few waiting, failed, cancelled and hand-named ones), each
statement the overview, the job list under every kind of filter and paging, and a job's page
send is run under ``EXPLAIN ANALYZE`` on pgqueue's own engine: none scans ``pgqueue_jobs``
sequentially, and none reads more than a fraction of its rows (a full pass would read them
all). A second test checks the filtered, paged lists return exactly the right jobs. Both only
read, so they share one database with that history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from server_databases import create_database, drop_database
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.plans import executed_plans

from pgqueue import JobState
from pgqueue.admin import ListArguments
from pgqueue.contrib.flask import PgQueue
from pgqueue.data import admin as admin_data
from pgqueue.db import executor_for

HISTORY = 200_000
MOST_ROWS_A_PAGE_STATEMENT_MAY_READ = HISTORY // 8

pgq = PgQueue()


@pgq.task(name="bulk.work", queue="bulk")
def work(n: int) -> int:
    return n


def _insert_history(connection: Connection) -> None:
    # The long tail every dashboard user has: finished jobs of two busy tasks in two queues,
    # and among them the few running ones a live fleet has (which the state indexes leave out).
    connection.execute(
        text(
            """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, started_at,
                                         finished_at, updated_at, result, args, lease_owner,
                                         lease_token, lease_expires_at)
               SELECT CASE WHEN i % 3 = 0 THEN 'mail.send' ELSE 'bulk.work' END,
                      CASE WHEN i % 3 = 0 THEN 'mail' ELSE 'bulk' END,
                      state, 1, now() - (i || ' seconds')::interval,
                      CASE WHEN state <> 'running' THEN now() - (i || ' seconds')::interval END,
                      now(), to_json(i), json_build_array(i),
                      CASE WHEN state = 'running' THEN 'worker-1' END,
                      CASE WHEN state = 'running' THEN gen_random_uuid() END,
                      CASE WHEN state = 'running' THEN now() + interval '1 hour' END
               FROM generate_series(1, :n) AS i,
                    LATERAL (SELECT CASE WHEN i % 1009 = 0 THEN 'running'
                                         WHEN i % 97 = 0 THEN 'failed'
                                         WHEN i % 89 = 0 THEN 'cancelled'
                                         ELSE 'succeeded' END AS state) AS s"""
        ),
        {"n": HISTORY},
    )
    # A rare queue, a rare task and a rare combination the filters must find quickly; a queue
    # and a task whose only jobs run.
    connection.execute(
        text(
            """INSERT INTO pgqueue_jobs (task_name, queue, state, args)
               VALUES ('rare.task', 'rare', 'queued', '[1]'),
                      ('rare.task', 'bulk', 'failed', '[2]'),
                      ('bulk.work', 'rare', 'retrying', '[3]'),
                      ('<script>x</script>', '[/x]', 'waiting', '[4]'),
                      ('live.task', 'live', 'running', '[5]'),
                      ('bulk.work', 'bulk', 'running', '[6]'),
                      ('live.task', 'live', 'running', '[7]')"""
        )
    )


def _prepare(database_url: URL, fill: Callable[[Connection], None]) -> None:
    """``fill`` the jobs table, then analyse it, with autovacuum off for the test's life."""
    setup = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with setup.connect() as connection:
            # No vacuum: a busy table's visibility map lags, so the planner cannot count on
            # index-only scans (the harder case for it), but it knows the table's statistics.
            connection.execute(text("ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)"))
            fill(connection)
            connection.execute(text("ANALYZE pgqueue_jobs"))
    finally:
        setup.dispose()


@pytest.fixture(scope="module")
def history_url(server_url: URL, template_name: str) -> Iterator[URL]:
    """A new database with the long history (``_insert_history``), analysed."""
    url = create_database(server_url, template_name)
    _prepare(url, _insert_history)
    yield url
    drop_database(server_url, url)


@pytest.fixture(scope="module")
def app(history_url: URL) -> Iterator[Flask]:
    # The throughput chart reads the newest finished jobs up to its cap, however long ago they
    # finished (test_dashboard_throughput.py); a cap under this test's bound keeps that read a
    # fraction of the history here, as the default's 50,000 is of a real one.
    cap = MOST_ROWS_A_PAGE_STATEMENT_MAY_READ // 2
    with dashboard_app(
        pgq, history_url, "dashboard_queries", PGQUEUE_DASHBOARD_THROUGHPUT_CAP=cap
    ) as app:
        yield app


def _statements_of_pages(
    app: Flask, pages: list[str]
) -> tuple[list[tuple[str, str, dict[str, Any]]], dict[str, str]]:
    """Each of ``pages`` loaded once: the ``(page, statement, parameters)`` sent on the jobs
    table for it, and each page's text."""
    engine = pgq.state(app).queue.engine
    sent: list[tuple[str, str, dict[str, Any]]] = []
    texts: dict[str, str] = {}
    page = ""

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if "pgqueue_jobs" in statement:
            sent.append((page, statement, dict(parameters or {})))

    event.listen(engine, "before_cursor_execute", record)
    client = app.test_client()
    try:
        for page in pages:
            response = client.get(page)
            assert response.status_code == 200, (page, response.text[:500])
            texts[page] = response.text
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return sent, texts


PAGES = [
    "/pgqueue/",
    "/pgqueue/jobs",
    "/pgqueue/jobs?queue=rare",
    "/pgqueue/jobs?queue=bulk",
    "/pgqueue/jobs?queue=bulk&state=failed",
    "/pgqueue/jobs?queue=mail&state=retrying",
    "/pgqueue/jobs?state=failed",
    "/pgqueue/jobs?state=waiting",
    "/pgqueue/jobs?task=rare.task",
    "/pgqueue/jobs?task=bulk.work",
    "/pgqueue/jobs?task=bulk.work&state=cancelled",
    "/pgqueue/jobs?task=rare.task&queue=bulk",
    "/pgqueue/jobs?task=mail.send&state=queued",
    "/pgqueue/jobs?queue=bulk&before=100000",
    "/pgqueue/jobs?state=succeeded&after=1000",
    "/pgqueue/jobs?task=bulk.work&before=150000",
    "/pgqueue/jobs?state=running",
    "/pgqueue/jobs?queue=live",
    "/pgqueue/jobs?queue=bulk&state=running",
    "/pgqueue/jobs?task=live.task&state=running",
    "/pgqueue/jobs?task=bulk.work&state=running&before=150000",
    "/pgqueue/jobs/100",
]


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child)


def _on_jobs(node: dict[str, Any]) -> bool:
    if node.get("Relation Name") == "pgqueue_jobs":
        return True
    return str(node.get("Index Name", "")).startswith(("ix_pgqueue_jobs", "pk_pgqueue_jobs"))


@pytest.mark.slow
def test_no_page_reads_the_history(app: Flask) -> None:
    queue = pgq.state(app).queue
    sent, _ = _statements_of_pages(app, PAGES)
    assert {p for p, _, _ in sent} == set(PAGES)  # every page did read jobs

    with queue.engine.connect() as connection:
        assert plan_problems(connection, sent, MOST_ROWS_A_PAGE_STATEMENT_MAY_READ) == []


def plan_problems(
    connection: Connection, sent: list[tuple[str, str, dict[str, Any]]], most_rows: int
) -> list[tuple[str, str, str]]:
    """``(label, plan kind, problem)`` for each of the ``(label, statement, parameters)`` sent
    whose custom or generic plan scans ``pgqueue_jobs`` sequentially or reads more than
    ``most_rows`` of its rows (index entries included)."""
    problems = []
    for label, statement, parameters in sent:
        for kind, explained in executed_plans(connection, statement, parameters):
            plan = explained["Plan"]
            read = 0
            for node in _scans(plan):
                if not _on_jobs(node):
                    continue
                if node["Node Type"] == "Seq Scan":
                    problems.append((label, kind, "sequential scan of pgqueue_jobs"))
                read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node[
                    "Actual Loops"
                ]
            if read > most_rows:
                problems.append((label, kind, f"read {read:.0f} rows of pgqueue_jobs"))
    return problems


@pytest.fixture
def history_engine(history_url: URL) -> Iterator[Engine]:
    engine = create_engine(history_url)
    yield engine
    engine.dispose()


@pytest.mark.slow
def test_filtered_pages_hold_exactly_the_matching_jobs(app: Flask, history_engine: Engine) -> None:
    engine = history_engine
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT id, queue, state, task_name FROM pgqueue_jobs WHERE id > :low"),
            {"low": HISTORY - 400},
        ).all()
    # Keep paging cheap to check: the filters below only ever match the newest few hundred rows
    # or the rare ones, which were inserted last.
    queue = pgq.state(app).queue
    cases: list[dict[str, Any]] = [
        {"queue": "rare"},
        {"queue": "bulk", "state": JobState.FAILED},
        {"state": JobState.CANCELLED},
        {"state": JobState.WAITING},
        {"task_name": "rare.task"},
        {"task_name": "rare.task", "queue": "bulk"},
        {"task_name": "mail.send", "state": JobState.FAILED},
        {"queue": "mail"},
        {"state": JobState.RUNNING},
        {"queue": "bulk", "state": JobState.RUNNING},
        {"queue": "live"},
        {"task_name": "live.task", "state": JobState.RUNNING},
        {"task_name": "bulk.work", "queue": "bulk", "state": JobState.RUNNING},
    ]
    for case in cases:
        expected = [
            r.id
            for r in sorted(rows, key=lambda r: -r.id)
            if (case.get("queue") in (None, r.queue))
            and (case.get("state") in (None, JobState(r.state)))
            and (case.get("task_name") in (None, r.task_name))
        ]
        with queue.sessions() as session:
            newest = admin_data.list_jobs(session, ListArguments(**case, limit=7))
            got = [j.id for j in newest]
            # Walk older pages (only through the rows fetched above), then one page back.
            while len(got) < len(expected) and newest:
                newest = admin_data.list_jobs(
                    session, ListArguments(**case, before=got[-1], limit=7)
                )
                got += [j.id for j in newest]
            assert got[: len(expected)] == expected, case
            if len(expected) > 7:
                back = admin_data.list_jobs(
                    session, ListArguments(**case, after=expected[9], limit=3)
                )
                assert [j.id for j in back] == expected[6:9], case
    with queue.sessions() as session:
        assert admin_data.job_queues(executor_for(session)) == [
            "[/x]",
            "bulk",
            "live",
            "mail",
            "rare",
        ]
        counts = admin_data.capped_state_counts(executor_for(session), 1000)
        few = admin_data.capped_state_counts(executor_for(session), 5)
    with engine.connect() as connection:
        running_per_queue = dict(
            connection.execute(
                text(
                    "SELECT queue, count(*) FROM pgqueue_jobs WHERE state = 'running'"
                    " GROUP BY queue"
                )
            ).all()
        )
    assert running_per_queue["bulk"] > 5 and running_per_queue["live"] == 2
    for name, running in running_per_queue.items():
        assert counts[name][JobState.RUNNING] == running, name
        assert few[name][JobState.RUNNING] == min(running, 5), name
    assert counts["live"][JobState.QUEUED] == 0
    assert counts["rare"][JobState.RUNNING] == 0
    assert counts["rare"][JobState.QUEUED] == 1
    assert counts["rare"][JobState.SUCCEEDED] == 0
    assert counts["bulk"][JobState.SUCCEEDED] == 1000  # stopped at the cap
    assert counts["bulk"][JobState.FAILED] == 1000
    assert counts["[/x]"][JobState.WAITING] == 1


@pytest.mark.slow
def test_a_busy_queue_without_running_jobs_is_listed_off_the_lease_index(
    database_url: URL,
) -> None:
    # Two equally busy queues, running jobs in one only: for the other, a walk of the primary
    # key looking for its running jobs (a match expected every few hundred rows) finds none and
    # reads the whole history.
    _prepare(database_url, _insert_quiet_and_busy_queues)
    page = "/pgqueue/jobs?queue=quiet"
    with dashboard_app(pgq, database_url, "dashboard_quiet_queue") as app:
        sent, texts = _statements_of_pages(app, [page])
        assert texts[page].count("bulk.work") >= 50  # a full page of the quiet queue's jobs
        with pgq.state(app).queue.engine.connect() as connection:
            assert plan_problems(connection, sent, MOST_ROWS_A_PAGE_STATEMENT_MAY_READ) == []


def _insert_quiet_and_busy_queues(connection: Connection) -> None:
    connection.execute(
        text(
            """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, started_at,
                                         finished_at, updated_at, args, lease_owner,
                                         lease_token, lease_expires_at)
               SELECT 'bulk.work', CASE WHEN i % 2 = 0 THEN 'busy' ELSE 'quiet' END,
                      state, 1, now(), CASE WHEN state = 'succeeded' THEN now() END,
                      now(), '[]', CASE WHEN state = 'running' THEN 'worker-1' END,
                      CASE WHEN state = 'running' THEN gen_random_uuid() END,
                      CASE WHEN state = 'running' THEN now() + interval '1 hour' END
               FROM generate_series(1, :n) AS i,
                    LATERAL (SELECT CASE WHEN i % 2 = 0 AND i % 100 = 0 THEN 'running'
                                         ELSE 'succeeded' END AS state) AS s"""
        ),
        {"n": HISTORY},
    )
