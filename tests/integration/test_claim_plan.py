"""The claim statement's plan: the ticket index, never a sequential scan, never JIT-compiled.

With 100,000 finished jobs and 50,000 ready tickets, ``EXPLAIN`` of pgqueue's claim statement
(exactly the SQL and parameters ``data.claim.claim`` sends, for all queues and filtered by queue) must read the tickets through
``ix_pgqueue_message_queue_claim`` (``(atomic, priority, run_at, job_id) INCLUDE (queue)``,
which also yields the claim's ``ORDER BY``) and must not sequentially scan
``pgqueue_message_queue`` or ``pgqueue_jobs``. This holds with fresh statistics and with stale
ones: tables never analyzed, analyzed while empty, analyzed before the tickets were replaced by
a different mix, and analyzed while all tickets were still in the future.

Each case is planned twice: as a one-off statement with its parameter values (custom plan) and
as a generic plan, which is what PostgreSQL may switch to once psycopg has prepared the
statement after a few executions, as a long-running worker does.
Autovacuum is switched off on both tables so that "stale" stays stale while the test runs.

The finished jobs, and the fresh scenario's tickets and statistics, are written once per module
into template databases; a test that writes starts from a copy of one (``CREATE DATABASE ...
TEMPLATE``), which has the same pages, ``pg_class`` sizes and statistics (or none), so the same
plans, for a fraction of the writing's time.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from server_databases import create_database, drop_database
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from pgqueue import connections
from pgqueue.config import Settings
from pgqueue.data import claim as claim_data
from pgqueue.db import Database, executor_for
from pgqueue.jobs import ClaimRequest
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


def switch_autovacuum_off(connection: Connection) -> None:
    for table in sorted(BIG_TABLES):
        connection.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))


def analyze(connection: Connection) -> None:
    connection.execute(text("ANALYZE pgqueue_jobs"))
    connection.execute(text("ANALYZE pgqueue_message_queue"))


def scenario_never_analyzed(connection: Connection) -> None:
    insert_ready(connection, READY)


def scenario_analyzed_empty(connection: Connection) -> None:
    analyze(connection)
    insert_finished(connection, FINISHED)
    insert_ready(connection, READY)


def scenario_tickets_replaced(connection: Connection) -> None:
    """Statistics describe 1,000 tickets in 5 queues; now there are 50,000, all in one queue."""
    insert_ready(connection, 1_000)
    analyze(connection)
    connection.execute(text("DELETE FROM pgqueue_message_queue"))
    connection.execute(text("UPDATE pgqueue_jobs SET state = 'cancelled' WHERE state = 'queued'"))
    insert_ready(connection, READY, queues=1)


def scenario_analyzed_in_the_future(connection: Connection) -> None:
    """Statistics say every ticket is an hour ahead (none ready); then they all come due."""
    insert_ready(connection, READY, future=True)
    analyze(connection)
    connection.execute(text("UPDATE pgqueue_message_queue SET run_at = now() - interval '1 s'"))


# Each scenario: the database it starts from (see Databases), then what it writes there.
SCENARIOS: dict[str, tuple[str, Callable[[Connection], None] | None]] = {
    "fresh": ("fresh", None),
    "never_analyzed": ("finished", scenario_never_analyzed),
    "analyzed_empty": ("empty", scenario_analyzed_empty),
    "tickets_replaced": ("finished", scenario_tickets_replaced),
    "analyzed_in_the_future": ("finished", scenario_analyzed_in_the_future),
}


class Databases:
    """New databases for this module's tests, each from a template: ``"empty"`` (the session's,
    pgqueue's tables empty), ``"finished"`` (``FINISHED`` finished jobs, never analyzed) or
    ``"fresh"`` (those, ``READY`` ready tickets, then both tables analyzed). Autovacuum is off
    on the big tables in the last two; a template is built on first use and kept for the
    module."""

    def __init__(self, server_url: URL, template_name: str) -> None:
        self.server_url = server_url
        self.templates: dict[str, URL] = {"empty": server_url.set(database=template_name)}
        self.made: list[URL] = []

    def url(self, base: str) -> URL:
        """A new database, a copy of the template ``base``."""
        url = create_database(self.server_url, self.template(base).database)
        self.made.append(url)
        return url

    def template(self, base: str) -> URL:
        """The template ``base`` itself (for reading only: a template is copied whole)."""
        if base not in self.templates:
            steps = {"finished": ("empty", self._finish), "fresh": ("finished", self._refresh)}
            start, write = steps[base]
            url = self.url(start)
            engine = create_engine(url, isolation_level="AUTOCOMMIT")
            with engine.connect() as connection:
                write(connection)
            # No connection may stay open on a database being copied.
            engine.dispose()
            self.templates[base] = url
        return self.templates[base]

    @staticmethod
    def _finish(connection: Connection) -> None:
        switch_autovacuum_off(connection)
        insert_finished(connection, FINISHED)

    @staticmethod
    def _refresh(connection: Connection) -> None:
        insert_ready(connection, READY)
        analyze(connection)

    def drop(self) -> None:
        for url in reversed(self.made):
            drop_database(self.server_url, url)


@pytest.fixture(scope="module")
def databases(server_url: URL, template_name: str) -> Iterator[Databases]:
    made = Databases(server_url, template_name)
    yield made
    made.drop()


@pytest.fixture
def engine_on(databases: Databases) -> Iterator[Callable[[str], Engine]]:
    """``engine_on(base)``: an autocommit engine on a new copy of the template ``base``."""
    made: list[tuple[URL, Engine]] = []

    def make(base: str) -> Engine:
        url = databases.url(base)
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        made.append((url, engine))
        if base == "empty":
            with engine.connect() as connection:
                switch_autovacuum_off(connection)
        return engine

    yield make
    for url, engine in made:
        engine.dispose()
        drop_database(databases.server_url, url)
        databases.made.remove(url)


@pytest.fixture(scope="module")
def fresh_reader(databases: Databases) -> Iterator[Engine]:
    """An autocommit engine on the ``"fresh"`` template itself, for tests that only EXPLAIN."""
    engine = create_engine(databases.template("fresh"), isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def admin(database_url: URL) -> Iterator[Engine]:
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        switch_autovacuum_off(connection)
    yield engine
    engine.dispose()


class _Captured(Exception):
    def __init__(self, statement: str, parameters: Any) -> None:
        super().__init__("captured")
        self.statement = statement
        self.parameters = parameters


def captured_claim(
    connection: Connection, *, filter_queues: bool, limits: claim_data.LimitsSeen | None = None
) -> tuple[str, dict[str, Any]]:
    """The SQL text and parameters pgqueue's worker sends to claim (captured, not run), by a
    claimer that saw ``limits`` (by default none yet)."""

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        raise _Captured(statement, parameters)

    event.listen(connection, "before_cursor_execute", capture)
    try:
        with Session(connection) as session:
            claim_data.claim(
                executor_for(session),
                worker_id="plan-test",
                limit=10,
                queues=["q0", "q3"] if filter_queues else None,
                lease_seconds=30.0,
                task_leases={},
                limits=limits,
            )
    except _Captured as captured:
        assert "FOR UPDATE SKIP LOCKED" in captured.statement
        return captured.statement, dict(captured.parameters)
    finally:
        event.remove(connection, "before_cursor_execute", capture)
    raise AssertionError("claim_data.claim sent no statement")


def custom_plan(connection: Connection, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    row = connection.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql, params).scalar_one()
    return dict(row[0]["Plan"])


def generic_plan(connection: Connection, sql: str) -> dict[str, Any]:
    """The generic plan: the one chosen without knowing the parameter values (what PostgreSQL
    may switch to once psycopg has prepared the statement). Built with PREPARE under
    ``plan_cache_mode = force_generic_plan``, which every supported version has; the values
    the EXECUTE passes cannot change that plan."""
    numbers: dict[str, int] = {}

    def placeholder(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    numbered = re.sub(r"%\((\w+)\)s", placeholder, sql).replace("%%", "%")
    connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    connection.exec_driver_sql("PREPARE plan_test AS " + numbered.replace("%", "%%"))
    try:
        types = connection.exec_driver_sql(
            "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'plan_test'"
        ).scalar_one()
        row = connection.exec_driver_sql(
            f"EXPLAIN (FORMAT JSON) EXECUTE plan_test({sample_values(types)})"
        ).scalar_one()
    finally:
        connection.exec_driver_sql("DEALLOCATE plan_test")
        connection.exec_driver_sql("RESET plan_cache_mode")
    return dict(row[0]["Plan"])


# A value of each type the claim's parameters have, to EXPLAIN a prepared claim.
SAMPLE_VALUES = {
    "integer": "10",
    "smallint": "1",
    "bigint": "10",
    "double precision": "30",
    "jsonb": "'{}'",
    "text[]": "'{q0,q3}'",
}


def sample_values(types: list[str]) -> str:
    return ", ".join(SAMPLE_VALUES.get(t, "'queued'") for t in types)


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
    assert not any(n["Node Type"] in {"Sort", "Incremental Sort"} for n in all_nodes), (
        f"{label}: {describe(plan)}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_claim_uses_the_ticket_index_without_sequential_scans(
    engine_on: Callable[[str], Engine], scenario: str
) -> None:
    base, write = SCENARIOS[scenario]
    admin = engine_on(base)
    with admin.connect() as connection:
        if write is not None:
            write(connection)
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
            version = int(connection.exec_driver_sql("SHOW server_version_num").scalar_one())
            bounded = scenario == "analyzed_in_the_future" and version < 180000
            check_plan(custom_plan(connection, sql, params), label, bounded=bounded)
            # A long-running worker executes the claim as a prepared statement; after five runs
            # PostgreSQL's plan cache may switch to the generic plan (it does when statistics
            # say no ticket is ready). Whichever plan it settles on must be a good one.
            generic, custom = plan_cache_choice(admin.url, sql, params)
            assert generic + custom == 20
            if generic:
                plan = generic_plan(connection, sql)
                check_plan(plan, label + ", generic plan in use", bounded=bounded)


def check_plan(plan: dict[str, Any], label: str, *, bounded: bool) -> None:
    """``assert_good_plan``, or with ``bounded`` the weaker promise that holds before PostgreSQL
    18 when statistics say no ticket is due: there the planner prefers one scan and sort of the
    tickets to walking the index for rows it believes are not there, until the claims' deletes
    trigger the next analyze. That scan stays single and cheap enough never to be compiled."""
    if not bounded:
        assert_good_plan(plan, label)
        return
    assert set(sequential_scans(plan)) <= {"pgqueue_message_queue"}, describe(plan)
    assert plan["Total Cost"] < 10_000, describe(plan)


def test_generic_claim_plan_avoids_sequential_scans(fresh_reader: Engine) -> None:
    # In a generic plan LIMIT $n is costed as 10 % of the tickets; the claim matches the picked
    # tickets and their jobs with = ANY(ARRAY(SELECT ...)), so that estimate cannot turn the
    # DELETE and the UPDATE into hash joins over sequential scans (as joins on the CTEs would).
    with fresh_reader.connect() as connection:
        for filter_queues in (False, True):
            sql, _ = captured_claim(connection, filter_queues=filter_queues)
            assert_good_plan(generic_plan(connection, sql), f"generic, {filter_queues=}")


@pytest.mark.slow
@pytest.mark.parametrize("limits", [False, True], ids=["lean", "full"])
def test_claim_of_200_probes_primary_keys_instead_of_scanning(
    fresh_reader: Engine, limits: bool
) -> None:
    # A worker with --concurrency 200 claims 200 at a time: with joins on the CTEs the planner
    # chooses hash joins over sequential scans of both tables for that LIMIT even in the custom
    # plan, an order of magnitude slower than probing the primary keys.
    with fresh_reader.connect() as connection:
        seen = claim_data.LimitsSeen()
        seen.record(limits, until=float("inf"))
        sql, params = captured_claim(connection, filter_queues=False, limits=seen)
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


def prepared_claim_plan(
    rows: Callable[[str], Sequence[Any]], *, generic: bool | None
) -> dict[str, Any]:
    """The plan a connection (``rows`` runs SQL on it) runs its prepared claim with now
    (checking first whether PostgreSQL has used a generic plan for it, unless ``generic`` is
    None)."""
    prepared = rows(
        "SELECT name, generic_plans, parameter_types::text[] FROM pg_prepared_statements "
        "WHERE statement LIKE '%SKIP LOCKED%'"
    )
    assert len(prepared) == 1, prepared
    name, generic_plans, types = prepared[0]
    assert generic is None or (generic_plans > 0) == generic, prepared
    plan = rows(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({sample_values(types)})")
    return dict(plan[0][0][0]["Plan"])


def held_claim_plan(store: WorkerStore, *, generic: bool | None) -> dict[str, Any]:
    """The plan the worker's claim connection runs its prepared claim with now."""
    return prepared_claim_plan(
        lambda sql: store._claim_connection.rows(text(sql.replace("%", "%%")), {}),
        generic=generic,
    )


