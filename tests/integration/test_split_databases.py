"""Queues split across databases, as docs/how-to/scaling.md shows: one ``PgQueue`` per database, each
with its own tasks, run by its own workers. Each database holds only its own jobs, and a
worker of one never runs (or sees) the other's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_databases import create_database, drop_database
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from pgqueue import JobState, PgQueue


@pytest.fixture
def two_databases(server_url: URL, template_name: str) -> Iterator[tuple[URL, URL]]:
    first = create_database(server_url, template_name)
    second = create_database(server_url, template_name)
    yield first, second
    drop_database(server_url, first)
    drop_database(server_url, second)


def _jobs_by_task(url: URL) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text("SELECT task_name, count(*) FROM pgqueue_jobs GROUP BY task_name")
            )
            return {name: count for name, count in rows}
    finally:
        engine.dispose()


def test_two_queues_on_two_databases_each_run_by_its_own_worker(
    two_databases: tuple[URL, URL],
) -> None:
    orders_url, reports_url = (url.render_as_string(hide_password=False) for url in two_databases)

    # The example of docs/how-to/scaling.md ("Splitting queues across databases").
    orders = PgQueue(orders_url)  # the primary that also holds the orders
    reports = PgQueue(reports_url)  # a second primary for the heavy report jobs

    @orders.task(name="shop.charge", queue="orders")
    def charge(order_id: int) -> int:
        return order_id

    @reports.task(name="shop.build_report", queue="reports")
    def build_report(day: str) -> str:
        return day

    charge.enqueue_many([{"order_id": i} for i in range(5)])
    report_id = build_report.enqueue("2026-11-23")
    try:
        assert _jobs_by_task(two_databases[0]) == {"shop.charge": 5}
        assert _jobs_by_task(two_databases[1]) == {"shop.build_report": 1}
        # `pgqueue worker app.jobs:orders` and `pgqueue worker app.jobs:reports`:
        assert orders.run_worker(drain=True).succeeded == 5
        assert reports.run_worker(drain=True).succeeded == 1
        job = reports.get_job(report_id)
        assert job is not None
        assert (job.state, job.result) == (JobState.SUCCEEDED, "2026-11-23")
    finally:
        orders.dispose()
        reports.dispose()
