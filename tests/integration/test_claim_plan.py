"""The claim statement's plan (issue 5, item 11): the ticket index, never a sequential scan.

With 100,000 finished jobs and 50,000 ready tickets, ``EXPLAIN`` of pgqueue's claim statement
(exactly the SQL and parameters ``repository.claim`` sends, for all queues and filtered by queue) must read the tickets through
``ix_pgqueue_message_queue_claim`` (``(atomic, priority, run_at, job_id) INCLUDE (queue)``,
which also yields the claim's ``ORDER BY``) and must not sequentially scan
``pgqueue_message_queue`` or ``pgqueue_jobs``. This holds with fresh statistics and with stale
ones: tables never analyzed, analyzed while empty, analyzed before the tickets were replaced by
a different mix, and analyzed while all tickets were still in the future.

Each case is planned twice: as a one-off statement with its parameter values (custom plan) and
as a generic plan (``EXPLAIN (GENERIC_PLAN)``), which is what PostgreSQL may switch to once
psycopg has prepared the statement after a few executions, as a long-running worker does.
Autovacuum is switched off on both tables so that "stale" stays stale while the test runs.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from pgqueue import queries, repository
from pgqueue.worker.store import WorkerStore

FINISHED = 100_000
READY = 50_000
CLAIM_INDEX = "ix_pgqueue_message_queue_claim"
BIG_TABLES = {"pgqueue_jobs", "pgqueue_message_queue"}


def insert_finished(connection: Connection, count: int) -> None:
    connection.execute(
        text(
            """INSERT INTO pgqueue_jobs (task_name, queue, state, attempts, started_at,
                                         finished_at, result)
               SELECT 'plan.task', 'q' || (i % 5), 'succeeded', 1,
                      now() - interval '2 hours', now() - (i || ' seconds')::interval, 'null'
               FROM generate_series(1, :n) AS i"""
        ),
        {"n": count},
    )


def insert_ready(
    connection: Connection, count: int, *, queues: int = 5, future: bool = False
) -> None:
    """``count`` QUEUED jobs with their tickets (ready now, or all an hour ahead)."""
    run_at = "now() + interval '1 hour'" if future else "now() - (i % 600 || ' seconds')::interval"
    connection.execute(
        text(
            f"""WITH jobs AS (
                   INSERT INTO pgqueue_jobs (task_name, queue, priority, run_at)
                   SELECT 'plan.task', 'q' || (i % :queues), (i % 3)::smallint, {run_at}
                   FROM generate_series(1, :n) AS i
                   RETURNING id, queue, priority, run_at)
               INSERT INTO pgqueue_message_queue (job_id, queue, priority, run_at)
               SELECT id, queue, priority, run_at FROM jobs"""
        ),
        {"n": count, "queues": queues},
    )


def analyze(connection: Connection) -> None:
    connection.execute(text("ANALYZE pgqueue_jobs"))
    connection.execute(text("ANALYZE pgqueue_message_queue"))


def scenario_fresh(connection: Connection) -> None:
    insert_finished(connection, FINISHED)
    insert_ready(connection, READY)
    analyze(connection)


def scenario_never_analyzed(connection: Connection) -> None:
    insert_finished(connection, FINISHED)
    insert_ready(connection, READY)


def scenario_analyzed_empty(connection: Connection) -> None:
    analyze(connection)
    insert_finished(connection, FINISHED)
    insert_ready(connection, READY)


def scenario_tickets_replaced(connection: Connection) -> None:
    """Statistics describe 1,000 tickets in 5 queues; now there are 50,000, all in one queue."""
    insert_finished(connection, FINISHED)
    insert_ready(connection, 1_000)
    analyze(connection)
    connection.execute(text("DELETE FROM pgqueue_message_queue"))
    connection.execute(text("UPDATE pgqueue_jobs SET state = 'cancelled' WHERE state = 'queued'"))
    insert_ready(connection, READY, queues=1)


def scenario_analyzed_in_the_future(connection: Connection) -> None:
    """Statistics say every ticket is an hour ahead (none ready); then they all come due."""
    insert_finished(connection, FINISHED)
    insert_ready(connection, READY, future=True)
    analyze(connection)
    connection.execute(text("UPDATE pgqueue_message_queue SET run_at = now() - interval '1 s'"))


SCENARIOS: dict[str, Callable[[Connection], None]] = {
    "fresh": scenario_fresh,
    "never_analyzed": scenario_never_analyzed,
    "analyzed_empty": scenario_analyzed_empty,
    "tickets_replaced": scenario_tickets_replaced,
    "analyzed_in_the_future": scenario_analyzed_in_the_future,
}


@pytest.fixture
def admin(database_url: URL) -> Iterator[Engine]:
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        for table in sorted(BIG_TABLES):
            connection.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
    yield engine
    engine.dispose()


class _Captured(Exception):
    def __init__(self, statement: str, parameters: Any) -> None:
        super().__init__("captured")
        self.statement = statement
        self.parameters = parameters


def captured_claim(connection: Connection, *, filter_queues: bool) -> tuple[str, dict[str, Any]]:
    """The SQL text and parameters pgqueue's worker sends to claim (captured, not run)."""

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        raise _Captured(statement, parameters)

    event.listen(connection, "before_cursor_execute", capture)
    try:
        with Session(connection) as session:
            repository.claim(
                session,
                worker_id="plan-test",
                limit=10,
                queues=["q0", "q3"] if filter_queues else None,
                lease_seconds=30.0,
                task_leases={},
            )
    except _Captured as captured:
        assert "FOR UPDATE SKIP LOCKED" in captured.statement
        return captured.statement, dict(captured.parameters)
    finally:
        event.remove(connection, "before_cursor_execute", capture)
    raise AssertionError("repository.claim sent no statement")