# One claim of one job by worker "w", as the claim tests below run it.
ONE_CLAIM: dict[str, Any] = {
    "worker_id": "w",
    "limit": 1,
    "queues": None,
    "lease_seconds": 30.0,
    "task_leases": {},
}


def claim_many(store: WorkerStore, times: int) -> None:
    for _ in range(times):
        store.claim(ClaimRequest(**ONE_CLAIM))


# How old prepared statements may grow in the two tests below (when they are dropped at all).
MAX_AGE = 2.0
# What the tables grow by in those tests: enough that a plan made anew reads the claim index
# on every server, as with FINISHED and READY; a fifth of the writing, and of the rows each
# claim on the kept plan scans.
GROWN_FINISHED = FINISHED // 5
GROWN_READY = READY // 5


def check_tiny_tables_plan(
    admin: Engine,
    *,
    claims: Callable[[], None],
    plan: Callable[[bool | None], dict[str, Any]],
    refresh: bool,
) -> None:
    """``claims()`` on 3 tickets leaves a generic plan that scans the tables (``plan(generic)``
    reads the connection's prepared claim); once the tables have grown and ``MAX_AGE`` has
    passed, ``claims()`` again runs on a new plan, which reads the claim index (``refresh``),
    or on the old one."""
    with admin.connect() as connection:
        insert_ready(connection, 3)
        analyze(connection)
    started = time.monotonic()
    claims()
    planned = time.monotonic()
    assert planned - started < MAX_AGE, "too slow to see the tiny tables' plan"
    assert sequential_scans(plan(True)), "no problem to fix on tiny tables?"
    with admin.connect() as connection:
        insert_finished(connection, GROWN_FINISHED)
        insert_ready(connection, GROWN_READY)
    # The plans were made before ``planned``: from MAX_AGE after it they are older than that,
    # however long the writing took.
    time.sleep(max(0.0, planned + MAX_AGE + 0.1 - time.monotonic()))
    claims()
    # The kept plan stays generic. The refreshed statement is planned anew for the grown
    # tables (generic or custom, whichever is cheaper now; its count of generic plans run
    # includes the old plan's).
    final = plan(None if refresh else True)
    if refresh:
        assert sequential_scans(final) == [], describe(final)
        assert CLAIM_INDEX in {n.get("Index Name") for n in nodes(final)}, describe(final)
    else:
        assert sequential_scans(final), "the kept plan should still scan: see the other case"


