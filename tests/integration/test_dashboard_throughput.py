"""The throughput chart's reads on a busy hour: bounded by the read cap, never the whole hour.

300,000 jobs finished in the last ten minutes (500 a second; written by ``generate_series``,
as the statements' plans are what is tested). The overview's throughput statements run under
``EXPLAIN ANALYZE``, as first sent and as generic plans: none scans ``pgqueue_jobs``
sequentially and none reads more index entries than the cap allows. The figures are right for
the shortened window, and with a cap above the hour's jobs the whole hour is counted exactly.
The busy hour is written once per module, into a database each case's own database copies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from server_databases import create_database, drop_database
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from test_dashboard_queries import plan_problems

import pgqueue
from pgqueue import JobState
from pgqueue.admin import DEFAULT_THROUGHPUT_CAP
from pgqueue.contrib.flask import PgQueue
from pgqueue.contrib.flask.dashboard import init_dashboard
from pgqueue.data.admin import BUCKET_WIDTHS
from pgqueue.errors import ConfigurationError

BUSY = 300_000
PER_SECOND = 500  # BUSY jobs over the last 600 seconds

BUSY_HOUR = text(
    """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, started_at, finished_at,
                                 updated_at, args)
       SELECT 'busy.work', CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END,
              CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
              now() - make_interval(secs => i / 500.0),
              now() - make_interval(secs => i / 500.0), now(), '[]'
       FROM generate_series(1, :n) AS i"""
)

# Each busy-hour job written again, as the claim and the outcome write it: three row versions
# per job, as on a table autovacuum has not reached yet.
REWRITE = text("UPDATE pgqueue_jobs SET updated_at = updated_at")

pgq = PgQueue()


@pytest.fixture(scope="module")
def busy_hour(server_url: URL, template_name: str) -> Iterator[str]:
    """A migrated database holding the busy hour, never analysed: the template of each case's
    database (a copy keeps the table's pages, its index entries and its unset statistics)."""
    url = create_database(server_url, template_name)
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)"))
            connection.execute(BUSY_HOUR, {"n": BUSY})
    finally:
        engine.dispose()
    yield str(url.database)
    drop_database(server_url, url)


@pytest.fixture(params=["analysed", "not analysed yet"])
def app(request: pytest.FixtureRequest, server_url: URL, busy_hour: str) -> Iterator[Flask]:
    # "not analysed yet": the busy hour as workers leave it, before autovacuum first analyses
    # the table, so the planner guesses from the table's pages how many jobs a window holds.
    database_url = create_database(server_url, busy_hour)
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            if request.param == "analysed":
                connection.execute(text("ANALYZE pgqueue_jobs"))
            else:
                connection.execute(REWRITE)
                connection.execute(REWRITE)
        with dashboard_app(pgq, database_url, "dashboard_throughput") as app:
            yield app
    finally:
        engine.dispose()
        drop_database(server_url, database_url)


