"""Reading a job never fails because of its JSON.

A row whose ``args`` or ``result`` hold JSON that PostgreSQL accepts and Python cannot decode
(nesting deeper than the recursion limit, an integer longer than
``sys.get_int_max_str_digits()``) reads with that value as a ``codec.UndecodableJSON``
marker, on pgqueue's engine and on a plain one with the driver's default loader: ``get_job``,
``RETURNING`` of those columns, and the dashboard's job list and job pages, where the other jobs
stay visible.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine, create_engine, text, update
from sqlalchemy.engine import URL
from support.dashboard import dashboard_app
from support.json_rows import nest_args

from pgqueue import Job, PgQueue
from pgqueue.codec import UndecodableJSON
from pgqueue.contrib.flask import PgQueue as FlaskPgQueue

GOOD_ARGS: list[Any] = [1, "two", {"three": [3.5, None, True]}, 12345678901234567890]
GOOD_KWARGS: dict[str, Any] = {"key": "value", "nested": {"list": []}}
DEEP = "<undecodable JSON: RecursionError: maximum recursion depth exceeded"
LONG = "<undecodable JSON: ValueError: Exceeds the limit"


def _spoil(engine: Engine, job_id: int) -> None:
    """100,000-deep ``args`` and a ``result`` holding an integer of 5,000 digits."""
    nest_args(engine, job_id, 100_000)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE pgqueue_jobs SET result = CAST(:v AS json) WHERE id = :id"),
            {"v": "[" + "9" * 5000 + "]", "id": job_id},
        )


def _good_and_bad(pgq: PgQueue, engine: Engine) -> tuple[int, int]:
    @pgq.task(name="reads.job")
    def job(*args: Any, **kwargs: Any) -> None:
        pass

    good = job.enqueue(*GOOD_ARGS, **GOOD_KWARGS)
    bad = job.enqueue(1)
    _spoil(engine, bad)
    return good, bad


@pytest.mark.parametrize("which", ["pgqueue engine", "plain engine"])
def test_get_job_reads_undecodable_json_as_a_marker(
    pgq: PgQueue, engine: Engine, database_url: URL, which: str
) -> None:
    good, bad = _good_and_bad(pgq, engine)
    plain = create_engine(database_url)
    reader = PgQueue(plain, settings=pgq.settings) if which == "plain engine" else pgq
    try:
        spoiled = reader.get_job(bad)
        assert isinstance(spoiled.args, UndecodableJSON) and spoiled.args.startswith(DEEP)
        assert isinstance(spoiled.result, UndecodableJSON) and spoiled.result.startswith(LONG)
        assert spoiled.kwargs == {}
        assert DEEP in repr(spoiled.args)
        fine = reader.get_job(good)
        assert (fine.args, fine.kwargs, fine.result) == (GOOD_ARGS, GOOD_KWARGS, None)
        assert not isinstance(fine.args, UndecodableJSON)
    finally:
        if reader is not pgq:
            reader.dispose()
        plain.dispose()


def test_returning_reads_undecodable_json_as_a_marker_and_binds_as_before(
    pgq: PgQueue, engine: Engine
) -> None:
    good, bad = _good_and_bad(pgq, engine)
    with engine.begin() as connection:
        rows = connection.execute(
            update(Job)
            .where(Job.id.in_([good, bad]))
            .values(result="a JSON string")
            .returning(Job.id, Job.args, Job.kwargs, Job.result)
        ).all()
        stored = connection.execute(
            text("SELECT DISTINCT result::text FROM pgqueue_jobs WHERE id IN (:g, :b)"),
            {"g": good, "b": bad},
        ).scalar_one()
    by_id = {row.id: row for row in rows}
    assert isinstance(by_id[bad].args, UndecodableJSON) and by_id[bad].args.startswith(DEEP)
    assert (by_id[good].args, by_id[good].kwargs) == (GOOD_ARGS, GOOD_KWARGS)
    results = {by_id[good].result, by_id[bad].result}
    assert results == {"a JSON string"}
    assert not any(isinstance(r, UndecodableJSON) for r in results)
    assert stored == '"a JSON string"'


@pytest.fixture
def dashboard(database_url: URL) -> Iterator[tuple[Flask, FlaskPgQueue]]:
    flask_pgq = FlaskPgQueue()
    with dashboard_app(flask_pgq, database_url, "undecodable_reads") as app:
        yield app, flask_pgq


def test_dashboard_shows_a_job_python_cannot_decode_and_the_others(
    dashboard: tuple[Flask, FlaskPgQueue], engine: Engine
) -> None:
    app, flask_pgq = dashboard
    good, bad = _good_and_bad(flask_pgq.state(app).queue, engine)
    client = app.test_client()
    listing = client.get("/pgqueue/jobs")
    assert listing.status_code == 200
    assert f'data-job-id="{good}"' in listing.text
    assert f'data-job-id="{bad}"' in listing.text
    page = client.get(f"/pgqueue/jobs/{bad}")
    assert page.status_code == 200
    # The marker shows as a JSON string (the page shows a result only once a job succeeded).
    assert f'"{DEEP}' in html.unescape(page.text)