@pytest.mark.slow
@pytest.mark.parametrize("refresh", [True, False], ids=["refreshed", "kept"])
def test_claim_plan_made_on_tiny_tables_is_replaced_once_they_grow(
    admin: Engine, database_url: URL, refresh: bool
) -> None:
    # psycopg prepares the claim after five runs and PostgreSQL may keep one generic plan for a
    # prepared statement; made while the tables were tiny, that plan scans them whole, and
    # every claim walks all tickets and job rows as they grow. The worker's claim connection
    # drops the plans of its prepared statements now and then, so the next plan fits the tables
    # as they are.
    engine = create_engine(database_url)
    store = WorkerStore(engine, stopping=threading.Event())
    store._claim_connection._plan_max_age = MAX_AGE if refresh else float("inf")
    try:
        check_tiny_tables_plan(
            admin,
            claims=lambda: claim_many(store, 20),
            plan=lambda generic: held_claim_plan(store, generic=generic),
            refresh=refresh,
        )
    finally:
        store.close()
        engine.dispose()


def claim_many_pooled(database: Database, times: int) -> None:
    """``times`` lean claims (no queue limits seen), each on a connection from the pool."""
    lean = claim_data.LimitsSeen()
    lean.record(False, until=float("inf"))
    for _ in range(times):
        database.run(lambda ex: claim_data.claim(ex, limits=lean, **ONE_CLAIM), autocommit=True)


