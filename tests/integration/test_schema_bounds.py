"""The schema-bounds benchmark (``benchmarks/schema_bounds.py``) measures the variants it names.

Its variants are pgqueue's migrated schema with indexes dropped by name, and the last one must
make a job row's two updates heap-only: a renamed index would fail the variant's statements, and
a variant that still updates through the indexes would report a bound it does not measure. One
drain of a hundred jobs per variant and one of the ceiling, on the test server (its fresh
migrated databases copied from the session's migrated template), read by every test that needs
drains; the ceiling's and the drains' CPU is read as the scale-out benchmark reads it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import URL

from benchmarks.schema_bounds import (
    CEILING,
    VARIANTS,
    bulk_variant,
    cut_down,
    drain_ceiling,
    drain_variant,
    pickup_ceiling,
    pickup_variant,
    single_variant,
    summarize,
)
from benchmarks.server import Server, libpq
from benchmarks.workloads import enqueue1, enqueue_batch

JOBS = 100


@pytest.fixture(scope="module")
def server(server_url: URL, template_name: str) -> Server:
    """The test server, as the benchmark sees one: fresh migrated databases are copies of the
    session's migrated template."""
    return Server(server_url, embedded=False, template=template_name)


@pytest.fixture(scope="module")
def drains(server: Server) -> list[dict[str, Any]]:
    """One drain of every variant and one of the ceiling, as a round of the benchmark runs
    them: the tests below read the same drains, which are the costly part."""
    found = [
        {**drain_variant(server, variant, JOBS, concurrency=10), "round": 1} for variant in VARIANTS
    ]
    found.append({**drain_ceiling(server, JOBS, threads=2, batch=50), "round": 1})
    return found


@pytest.mark.slow
def test_each_variant_drains_every_job_and_only_the_hot_one_updates_in_place(
    drains: list[dict[str, Any]],
) -> None:
    for drain in drains:
        assert drain["ok"], drain
        # Gross: a hundred jobs cost less than the commands' start-up varies by, so the
        # per-job figures (net of a run on the empty database) are for real sizes only. The
        # server's CPU is read in clock ticks (10 ms): the ceiling's in-process drain of a
        # hundred jobs can take less than one, so only the whole set must show some.
        assert drain["server_cpu_s"] >= 0, drain
        assert drain["client_cpu_s"] > 0, drain
    assert sum(drain["server_cpu_s"] for drain in drains) > 0, drains
    by_variant = {drain["variant"]: drain for drain in drains}
    # A claim and an outcome per job: two updates of each job row.
    for variant in VARIANTS:
        assert by_variant[variant]["updates"] == 2 * JOBS
    # pgqueue's own schema indexes the state, so no update of a job row stays on its page...
    assert by_variant["as shipped"]["hot_updates"] == 0
    # ...and with only the primary key and room on the page, nearly all do.
    assert by_variant["primary key only, HOT"]["hot_updates"] >= 1.5 * JOBS
    # Indexes on columns no state change touches leave the updates heap-only too.
    assert by_variant["unchanging-column indexes, HOT"]["hot_updates"] >= 1.5 * JOBS
    assert by_variant["live-table design (lease rows)"]["hot_updates"] >= 1.5 * JOBS
    assert by_variant["live-table design, finished rows moved"]["hot_updates"] >= 1.5 * JOBS

    rows = summarize(drains, [])
    assert [row["variant"] for row in rows] == [*VARIANTS, CEILING]
    assert next(row for row in rows if row["variant"] == CEILING)["drain_ratio"] == 1.0


def test_the_bulk_enqueue_of_a_variant_is_timed_against_a_raw_copy(server: Server) -> None:
    result = bulk_variant(server, "primary key only", 200)

    assert result["jobs_per_s"] > 0
    assert result["raw_jobs_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["jobs_per_s"] / result["raw_jobs_per_s"])


def test_the_bulk_workload_enqueues_into_the_shaped_database(server: Server) -> None:
    indexes: list[str] = []

    def shape(url: URL) -> None:
        cut_down(url, "primary key only")
        with psycopg.connect(libpq(url)) as conn:
            rows = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'pgqueue_jobs'"
            ).fetchall()
        indexes.extend(name for (name,) in rows)

    result = enqueue_batch(server, 200, 1, shape=shape)

    assert indexes == ["pk_pgqueue_jobs"]
    assert result["pgqueue"] > 0