def custom_plan(connection: Connection, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    row = connection.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql, params).scalar_one()
    return dict(row[0]["Plan"])


def generic_plan(connection: Connection, sql: str) -> dict[str, Any]:
    """``EXPLAIN (GENERIC_PLAN)``: the plan chosen without knowing the parameter values."""
    numbers: dict[str, int] = {}

    def placeholder(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    numbered = re.sub(r"%\((\w+)\)s", placeholder, sql)
    row = connection.exec_driver_sql(
        "EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + numbered.replace("%%", "%")
    ).scalar_one()
    return dict(row[0]["Plan"])


def plan_cache_choice(
    url: URL, sql: str, params: dict[str, Any], runs: int = 20
) -> tuple[int, int]:
    """Run the claim ``runs`` times as a prepared statement, as a worker's connection would (psycopg prepares a query from its 5th execution); return
    PostgreSQL's ``(generic_plans, custom_plans)`` counters for it."""
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        for _ in range(runs):
            # Committed like a worker's claim (a ROLLBACK would make psycopg deallocate its
            # prepared statements); 10 of 50,000 tickets per run leaves the picture unchanged.
            claimed = connection.execute(sql, params, prepare=True).fetchall()
            assert len(claimed) == 10
        rows = connection.execute(
            "SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements"
        ).fetchall()
    claims = [
        (generic, custom) for generic, custom, statement in rows if "SKIP LOCKED" in statement
    ]
    assert len(claims) == 1, rows
    return claims[0]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def describe(plan: dict[str, Any]) -> list[str]:
    return [
        f"{n['Node Type']} {n.get('Relation Name', '')} {n.get('Index Name', '')}".strip()
        for n in nodes(plan)
    ]


def assert_good_plan(plan: dict[str, Any], label: str) -> None:
    all_nodes = list(nodes(plan))
    seq_scans = [
        n["Relation Name"]
        for n in all_nodes
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG_TABLES
    ]
    ticket_scans = [
        n
        for n in all_nodes
        if n.get("Relation Name") == "pgqueue_message_queue"
        and n["Node Type"] in {"Index Scan", "Index Only Scan"}
        and n.get("Index Name") == CLAIM_INDEX
    ]
    assert seq_scans == [], f"{label}: sequential scan of {seq_scans}: {describe(plan)}"
    assert ticket_scans, f"{label}: the claim index is not used: {describe(plan)}"
    # No sort above the index scan: the index order is the claim order.
    assert not any(n["Node Type"] == "Sort" for n in all_nodes), f"{label}: {describe(plan)}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_claim_uses_the_ticket_index_without_sequential_scans(
    admin: Engine, database_url: URL, scenario: str
) -> None:
    with admin.connect() as connection:
        SCENARIOS[scenario](connection)
        counts = connection.execute(
            text(
                """SELECT (SELECT count(*) FROM pgqueue_jobs WHERE finished_at IS NOT NULL),
                          (SELECT count(*) FROM pgqueue_message_queue WHERE run_at <= now())"""
            )
        ).one()
        assert tuple(counts) == (FINISHED, READY)
        if scenario == "never_analyzed":
            analyzed = connection.execute(
                text(
                    """SELECT count(*) FROM pg_stat_user_tables
                       WHERE relname LIKE 'pgqueue_%'
                         AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)"""
                )
            ).scalar_one()
            assert analyzed == 0
        for filter_queues in (False, True):
            sql, params = captured_claim(connection, filter_queues=filter_queues)
            label = f"{scenario}, filter_queues={filter_queues}"
            assert_good_plan(custom_plan(connection, sql, params), label)
            # A long-running worker executes the claim as a prepared statement; after five runs
            # PostgreSQL's plan cache may switch to the generic plan (it does when statistics
            # say no ticket is ready). Whichever plan it settles on must be a good one.
            generic, custom = plan_cache_choice(database_url, sql, params)
            assert generic + custom == 20
            if generic:
                assert_good_plan(generic_plan(connection, sql), label + ", generic plan in use")