def pooled_claim_plan(engine: Engine, *, generic: bool | None) -> dict[str, Any]:
    """``prepared_claim_plan`` of the only connection in ``engine``'s pool."""
    with engine.connect() as connection:
        plan = prepared_claim_plan(
            lambda sql: connection.exec_driver_sql(sql.replace("%", "%%")).all(),
            generic=generic,
        )
        # Not the rollback a close would send: psycopg drops every prepared statement then.
        connection.commit()
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("refresh", [True, False], ids=["refreshed", "kept"])
def test_pooled_connections_replace_plans_made_on_tiny_tables(
    admin: Engine, database_url: URL, refresh: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, for the pool of pgqueue's engine, on which the worker writes outcomes and
    # heartbeats and applications enqueue and read jobs: a checkout drops the plans of the
    # connection's prepared statements once they are older than PLAN_MAX_AGE.
    monkeypatch.setattr(connections, "PLAN_MAX_AGE", MAX_AGE if refresh else float("inf"))
    engine = connections.create_queue_engine(database_url, Settings(), pool_size=1, max_overflow=0)
    database = Database(engine)
    try:
        check_tiny_tables_plan(
            admin,
            claims=lambda: claim_many_pooled(database, 20),
            plan=lambda generic: pooled_claim_plan(engine, generic=generic),
            refresh=refresh,
        )
    finally:
        engine.dispose()


def test_worker_claim_connection_changes_no_session_setting(database_url: URL) -> None:
    # The claim connection goes back to the pool (and behind a pooler, to other clients): it
    # must carry nothing but the startup options every pgqueue connection has.
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    store = WorkerStore(engine, stopping=threading.Event())
    changed = text("SELECT name FROM pg_settings WHERE source = 'session'")
    try:
        claim_many(store, 10)
        assert store._claim_connection.rows(changed, {}) == []
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("tickets", [0, 10_000])
def test_claim_plans_stay_below_the_jit_threshold(
    engine_on: Callable[[str], Engine], tickets: int
) -> None:
    # On a server with JIT on (the default since PostgreSQL 12), a plan whose estimated cost
    # passes jit_above_cost is compiled on every run. pgqueue's connections turn JIT off,
    # but a claim must also be cheap as planned on a connection with every default, custom and
    # generic: that is what runs behind a pooler or on an application's own engine.
    with engine_on("finished").connect() as connection:
        insert_ready(connection, tickets)
        analyze(connection)
        threshold = float(connection.exec_driver_sql("SHOW jit_above_cost").scalar_one())
        for filter_queues in (False, True):
            sql, params = captured_claim(connection, filter_queues=filter_queues)
            # Really runs (claims up to 10 tickets): JIT shows only in an executed plan.
            analyzed = connection.exec_driver_sql(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params
            ).scalar_one()[0]
            assert "JIT" not in analyzed, analyzed
            for plan in (analyzed["Plan"], generic_plan(connection, sql)):
                assert plan["Total Cost"] < threshold, describe(plan)