@pytest.mark.slow
def test_the_single_enqueue_of_a_variant_is_timed_against_a_single_row_insert(
    server: Server, drains: list[dict[str, Any]]
) -> None:
    result = single_variant(server, "primary key only", 50)

    assert result["jobs_per_s"] > 0
    assert result["raw_jobs_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["jobs_per_s"] / result["raw_jobs_per_s"])
    rows = summarize(drains, [], ["primary key only"], [{**result, "round": 1}])
    assert rows[0]["single_ratio"] == result["ratio"]


@pytest.mark.slow
def test_the_pick_up_of_a_variant_is_set_against_the_faster_bare_loop(
    server: Server, drains: list[dict[str, Any]]
) -> None:
    bare = pickup_ceiling(server, 10)
    mine = pickup_variant(server, "primary key only", 10)

    assert 0 < bare["p50_ms"] <= bare["durable_p50_ms"]
    assert mine["p50_ms"] > 0
    rows = summarize(
        drains, [], ["primary key only"], [], [{**bare, "round": 1}, {**mine, "round": 1}]
    )
    assert rows[0]["pickup_ratio"] == mine["p50_ms"] / bare["p50_ms"]


def test_the_single_enqueue_workload_enqueues_into_the_shaped_database(server: Server) -> None:
    counted: list[int] = []

    def shape(url: URL) -> None:
        cut_down(url, "primary key only")

    with server.app_beside_baseline("enq1", shape) as (pgq, _raw):
        with psycopg.connect(libpq(pgq.engine.url)) as conn:
            rows = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'pgqueue_jobs'"
            ).fetchall()
        counted.append(len(rows))
    assert counted == [1]
    assert enqueue1(server, 50, 1, shape=shape)["pgqueue"] > 0


def test_the_live_table_design_keeps_a_lease_row_per_running_job(server: Server) -> None:
    with server.fresh_database("bounds") as url, psycopg.connect(libpq(url)) as conn:
        cut_down(url, "live-table design (lease rows)")
        conn.execute(
            "INSERT INTO pgqueue_jobs (id, task_name) SELECT g, 'noop' FROM generate_series(1, 3) g"
        )
        conn.execute(
            "UPDATE pgqueue_jobs SET state = 'running', lease_owner = 'w',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '30 s'"
            " WHERE id IN (1, 2)"
        )
        leases = "SELECT job_id FROM bounds_leases ORDER BY job_id"
        assert [row[0] for row in conn.execute(leases)] == [1, 2]
        conn.execute("UPDATE pgqueue_jobs SET lease_expires_at = now() WHERE id = 1")
        conn.execute("UPDATE pgqueue_jobs SET state = 'succeeded' WHERE id = 2")
        assert [row[0] for row in conn.execute(leases)] == [1]


def test_the_moving_design_keeps_only_live_jobs_in_the_jobs_table(server: Server) -> None:
    with server.fresh_database("bounds") as url, psycopg.connect(libpq(url)) as conn:
        cut_down(url, "live-table design, finished rows moved")
        conn.execute(
            "INSERT INTO pgqueue_jobs (id, task_name) SELECT g, 'noop' FROM generate_series(1, 3) g"
        )
        conn.execute(
            "UPDATE pgqueue_jobs SET state = 'running', lease_owner = 'w',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() WHERE id IN (1, 2)"
        )
        conn.execute("UPDATE pgqueue_jobs SET state = 'succeeded' WHERE id IN (1, 2)")
        live = [row[0] for row in conn.execute("SELECT id FROM pgqueue_jobs ORDER BY id")]
        moved = [row[0] for row in conn.execute("SELECT id FROM bounds_history ORDER BY id")]
        assert (live, moved) == ([3], [1, 2])
        assert conn.execute("SELECT count(*) FROM bounds_leases").fetchone() == (0,)
