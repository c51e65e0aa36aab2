"""The job search of ``pgq.admin.list_jobs`` (``pgqueue.job_search``): every filter finds exactly
its jobs, in the window's order, and a search cut short by its bound continues from its
``older`` cursor without missing or repeating a job; the same across the partitioned history.

The jobs are written by one ``INSERT ... SELECT``, so their times, states, arguments, results
and errors follow formulas of their number, and the expected answers are computed in Python
from the rows read back.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL

from pgqueue import PgQueue, Settings
from pgqueue.admin import JsonMatch
from pgqueue.cli import main as cli_main
from pgqueue.data import history as history_data
from pgqueue.db import executor_for

JOBS = 240
BASE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)

FILL = text(
    """INSERT INTO pgqueue_jobs (task_name, queue, state, created_at, run_at, updated_at,
                                 finished_at, args, kwargs, result, last_error)
       SELECT CASE WHEN i % 4 = 0 THEN 'mail.send' ELSE 'bulk.work' END,
              'q' || (i % 2), s.state, :base + i * interval '1 minute',
              :base + i * interval '1 minute', now(),
              CASE WHEN s.state IN ('succeeded', 'failed')
                   -- out of id order, in pairs that finished at the same moment
                   THEN :base + interval '1 day' + ((i * 37) % :n) / 2 * interval '1 second' END,
              json_build_array(i, 'x'),
              json_build_object('user', json_build_object('id', i % 10),
                                'tags', json_build_array('t' || (i % 3))),
              CASE WHEN s.state = 'succeeded' THEN json_build_object('total', i % 7) END,
              CASE WHEN s.state = 'failed' THEN 'Boom: ValueError(' || i || ')'
                   WHEN i = 7 THEN 'sale 50%_off' END
       FROM generate_series(1, :n) AS i,
            LATERAL (SELECT CASE WHEN i % 5 = 0 THEN 'failed' WHEN i % 11 = 0 THEN 'queued'
                                 ELSE 'succeeded' END AS state) AS s
       ORDER BY i"""
)


def _fill(engine: Engine) -> list[dict[str, Any]]:
    """The jobs, as rows of Python values (JSON decoded)."""
    with engine.begin() as connection:
        connection.execute(FILL, {"base": BASE, "n": JOBS})
        rows = connection.execute(
            text(
                "SELECT id, task_name, queue, state, created_at, finished_at, args::text AS a,"
                " kwargs::text AS k, result::text AS r, last_error FROM pgqueue_jobs"
            )
        ).mappings()
        return [
            {
                **row,
                "args": json.loads(row["a"]),
                "kwargs": json.loads(row["k"]),
                "result": None if row["r"] is None else json.loads(row["r"]),
            }
            for row in rows
        ]


def _walk_all(pgq: PgQueue, **search: Any) -> tuple[list[int], int]:
    """Every job the search finds, page after page through ``older``; and how many pages were
    cut short by the bound."""
    found: list[int] = []
    cut = 0
    before = None
    for _ in range(200):
        page = pgq.admin.list_jobs(before=before, **search)
        assert page.search is not None
        found += [job.id for job in page.jobs]
        cut += page.search.cut_short
        if page.older is None:
            return found, cut
        before = page.older
    raise AssertionError("the search did not end")


def _expected(
    rows: list[dict[str, Any]], column: str, keep: Callable[[dict[str, Any]], bool]
) -> list[int]:
    chosen = [r for r in rows if r[column] is not None and keep(r)]
    if column == "finished_at":
        chosen.sort(key=lambda r: (r["finished_at"], r["id"]), reverse=True)
    else:
        chosen.sort(key=lambda r: r["id"], reverse=True)
    return [r["id"] for r in chosen]


def _at(minutes: float) -> dt.datetime:
    return BASE + dt.timedelta(minutes=minutes)


def _done(seconds: float) -> dt.datetime:
    return BASE + dt.timedelta(days=1, seconds=seconds)


def _path(value: Any, keys: list[str]) -> Any:
    for key in keys:
        if isinstance(value, list):
            value = value[int(key)] if key.isdigit() and int(key) < len(value) else KeyError
        elif isinstance(value, dict):
            value = value.get(key, KeyError)
        else:
            return KeyError
    return value


CASES: list[tuple[dict[str, Any], str, Callable[[dict[str, Any]], bool]]] = [
    # A window on created_at alone, and with queue, state and task.
    ({"since": _at(30), "until": _at(200)}, "created_at", lambda r: True),
    ({"since": _at(30), "queue": "q1"}, "created_at", lambda r: r["queue"] == "q1"),
    ({"until": _at(100), "state": "failed"}, "created_at", lambda r: r["state"] == "failed"),
    (
        {"since": _at(0), "task_name": "mail.send"},
        "created_at",
        lambda r: r["task_name"] == "mail.send",
    ),
    # Error text: any case; % and _ are plain characters.
    (
        {"since": _at(0), "error_contains": "valueerror(1"},
        "created_at",
        lambda r: "valueerror(1" in (r["last_error"] or "").lower(),
    ),
    ({"since": _at(0), "error_contains": "%_"}, "created_at", lambda r: r["id"] == _first_id + 6),
    # JSON: equals at a path, an index, containment of a list's element and of an object.
    (
        {"since": _at(0), "json_match": JsonMatch("kwargs.user.id", 3)},
        "created_at",
        lambda r: r["kwargs"]["user"]["id"] == 3,
    ),
    (
        {"since": _at(10), "until": _at(150), "json_match": JsonMatch("args.0", 42)},
        "created_at",
        lambda r: r["args"][0] == 42,
    ),
    (
        {"since": _at(0), "json_match": JsonMatch("kwargs.tags", "t2", contains=True)},
        "created_at",
        lambda r: "t2" in r["kwargs"]["tags"],
    ),
    (
        {"since": _at(0), "json_match": JsonMatch("kwargs", {"user": {"id": 4}}, contains=True)},
        "created_at",
        lambda r: r["kwargs"]["user"]["id"] == 4,
    ),
    (
        {"since": _at(0), "json_match": JsonMatch("result.total", 0)},
        "created_at",
        lambda r: _path(r["result"], ["total"]) == 0,
    ),
    ({"since": _at(0), "json_match": JsonMatch("args.5", 1)}, "created_at", lambda r: False),
    # A window on finished_at: newest finished first, ties broken by id.
    (
        {"since": _done(10), "until": _done(100), "time_column": "finished_at"},
        "finished_at",
        lambda r: _done(10) <= r["finished_at"] < _done(100),
    ),
    (
        {
            "since": _done(0),
            "time_column": "finished_at",
            "json_match": JsonMatch("result.total", 2),
        },
        "finished_at",
        lambda r: _path(r["result"], ["total"]) == 2,
    ),
]

_first_id = 0


@pytest.fixture
def search_pgq(database_url: URL, engine: Engine) -> Iterator[tuple[PgQueue, list[dict[str, Any]]]]:
    global _first_id
    rows = _fill(engine)
    _first_id = min(r["id"] for r in rows)
    queue = PgQueue(database_url.render_as_string(hide_password=False), settings=Settings())
    yield queue, rows
    queue.dispose()


def _in_window(row: dict[str, Any], search: dict[str, Any], column: str) -> bool:
    at = row[column]
    return (search.get("since") is None or at >= search["since"]) and (
        search.get("until") is None or at < search["until"]
    )


@pytest.mark.parametrize("case", range(len(CASES)))
def test_each_filter_finds_exactly_its_jobs_across_cut_pages(
    search_pgq: tuple[PgQueue, list[dict[str, Any]]], case: int
) -> None:
    pgq, rows = search_pgq
    search, column, keep = CASES[case]
    expected = _expected(rows, column, lambda r: _in_window(r, search, column) and keep(r))
    # Unbounded enough to read the whole window at once, in pages of 7 matches.
    whole, cut = _walk_all(pgq, limit=7, **search)
    assert whole == expected and cut == 0
    # A bound of 13 rows cuts most pages short; continuing finds the same jobs, once each.
    bounded, cut = _walk_all(pgq, limit=7, scan=13, **search)
    assert bounded == expected
    window = sum(1 for r in rows if r[column] is not None and _in_window(r, search, column))
    assert cut >= window // 13 - len(expected) // 7 - 1


def test_a_cut_page_says_how_far_it_read(
    search_pgq: tuple[PgQueue, list[dict[str, Any]]],
) -> None:
    pgq, rows = search_pgq
    page = pgq.admin.list_jobs(since=_at(0), error_contains="no such text", scan=50)
    assert page.jobs == ()
    assert page.search is not None and page.search.cut_short and page.search.scanned == 50
    newest = sorted(rows, key=lambda r: r["id"], reverse=True)
    assert page.older == newest[49]["id"]
    assert page.search.reached == newest[49]["created_at"]
    assert "searched the newest 50 jobs of the window" in page.search.summary()
    whole = pgq.admin.list_jobs(since=_at(0), error_contains="no such text")
    assert whole.search is not None and not whole.search.cut_short
    assert (whole.search.scanned, whole.older) == (JOBS, None)


def test_a_search_by_id_gives_the_job_when_it_matches_the_filters(
    search_pgq: tuple[PgQueue, list[dict[str, Any]]],
) -> None:
    pgq, rows = search_pgq
    job = rows[4]  # the 5th job: failed
    assert [j.id for j in pgq.admin.list_jobs(job_id=job["id"]).jobs] == [job["id"]]
    assert pgq.admin.list_jobs(job_id=job["id"], state="failed").jobs[0].state.value == "failed"
    assert pgq.admin.list_jobs(job_id=job["id"], state="succeeded").jobs == ()
    match = JsonMatch("args.0", job["args"][0])
    assert len(pgq.admin.list_jobs(job_id=job["id"], json_match=match).jobs) == 1
    assert pgq.admin.list_jobs(job_id=job["id"], until=_at(1)).jobs == ()
    assert pgq.admin.list_jobs(job_id=10**12).jobs == ()


def test_a_job_whose_json_jsonb_refuses_never_matches_nor_fails_the_search(
    search_pgq: tuple[PgQueue, list[dict[str, Any]]], engine: Engine
) -> None:
    pgq, _ = search_pgq
    with engine.begin() as connection:
        odd = connection.execute(
            text(
                "INSERT INTO pgqueue_jobs (task_name, created_at, args, kwargs)"
                ' VALUES (\'odd\', :at, \'[3]\', \'{"user": {"id": 3}, "note": "a\\u0000b"}\')'
                " RETURNING id"
            ),
            {"at": _at(1000)},
        ).scalar_one()
    page = pgq.admin.list_jobs(since=_at(999), json_match=JsonMatch("kwargs.user.id", 3))
    assert page.jobs == ()
    assert page.search is not None and page.search.scanned == 1
    # Its other columns are searched as any job's.
    found = pgq.admin.list_jobs(since=_at(999), json_match=JsonMatch("args.0", 3))
    assert [j.id for j in found.jobs] == [odd]
    assert pgq.admin.list_jobs(job_id=odd).jobs[0].id == odd


def test_newer_pages_walk_back_up(search_pgq: tuple[PgQueue, list[dict[str, Any]]]) -> None:
    pgq, rows = search_pgq
    search: dict[str, Any] = {"since": _at(0), "json_match": JsonMatch("kwargs.user.id", 3)}
    expected = _expected(rows, "created_at", lambda r: r["kwargs"]["user"]["id"] == 3)
    first = pgq.admin.list_jobs(limit=5, **search)
    second = pgq.admin.list_jobs(limit=5, before=first.older, **search)
    assert [j.id for j in second.jobs] == expected[5:10]
    back = pgq.admin.list_jobs(limit=5, after=second.newer, **search)
    assert [j.id for j in back.jobs] == expected[:5]
    finished: dict[str, Any] = {"since": _done(0), "time_column": "finished_at"}
    done = _expected(rows, "finished_at", lambda r: True)
    first = pgq.admin.list_jobs(limit=4, **finished)
    second = pgq.admin.list_jobs(limit=4, before=first.older, **finished)
    assert [j.id for j in second.jobs] == done[4:8]
    back = pgq.admin.list_jobs(limit=4, after=second.newer, **finished)
    assert [j.id for j in back.jobs] == done[:4]


def test_the_partitioned_history_is_searched_with_the_live_table(
    search_pgq: tuple[PgQueue, list[dict[str, Any]]], database_url: URL
) -> None:
    _, rows = search_pgq
    settings = Settings(history="partitioned")
    pgq = PgQueue(database_url.render_as_string(hide_password=False), settings=settings)
    try:
        pgq.maintain_history(days_ahead=1)
        # The 120 jobs that finished first move (into the DEFAULT partition: their day has
        # none); the rest, and the queued ones, stay.
        with pgq.sessions() as session, session.begin():
            assert history_data.move_to_history(executor_for(session), age=0.0, limit=120) == 120
        cases = [CASES[0], CASES[6], CASES[12], CASES[13]]
        for search, column, keep in cases:
            expected = _expected(rows, column, lambda r: _in_window(r, search, column) and keep(r))
            assert _walk_all(pgq, limit=7, **search)[0] == expected, search
            assert _walk_all(pgq, limit=7, scan=13, **search)[0] == expected, search
        moved = next(r for r in rows if r["state"] == "failed")
        assert [j.id for j in pgq.admin.list_jobs(job_id=moved["id"], state="failed").jobs] == [
            moved["id"]
        ]
    finally:
        pgq.dispose()


def test_pgqueue_jobs_searches_with_the_same_filters(
    search_pgq: tuple[PgQueue, list[dict[str, Any]]], database_url: URL
) -> None:
    _, rows = search_pgq
    url = database_url.render_as_string(hide_password=False)
    expected = _expected(rows, "created_at", lambda r: r["kwargs"]["user"]["id"] == 3)
    since = ["--since", _at(0).isoformat()]
    found = CliRunner().invoke(
        cli_main,
        ["jobs", "--database-url", url, *since, "--json-equals", "kwargs.user.id=3", "--json"],
    )
    assert found.exit_code == 0, found.output
    listed = json.loads(found.stdout)
    assert [job["id"] for job in listed["jobs"]] == expected[:20]
    assert listed["search"] == {"scanned": JOBS, "cut_short": False, "reached": None}
    cut = CliRunner().invoke(
        cli_main,
        ["jobs", "--database-url", url, *since, "--error-contains", "nothing", "--scan", "5"],
    )
    assert cut.exit_code == 0, cut.output
    newest = max(r["id"] for r in rows)
    assert cut.stderr.strip() == (
        "note: searched the newest 5 jobs of the window, back to "
        f"{_at(newest - _first_id - 3).isoformat()}: narrow the window, or continue with the "
        f"older page (--before {newest - 4})"
    )
