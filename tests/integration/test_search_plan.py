"""The job search's plans (``pgqueue.sql.search``): each walk of a window is a ``Limit`` over an
index scan of the index its window orders (the primary key for ``created_at``, the
``finished_at`` index for ``finished_at``), so it reads at most ``scan`` rows however rare a
match; nothing scans ``pgqueue_jobs`` sequentially; the bisection that turns a ``created_at``
window into ids probes the primary key. As the custom plan first sent and as the generic plan
a prepared statement may switch to, on an analysed table of 20,000 finished jobs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import URL
from support.plans import executed_plans

from pgqueue import PgQueue, Settings
from pgqueue.admin import JsonMatch

JOBS = 20_000
SCAN = 500
BASE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _fill(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                """INSERT INTO pgqueue_jobs (task_name, queue, state, created_at, run_at,
                                             finished_at, updated_at, args, kwargs, result,
                                             last_error)
                   SELECT 'task.' || (g % 6), 'queue' || (g % 4),
                          CASE WHEN g % 97 = 0 THEN 'failed' ELSE 'succeeded' END,
                          :base + g * interval '1 second', :base + g * interval '1 second',
                          :base + g * interval '1 second' + interval '2 ms', now(),
                          json_build_array(g, 'x'), json_build_object('order', g), to_json(g),
                          CASE WHEN g % 97 = 0 THEN 'ValueError: order ' || g END
                   FROM generate_series(1, :n) AS g"""
            ),
            {"base": BASE, "n": JOBS},
        )
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").execute(
            text("ANALYZE pgqueue_jobs")
        )


def _sent(pgq: PgQueue, **search: Any) -> list[tuple[str, dict[str, Any]]]:
    """The statements (and parameters) one ``list_jobs`` search sends."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if "pgqueue_jobs" in statement:
            sent.append((statement, dict(parameters or {})))

    event.listen(pgq.engine, "before_cursor_execute", record)
    try:
        page = pgq.admin.list_jobs(scan=SCAN, **search)
    finally:
        event.remove(pgq.engine, "before_cursor_execute", record)
    assert page.search is not None and page.search.cut_short  # the bound was reached
    return sent


def _plans(connection: Connection, statement: str, parameters: dict[str, Any]) -> Iterator[Any]:
    """The executed custom plan of ``statement``, then its executed generic plan."""
    for _, explained in executed_plans(connection, statement, parameters):
        assert "JIT" not in explained  # pgqueue's connections turn it off, JIT-enabled servers too
        yield explained["Plan"]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _walk_node(plan: dict[str, Any]) -> dict[str, Any]:
    """The CTE ``walked``: the node that reads the window."""
    found = [n for n in _nodes(plan) if n.get("Subplan Name") == "CTE walked"]
    assert len(found) == 1, plan
    return found[0]


def _check_walk(plan: dict[str, Any], index: str) -> None:
    walk = _walk_node(plan)
    assert walk["Node Type"] == "Limit", walk
    # Under the Limit, only an ordered index scan of the window (an incremental sort of its
    # ties, for finished_at): no node that reads the whole window before the Limit stops it.
    below = list(_nodes(walk))[1:]
    kinds = [n["Node Type"] for n in below]
    assert set(kinds) <= {"Index Scan", "Incremental Sort"}, kinds
    scans = [n for n in below if n["Node Type"] == "Index Scan"]
    assert [n["Index Name"] for n in scans] == [index]
    assert scans[0]["Scan Direction"] == "Backward"
    read = scans[0]["Actual Rows"] + scans[0].get("Rows Removed by Filter", 0)
    # An incremental sort reads ahead by up to a group of 32 rows (its full-sort batch), and a
    # cursor's own row is read and filtered out; the window holds 17,000 rows.
    assert read <= SCAN + 64, read


def _no_sequential_scan(plan: dict[str, Any]) -> None:
    for node in _nodes(plan):
        assert not (
            node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "pgqueue_jobs"
        ), plan


def test_each_search_walks_its_window_through_an_index_under_a_limit(
    database_url: URL, engine: Engine
) -> None:
    _fill(engine)
    pgq = PgQueue(database_url.render_as_string(hide_password=False), settings=Settings())
    since, until = BASE + dt.timedelta(seconds=2000), BASE + dt.timedelta(seconds=19_000)
    searches = {
        "pk_pgqueue_jobs": [
            {"since": since, "json_match": JsonMatch("kwargs.order", -1)},
            {"since": since, "until": until, "error_contains": "no such error"},
            {
                "since": since,
                "queue": "queue1",
                "json_match": JsonMatch("args", [7], contains=True),
            },
        ],
        "ix_pgqueue_jobs_finished_at": [
            {"since": since, "time_column": "finished_at", "json_match": JsonMatch("result", -1)},
            {"since": since, "until": until, "time_column": "finished_at", "error_contains": "x"},
        ],
    }
    try:
        with pgq.engine.connect() as connection:
            for index, cases in searches.items():
                for search in cases:
                    sent = _sent(pgq, **search)
                    walks = [s for s in sent if "walked" in s[0]]
                    assert len(walks) == 1, sent
                    for plan in _plans(connection, *walks[0]):
                        _check_walk(plan, index)
                        _no_sequential_scan(plan)
                    for statement, parameters in sent:
                        for plan in _plans(connection, statement, parameters):
                            _no_sequential_scan(plan)
            # A page after a cursor walks the same way.
            first = pgq.admin.list_jobs(since=since, time_column="finished_at", scan=SCAN)
            sent = _sent(pgq, since=since, time_column="finished_at", before=first.older)
            walks = [s for s in sent if "walked" in s[0]]
            for plan in _plans(connection, *walks[0]):
                _check_walk(plan, "ix_pgqueue_jobs_finished_at")
    finally:
        pgq.dispose()