def test_generic_claim_plan_avoids_sequential_scans(admin: Engine) -> None:
    # In a generic plan LIMIT $n is costed as 10 % of the tickets; the claim matches the picked
    # tickets and their jobs with = ANY(ARRAY(SELECT ...)), so that estimate cannot turn the
    # DELETE and the UPDATE into hash joins over sequential scans (as joins on the CTEs did).
    with admin.connect() as connection:
        scenario_fresh(connection)
        for filter_queues in (False, True):
            sql, _ = captured_claim(connection, filter_queues=filter_queues)
            assert_good_plan(generic_plan(connection, sql), f"generic, {filter_queues=}")


@pytest.mark.parametrize("limits", [False, True], ids=["lean", "full"])
def test_claim_of_200_probes_primary_keys_instead_of_scanning(admin: Engine, limits: bool) -> None:
    # A worker with --concurrency 200 claims 200 at a time: with joins on the CTEs the planner
    # chose hash joins over sequential scans of both tables for that LIMIT even in the custom
    # plan (20 ms per claim among 50,000 tickets instead of 2 ms).
    with admin.connect() as connection:
        scenario_fresh(connection)
        repository._limits_seen[id(connection)] = (float("inf"), limits)
        try:
            sql, params = captured_claim(connection, filter_queues=False)
        finally:
            repository._limits_seen.pop(id(connection), None)
        params["limit"] = 200
        plan = custom_plan(connection, sql, params)
        assert_good_plan(plan, f"limit 200, {limits=}")
        assert {"pk_pgqueue_message_queue", "pk_pgqueue_jobs"} <= {
            n.get("Index Name") for n in nodes(plan)
        }, describe(plan)


def sequential_scans(plan: dict[str, Any]) -> list[str]:
    return [
        n["Relation Name"]
        for n in nodes(plan)
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG_TABLES
    ]


def test_claim_connection_settings_keep_scans_off_tiny_tables(admin: Engine) -> None:
    # psycopg prepares the worker's claim after five runs and PostgreSQL may keep the generic
    # plan for the connection's life. Made while the tables are tiny (a fresh install), that plan
    # scans them whole, and each later claim walked every job row and dead ticket as the tables
    # grew (server time per empty claim 56 -> 226 us over 3,000 claims at 100 jobs/s). The
    # claim connection's settings (queries.CLAIM_CONNECTION_SETUP) leave only index plans.
    with admin.connect() as connection:
        insert_ready(connection, 3)
        analyze(connection)
        sql, _ = captured_claim(connection, filter_queues=False)
        assert sequential_scans(generic_plan(connection, sql)), "no problem to fix on tiny tables?"
        connection.exec_driver_sql(queries.CLAIM_CONNECTION_SETUP)
        try:
            plan = generic_plan(connection, sql)
        finally:
            connection.exec_driver_sql(queries.CLAIM_CONNECTION_RESET)
        assert sequential_scans(plan) == [], describe(plan)
        assert CLAIM_INDEX in {n.get("Index Name") for n in nodes(plan)}, describe(plan)


def test_worker_claim_connection_has_the_settings_and_goes_back_to_the_pool_without(
    database_url: URL,
) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    store = WorkerStore(engine, stopping=threading.Event())
    show = text("SELECT current_setting('enable_seqscan'), pg_backend_pid()")
    try:
        assert (
            store.claim(worker_id="w", limit=5, queues=None, lease_seconds=30.0, task_leases={})
            == []
        )
        held = store._claim_connection  # the connection the worker's claims ran on
        setting, claimer_pid = held.rows(show, {})[0]
        assert setting == "off"
        store.close()
        # The pool's only connection, the one the claimer held: its settings are the defaults.
        with engine.connect() as connection:
            setting, pid = connection.execute(show).one()
        assert (setting, pid) == ("on", claimer_pid)
    finally:
        store.close()
        engine.dispose()