@pytest.mark.slow
def test_busy_hour_reads_at_most_the_cap(app: Flask) -> None:
    queue = pgq.state(app).queue
    sent: list[tuple[str, dict[str, Any]]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if "finished_at" in statement and "pgqueue_jobs" in statement:
            sent.append((statement, dict(parameters or {})))

    event.listen(queue.engine, "before_cursor_execute", record)
    try:
        response = app.test_client().get("/pgqueue/")
    finally:
        event.remove(queue.engine, "before_cursor_execute", record)
    assert response.status_code == 200
    assert "most recent jobs only" in response.text
    assert len(sent) == 1  # one pass: the window, the counts and the wait times

    labelled = [(f"statement {n}", st, params) for n, (st, params) in enumerate(sent)]
    # The cap's index entries to size the window (index-only), then the window's rows: at most
    # the cap's again.
    with queue.engine.connect() as connection:
        assert plan_problems(connection, labelled, 2 * DEFAULT_THROUGHPUT_CAP) == []

    since_written = text("SELECT extract(epoch FROM now() - max(finished_at)) FROM pgqueue_jobs")
    with queue.engine.connect() as connection:
        before = float(connection.scalar(since_written))
    throughput = queue.admin.recent_throughput()
    with queue.engine.connect() as connection:
        after = float(connection.scalar(since_written))
    assert throughput.shortened
    # 50,000 jobs at 500 a second: the newest 100 seconds plus the seconds since they were
    # written (by the database clock, read on both sides of the call; under 20 on a quiet
    # machine, so 2-second buckets), in the narrowest buckets of which 60 hold them; only the
    # oldest, partly counted bucket is left out.
    widths = {next(w for w in BUCKET_WIDTHS if w * 60 >= 100 + since) for since in (before, after)}
    assert throughput.width in widths
    assert 100 + before - 1 <= throughput.window <= 100 + after + throughput.width
    counted = sum(sum(c) for by_state in throughput.series.values() for c in by_state.values())
    assert DEFAULT_THROUGHPUT_CAP - PER_SECOND * throughput.width <= counted
    assert counted <= DEFAULT_THROUGHPUT_CAP
    assert set(throughput.series) == {"a", "b"}
    per_bucket = PER_SECOND * throughput.width
    assert all(n <= per_bucket for n in throughput.series["a"][JobState.SUCCEEDED])

    whole = queue.admin.recent_throughput(cap=BUSY + 1)
    assert (whole.shortened, whole.width, whole.window) == (False, 60, 3600)
    counts = {(q, s): sum(c) for q, by_state in whole.series.items() for s, c in by_state.items()}
    assert counts == {
        ("a", JobState.SUCCEEDED): 144_000,
        ("a", JobState.FAILED): 6_000,
        ("b", JobState.SUCCEEDED): 150_000,
    }
    # All in the ten minutes before they were written: minute buckets counted back from now,
    # so on a loaded machine, where the call comes more than a minute after the writes, later
    # buckets than the eleventh hold them.
    oldest_bucket = int((600 + after) // 60)
    assert sum(whole.series["a"][JobState.SUCCEEDED][oldest_bucket + 1 :]) == 0


def test_a_cap_that_is_not_a_positive_int_is_refused(database_url: URL) -> None:
    app = Flask("dashboard_bad_cap")
    app.config.update(
        SECRET_KEY="test-secret",
        PGQUEUE_DATABASE_URL=database_url.render_as_string(hide_password=False),
        PGQUEUE_DASHBOARD_THROUGHPUT_CAP="many",
    )
    pgq.init_app(app)
    try:
        with pytest.raises(ConfigurationError) as raised:
            init_dashboard(app, public=True)
        assert str(raised.value) == (
            "PGQUEUE_DASHBOARD_THROUGHPUT_CAP must be a positive int, got 'many'"
        )
        assert "pgqueue_dashboard" not in app.blueprints
    finally:
        pgq.state(app).queue.dispose()


def test_a_burst_that_ended_seconds_ago_is_inside_the_shortened_window(
    database_url: URL, engine: Engine
) -> None:
    # 6,000 jobs finished within 0.2 s, 5.5 s ago: the 5,000 newest lie 5.3-5.5 s back, so a
    # window of whole seconds must reach 6 s to hold them.
    with engine.begin() as connection:
        connection.execute(
            text(
                """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, started_at,
                                             finished_at, updated_at, args)
                   SELECT 'burst.work', 'burst', 'succeeded', 1,
                          now() - make_interval(secs => 5.3 + i / 30000.0),
                          now() - make_interval(secs => 5.3 + i / 30000.0), now(), '[]'
                   FROM generate_series(1, 6000) AS i"""
            )
        )
    queue = pgqueue.PgQueue(database_url.render_as_string(hide_password=False))
    try:
        throughput = queue.admin.recent_throughput(cap=5_000)
    finally:
        queue.dispose()
    assert throughput.shortened
    # 6 s when read at once; 7 s when the read came more than half a second after the insert
    # (a loaded machine): the shortest whole number of seconds that holds the 5,000 newest.
    assert throughput.width == 1 and throughput.window in (6, 7), throughput
    counted = sum(sum(c) for by_state in throughput.series.values() for c in by_state.values())
    assert counted == 5_000
